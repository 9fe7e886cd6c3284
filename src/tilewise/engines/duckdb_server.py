"""DuckDB servers for `tilewise up --engine duckdb`: one detached, bound DuckDB process per instance.

Each server is ``python -m tilewise.engines.duckdb_server --socket PATH [--tables FILE]``, started
bound to its instance (CPUs, memory policy, allocator). It loads the data set's tables into its own
memory (first touch: local to its CPUs), then listens on a Unix socket and serves every client
connection with the protocol of engines/duckdb_worker.py (4-byte length + pickle, requests
``{"op": "query", "sql": ...}``, ``{"op": "info"}``); several clients run concurrently. Clients:
``tilewise query --name N "SQL"`` or ``Client(path).query(sql)`` from Python.

The socket is private to the user (mode 0600 in a 0700 directory): the protocol carries pickles.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

from tilewise.binding import Binding
from tilewise.engines.base import QueryResult
from tilewise.engines.base import ArrowRows
from tilewise.engines.duckdb_worker import Server, read_msg, write_msg
from tilewise.engines.procgroup import ClusterError, Member, ProcessCluster, worker_memory_mb
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

READY_RE = re.compile(r"tilewise duckdb server ready on (\S+)")
SOCKET_MAX = 107  # sun_path holds 108 bytes including the NUL
START_TIMEOUT_S = 300.0  # loading SF 10 takes a while on 2 cores


class DuckDBServerError(ClusterError):
    pass


# ---- the client ---------------------------------------------------------------------------------

class Client:
    """One connection to a DuckDB server (requests answered in order on this connection)."""

    def __init__(self, path: str | os.PathLike, timeout_s: float | None = None) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout_s or 10.0)
            self.sock.connect(self.path)
            self.sock.settimeout(None)  # the worker's fd-level protocol needs a blocking socket
        except OSError as e:
            self.sock.close()
            raise DuckDBServerError(f"cannot connect to the DuckDB server at {self.path}: {e.strerror or e}",
                                    "check it runs: tilewise status") from None
        self._ids = 0

    def request(self, msg: dict) -> dict:
        import select

        self._ids += 1
        fd = self.sock.fileno()
        try:
            write_msg(fd, dict(msg, id=self._ids))
            if self.timeout_s is not None and not select.select([fd], [], [], self.timeout_s)[0]:
                raise DuckDBServerError(f"the DuckDB server at {self.path} did not answer within {self.timeout_s:g} s")
            reply = read_msg(fd)
        except OSError as e:
            raise DuckDBServerError(f"the DuckDB server at {self.path} failed: {e.strerror or e}") from None
        if reply is None:
            raise DuckDBServerError(f"the DuckDB server at {self.path} closed the connection")
        return reply

    def query(self, sql: str, instance: int = 0) -> QueryResult:
        reply = self.request({"op": "query", "sql": sql})
        if not reply.get("ok"):
            raise TilewiseError(f"DuckDB instance {instance} rejected the query: {reply.get('error')}")
        rows = ArrowRows(reply["rows"], reply["payload"]) if "payload" in reply else reply["rows"]
        return QueryResult(reply["columns"], rows, reply["elapsed_s"], instance)

    def info(self) -> dict:
        return self.request({"op": "info"})

    def close(self) -> None:
        self.sock.close()  # EOF ends this client's session on the server

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- the cluster ----------------------------------------------------------------------------------

class DuckDBServers(ProcessCluster):
    engine = "duckdb"
    error_cls = DuckDBServerError
    STOP_ORDER = {"worker": 1}

    @classmethod
    def default_memory_mb(cls, plan: Plan, node_memory: dict[int, int]) -> dict[int, int]:
        """DuckDB's memory_limit per server: 80 % of its nodes' memory, split between the instances there."""
        return worker_memory_mb(plan, node_memory, fraction=0.8, cap_mb=1 << 30, min_mb=256)

    def start(self, plan: Plan, *, memory_mb: dict[int, int], allocator: str = "system", join: str | None = None,
              dataset=None, log=None) -> None:
        if join:
            raise UsageError("DuckDB servers do not cooperate on a query: there is nothing to join",
                             "start them on each host with `tilewise up --engine duckdb`")
        sockdir = self.root / "sockets"
        sockdir.mkdir(parents=True, exist_ok=True)
        os.chmod(sockdir, 0o700)
        tables_file = None
        if dataset is not None:
            from tilewise.fsutil import atomic_write_json

            missing = [str(p) for p in dataset.tables.values() if not p.exists()]
            if missing:
                raise TilewiseError(f"{dataset.label} data missing in {dataset.dir}: {', '.join(missing)}")
            tables_file = atomic_write_json(self.root / "tables.json", {k: str(v) for k, v in dataset.tables.items()})
        for inst in plan.instances:
            path = sockdir / f"instance-{inst.id}.sock"
            if len(str(path)) > SOCKET_MAX:
                raise UsageError(f"the socket path {path} is longer than {SOCKET_MAX} bytes",
                                 "set TILEWISE_CLUSTER_DIR to a shorter directory")
            argv = [sys.executable, "-m", "tilewise.engines.duckdb_server", "--socket", str(path),
                    "--memory-mb", str(memory_mb[inst.id])]
            if tables_file:
                argv += ["--tables", str(tables_file)]
            m = self._spawn("worker", inst.id, argv, Binding.from_instance(inst, allocator),
                            cores=len(inst.cpus), memory_mb=memory_mb[inst.id], extra={"socket": str(path)})
            self._verify_started(m)
            if log:
                log(f"DuckDB server {inst.id} started: pid {m.pid}, {m.binding.describe()}, socket {path}")
        self.endpoint = str(sockdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        for m in self.workers():
            self.wait_log(m, READY_RE, max(1.0, deadline - time.monotonic()),
                          "load the tables and listen" if tables_file else "listen")

    def member_status(self, m: Member) -> dict:
        d = super().member_status(m)
        d["socket"] = m.extra.get("socket")
        if d["alive"]:
            try:
                with Client(m.extra["socket"], timeout_s=10) as c:
                    info = c.info()
                d["threads"] = info.get("threads")
                if info.get("pid") != m.pid:
                    self._unhealthy(d, f"the socket is served by pid {info.get('pid')}, not {m.pid}")
            except (TilewiseError, OSError, KeyError) as e:
                self._unhealthy(d, f"does not answer on its socket ({e})")
        return d

    def query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        workers = {m.instance: m for m in self.workers()}
        if instance is None:
            instance = min(workers)
        if instance not in workers:
            raise UsageError(f"no DuckDB instance {instance} in this cluster",
                             f"instances are {', '.join(str(i) for i in sorted(workers))}")
        with Client(workers[instance].extra["socket"], timeout_s=timeout_s) as c:
            return c.query(sql, instance)

    def connect_hints(self, state) -> list[str]:
        socks = [m.extra.get("socket") for m in self.workers()]
        lines = [f"{len(socks)} DuckDB server(s), one per instance; sockets in {self.endpoint}",
                 f"query: tilewise query --name {state.name} [--instance I] \"SELECT ...\"",
                 "   or: from tilewise.engines.duckdb_server import Client; "
                 f"Client('{socks[0] if socks else '...'}').query('SELECT 42').rows"]
        if state.data:
            lines.append(f"{state.data.get('label', 'data')}: the 8 tables are loaded in every instance")
        return lines


# ---- the server process -------------------------------------------------------------------------

class Session(Server):
    """One client connection, served like a worker's pipe (engines/duckdb_worker.Server), except that
    its end finishes only this session. The socket is closed when the last thread serving it is gone
    (it is referenced by this object only), so no fd is closed while another thread still reads it."""

    def __init__(self, con, conn: socket.socket, serial: threading.Lock) -> None:
        super().__init__(con, conn.fileno(), conn.fileno())
        self.conn = conn
        self.serial = serial  # one connection object: load/info of all sessions run one at a time

    def ended(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RD)  # every thread of this session now reads EOF
        except OSError:
            pass


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="tilewise.engines.duckdb_server")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tables", default=None, help="JSON file: table -> Parquet path")
    ap.add_argument("--memory-mb", type=int, default=None)
    args = ap.parse_args(argv)
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {len(os.sched_getaffinity(0))}")
    con.execute("SET arrow_lossless_conversion = true")
    if args.memory_mb:
        con.execute(f"SET memory_limit = '{int(args.memory_mb)}MB'")
    if args.tables:
        tables = json.loads(Path(args.tables).read_text())
        t0 = time.perf_counter()
        for name, path in tables.items():
            quoted = str(path).replace("'", "''")
            con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet('{quoted}')")
        print(f"loaded {len(tables)} tables in {time.perf_counter() - t0:.2f} s", flush=True)
    path = args.socket
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    srv.listen(64)
    print(f"tilewise duckdb server ready on {path}", flush=True)
    serial = threading.Lock()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=Session(con, conn, serial).serve, kwargs={"main": True}, daemon=True).start()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        os._exit(130)
