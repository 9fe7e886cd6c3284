"""Replica engines' runtime: one bound server process per plan instance, each holding its own copy of
the data set (first touch puts it in the instance's local memory), answering whole queries on a Unix
socket (engines/serve.py). DuckDB is one; an engine of this kind supplies a serve.Handler and a
subclass of ReplicaServers naming its server module -- see docs/adding-an-engine.md.

The same runtime serves the benchmarks (the servers die with tilewise) and `tilewise up` (detached,
recorded; `tilewise query` connects again later).

Routing: run_query(instance=None) sends the query to the instance with the fewest queries in flight
(lowest id on ties). A single stream therefore always runs whole queries on instance 0; S concurrent
streams spread over the instances (throughput mode), and several streams on one instance run
concurrently there, like concurrent clients of one server.

The client (one connection per instance, shared by every thread of tilewise) keeps hand-offs between
threads to a minimum (each costs a scheduler wake-up, and on a busy machine a wake-up can cost
milliseconds): the thread that asked reads the answers itself. Of the threads waiting on one
connection, one reads it at a time and hands the others their answers; when it has its own it
leaves, and the next waiter takes over reading. A server that dies is seen by whoever is reading
(end of file) and reported with its exit status; every waiting query fails at once instead of
hanging. A large answer's rows after the first ones arrive as Arrow IPC and become tuples only when
first used, after the harness's clock stopped (docs/overhead.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tilewise.binding import Binding
from tilewise.engines.contract import ArrowRows, QueryResult
from tilewise.engines.procgroup import ClusterError, Member, ProcessCluster
from tilewise.engines.serve import READY, REFUSED, read_msg, write_msg
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json

READY_RE = re.compile(rf"{READY} (\S+)")
REFUSED_RE = re.compile(rf"^{re.escape(REFUSED)} (.*)$", re.M)
SOCKET_MAX = 107  # sun_path holds 108 bytes including the NUL
START_TIMEOUT_S = 300.0  # loading SF 10 takes a while on 2 cores


class InstanceDied(TilewiseError):
    pass


class ServerError(ClusterError):
    pass


class Router:
    """Where a query runs on a replica engine (every instance holds a full copy): the instance asked
    for, else the least busy one (fewest queries in flight, then the lowest id) among the candidates.
    Used by every replica engine's run_query (the serve-based servers here, PostgreSQL's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inflight: dict[int, int] = {}

    @contextlib.contextmanager
    def route(self, candidates: Sequence[int], instance: int | None = None) -> Iterator[int]:
        """The instance the query runs on, counted in flight while the block runs."""
        with self._lock:
            if instance is None:
                if not candidates:
                    raise TilewiseError("this cluster has no instance to run the query on")
                instance = min(candidates, key=lambda i: (self.inflight.get(i, 0), i))
            self.inflight[instance] = self.inflight.get(instance, 0) + 1
        try:
            yield instance
        finally:
            with self._lock:
                self.inflight[instance] -= 1


@dataclass
class _Pending:
    rid: int = 0
    done: bool = False
    reply: dict | None = None


@dataclass
class Client:
    """One connection to one server, shared by any number of threads (requests carry ids)."""

    path: str
    instance: int = 0
    title: str = "the"  # the engine's name, for messages
    member: Member | None = None  # the server's process, to say how it ended
    sock: socket.socket | None = None
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    read_lock: threading.Lock = field(default_factory=threading.Lock)  # held by the thread reading
    cond: threading.Condition = field(default_factory=threading.Condition)  # guards pending/dead
    pending: dict = field(default_factory=dict)
    dead: str = ""
    hint: str = "check it runs: tilewise status"
    column_values: Callable | None = None  # the engine's Arrow -> Python conversion (ArrowRows)

    _ids: ClassVar = itertools.count(1)

    def connect(self, timeout_s: float = 10.0) -> Client:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout_s)
            s.connect(self.path)
            s.settimeout(None)  # the fd-level protocol needs a blocking socket
        except OSError as e:
            s.close()
            if self.member is not None and not self.member.alive()[0]:
                raise self._died("accepting a connection") from None  # say how it ended, not "refused"
            raise ServerError(f"cannot connect to the {self.title} server of instance {self.instance} at {self.path}: "
                              f"{e.strerror or e}", self.hint) from None
        self.sock = s
        return self

    # -- requests --
    def request(self, msg: dict, doing: str, timeout_s: float | None = None) -> dict:
        return self.wait(self.submit(msg, doing), doing, timeout_s)

    def query(self, sql: str, timeout_s: float | None = None) -> QueryResult:
        reply = self.request({"op": "query", "sql": sql}, "running a query", timeout_s)
        if not reply.get("ok"):
            raise TilewiseError(f"{self.title} instance {self.instance} rejected the query: {reply.get('error')}")
        rows = (ArrowRows(reply["rows"], reply["payload"], self.column_values) if "payload" in reply
                else reply["rows"])
        return QueryResult(reply["columns"], rows, reply["elapsed_s"], self.instance)

    def info(self, timeout_s: float | None = None) -> dict:
        return self.request({"op": "info"}, "reporting its settings", timeout_s)

    def submit(self, msg: dict, doing: str) -> _Pending:
        if self.dead or self.sock is None:
            raise self._died(doing)
        rid = next(self._ids)
        pend = _Pending(rid)
        with self.cond:
            self.pending[rid] = pend
        msg = dict(msg, id=rid)
        try:
            with self.write_lock:
                write_msg(self.sock.fileno(), msg)
        except OSError:
            with self.cond:
                self.pending.pop(rid, None)
            self.fail_all(self.dead or self._how())
            raise self._died(doing) from None
        return pend

    def wait(self, pend: _Pending, doing: str, timeout_s: float | None = None) -> dict:
        """Our answer: read the socket ourselves when no other thread is, else wait to be handed it
        (short waits keep Ctrl-C responsive; a reader that leaves wakes us to take over)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not pend.done:
            if deadline is not None and time.monotonic() > deadline:
                with self.cond:
                    self.pending.pop(pend.rid, None)
                raise ServerError(f"the {self.title} server of instance {self.instance} did not answer within "
                                  f"{timeout_s:g} s")
            if self.read_lock.acquire(blocking=False):
                try:
                    self._read_until(pend, deadline)
                finally:
                    self.read_lock.release()
                    with self.cond:
                        self.cond.notify_all()  # the next waiter becomes the reader
                continue
            with self.cond:
                self.cond.wait_for(lambda: pend.done or not self.read_lock.locked(), 0.2)
        if pend.reply is None:
            raise self._died(doing)
        return pend.reply

    def _read_until(self, pend: _Pending, deadline: float | None) -> None:
        """Read answers, handing each to its waiter, until ours came, the server is gone, or the deadline."""
        fd = self.sock.fileno()
        while not pend.done:
            if self.dead:
                self.fail_all(self.dead)
                return
            if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return  # wait() raises the timeout
            try:
                msg = read_msg(fd)
            except OSError:
                msg = None
            except BaseException:  # Ctrl-C in the middle of a message: the stream is unusable now
                self.fail_all("was interrupted while answering")
                raise
            if msg is None:
                self.fail_all(self.dead or self._how())
                return
            with self.cond:
                other = self.pending.pop(msg.get("id"), None)
                if other is not None:
                    other.reply, other.done = msg, True
                    if other is not pend:
                        self.cond.notify_all()

    def fail_all(self, how: str) -> None:
        with self.cond:
            self.dead = self.dead or how
            for rid in list(self.pending):
                self.pending.pop(rid).done = True  # reply None: the instance is gone
            self.cond.notify_all()

    def _how(self) -> str:
        return self.member.how_it_ended() if self.member is not None else "closed the connection"

    def _died(self, doing: str) -> InstanceDied:
        how = self.dead or self._how()
        pid = f" (pid {self.member.pid})" if self.member is not None else ""
        return InstanceDied(f"{self.title} instance {self.instance}{pid} {how} while {doing}", self.hint)

    def close(self) -> None:
        """End this connection (the server ends this session only); waiting threads fail at once."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        self.fail_all(self.dead or "was stopped")
        try:
            sock.shutdown(socket.SHUT_RDWR)  # a thread blocked reading it gets EOF now
        except OSError:
            pass
        if self.read_lock.acquire(timeout=2.0):  # no reader left on the fd: closing cannot hit a reused one
            self.read_lock.release()
        sock.close()

    def __enter__(self):
        return self.connect() if self.sock is None else self

    def __exit__(self, *exc) -> None:
        self.close()


class ReplicaServers(ProcessCluster):
    """One server per instance (role "worker", its socket in extra["socket"]). Subclasses set
    server_module (run as ``python -m server_module``) and, where the engine writes its tables,
    refresh_statements(); workdir = True gives each server a private directory for the engine's own
    files (<root>/work/instance-N, its handler's `workdir`), removed with the deployment."""

    server_module: ClassVar[str]
    workdir: ClassVar[bool] = False
    column_values: ClassVar[Callable | None] = None  # the engine's Arrow -> Python conversion (ArrowRows)
    STOP_ORDER: ClassVar[dict[str, int]] = {"worker": 1}
    error_cls: ClassVar[type[TilewiseError]] = ServerError
    start_timeout_s: ClassVar[float] = START_TIMEOUT_S

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Client] = {}
        self._every: list[Client] = []  # every instance's connection, once all were made
        self._route = threading.Lock()  # guards the connections
        self.router = Router()
        self.dataset = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, plan, *, dataset=None, allocator: str = "system", memory_mb=None, coordinator_mb=None,
              join=None, log=None) -> None:
        if join:
            raise UsageError(f"{self.title} servers do not cooperate on a query: there is nothing to join",
                             f"start them on each host with `tilewise up --engine {self.engine}`")
        try:
            memory_mb = self._begin(plan, dataset, memory_mb, join)
            self.dataset = dataset
            sockdir = self.root / "sockets"
            sockdir.mkdir(parents=True, exist_ok=True)
            os.chmod(sockdir, 0o700)
            tables_file = None
            if dataset is not None:  # Parquet files to load, or (a layout, raw tables) sources read in place
                tables = ({"in_place": True, "sources": self.data["sources"]} if self.data.get("sources")
                          else self.data["tables"])
                tables_file = atomic_write_json(self.root / "tables.json", tables)
            for inst in plan.instances:
                path = sockdir / f"instance-{inst.id}.sock"
                if len(str(path)) > SOCKET_MAX:
                    raise UsageError(f"the socket path {path} is longer than {SOCKET_MAX} bytes",
                                     "set TILEWISE_CLUSTER_DIR to a shorter directory" if self.detach else
                                     "set TMPDIR to a shorter directory")
                argv = [sys.executable, "-m", self.server_module, "--socket", str(path)]
                if memory_mb.get(inst.id):
                    argv += ["--memory-mb", str(memory_mb[inst.id])]
                if tables_file:
                    argv += ["--tables", str(tables_file)]
                if self.workdir:
                    work = self.root / "work" / f"instance-{inst.id}"
                    work.mkdir(parents=True, exist_ok=True)
                    os.chmod(work, 0o700)
                    argv += ["--workdir", str(work)]
                m = self._spawn("worker", inst.id, argv, Binding.from_instance(inst, allocator),
                                cores=len(inst.cpus), memory_mb=memory_mb.get(inst.id, 0), extra={"socket": str(path)})
                self._verify_started(m)
                if log:
                    log(f"{self.title} server {inst.id} started: pid {m.pid}, {m.binding.describe()}, socket {path}")
            self.endpoint = str(sockdir)
            deadline = time.monotonic() + self.start_timeout_s
            for m in self.workers():  # every server loads its own copy, all at once
                try:
                    self.wait_log(m, READY_RE, max(1.0, deadline - time.monotonic()),
                                  "load the tables and listen" if tables_file else "listen")
                except self.error_cls:
                    self._raise_refused()
                    raise
        except BaseException:
            if not self.detach:
                self.stop()
            raise

    def _raise_refused(self) -> None:
        """A server that refused what it was given (serve.Refused) said why in its log: that is the error."""
        for m in self.workers():
            try:
                with open(m.log, errors="replace") as f:
                    hit = REFUSED_RE.search(f.read())
            except OSError:
                continue
            if hit:
                try:
                    why = json.loads(hit.group(1))
                except ValueError:
                    continue
                raise UsageError(f"{self.title} instance {m.instance}: {why.get('message')}", why.get("hint") or None)

    def close(self) -> None:
        with self._route:
            clients, self._clients, self._every = list(self._clients.values()), {}, []
        for c in clients:
            c.close()

    # ---- queries ------------------------------------------------------------------------------
    def client(self, instance: int) -> Client:
        """The connection to instance's server (made on first use, kept until close())."""
        c = self._clients.get(instance)
        if c is not None:
            return c
        m = self.worker(instance)
        if m is None:
            ids = sorted(w.instance for w in self.workers())
            raise UsageError(f"no {self.title} instance {instance} in this cluster",
                             f"instances are {', '.join(map(str, ids))}" if ids else "start it with tilewise up")
        hint = ("check it runs: tilewise status" if self.detach else
                "the run was stopped and every other instance shut down")
        c = Client(m.extra["socket"], instance, self.title, m, hint=hint, column_values=self.column_values).connect()
        with self._route:
            if instance in self._clients:  # another thread connected meanwhile: keep one connection
                c.close()
                return self._clients[instance]
            self._clients[instance] = c
        return c

    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        if self._stopped:
            raise TilewiseError(f"the {self.title} engine was stopped")
        candidates: list[int] = []
        if instance is None:
            every = self._every or self._connect_all()
            candidates = [c.instance for c in every if not c.dead] or [c.instance for c in every]
        with self.router.route(candidates, instance) as i:
            return self.client(i).query(sql, timeout_s)

    def _connect_all(self) -> list[Client]:
        """A connection to every instance (kept: routing looks at them on every query)."""
        ids = [m.instance for m in self.workers()]
        if not ids:
            raise TilewiseError(f"this {self.title} cluster has no instance")
        every, failed = [], []
        for i in ids:  # an instance that does not answer is left out of the routing, not fatal
            try:
                every.append(self.client(i))
            except ServerError as e:
                failed.append(e)
        if not every:
            raise failed[0]
        if not failed:
            self._every = every
        return every

    def refresh_statements(self, function: str, rset) -> list[str]:
        """The SQL of a refresh function in this engine's dialect (engines whose spec says refresh)."""
        raise TilewiseError(f"the {self.engine} engine cannot apply refresh functions")

    def apply_refresh(self, function: str, rset) -> float:
        """Every replica applies the function in one transaction, all in parallel (concurrently
        with the queries running there); returns the wall time until the last one committed."""
        if self._stopped or self.dataset is None:
            raise TilewiseError(f"the {self.title} engine is not running")
        sql = self.refresh_statements(function, rset)
        t0 = time.perf_counter()
        doing = f"applying {function} of refresh set {rset.number}"
        clients = [self.client(m.instance) for m in self.workers()]  # every replica, or an error
        waits = [(c, c.submit({"op": "execute", "sql": sql}, doing)) for c in clients]
        errors = []
        for c, pend in waits:
            reply = c.wait(pend, doing)
            if not reply.get("ok"):
                errors.append(f"instance {c.instance}: {reply.get('error')}")
        if errors:
            raise TilewiseError(f"{self.title} could not apply {function} of refresh set {rset.number}: {errors[0]}")
        return time.perf_counter() - t0

    def info(self, instance: int) -> dict:
        reply = self.client(instance).info()
        keys = ("threads", "memory_mb", "load_s", "pid", "version", "cpu_s", "ctx_involuntary", "rss_mb", "peak_rss_mb",
                "rss_anon_mb", "tables")
        return {k: reply[k] for k in keys if k in reply}

    def switch_table(self, table: str, source: dict) -> None:
        """Every replica serves `table` from the copy `source` from now on (engines whose spec says
        capabilities.switch): all of them or an error naming the one that refused."""
        if not self.spec.capabilities.switch:
            super().switch_table(table, source)
        doing = f"switching table {table} to {source.get('layout') or source.get('format')}"
        clients = [self.client(m.instance) for m in self.workers()]
        waits = [(c, c.submit({"op": "switch", "table": table, "source": source}, doing)) for c in clients]
        errors = [f"instance {c.instance}: {r.get('error')}" for c, p in waits if not (r := c.wait(p, doing)).get("ok")]
        if errors:
            raise TilewiseError(f"{self.title} could not switch table {table}: {errors[0]}")
        if self.data.get("sources") is not None:
            self.data["sources"][table] = source

    # ---- status -------------------------------------------------------------------------------
    def member_status(self, m: Member) -> dict:
        d = super().member_status(m)
        d["socket"] = m.extra.get("socket")
        if d["healthy"]:  # a stopped server would keep this probe waiting for its whole timeout
            try:
                with Client(m.extra["socket"], m.instance, self.title) as c:
                    info = c.info(timeout_s=10)
                d["threads"] = info.get("threads")
                if info.get("pid") != m.pid:
                    self._unhealthy(d, f"the socket is served by pid {info.get('pid')}, not {m.pid}")
            except (TilewiseError, OSError, KeyError) as e:
                self._unhealthy(d, f"does not answer on its socket ({e})")
        return d

    def connect_hints(self, state) -> list[str]:
        socks = [m.extra.get("socket") for m in self.workers()]
        lines = [f"{len(socks)} {self.title} server(s), one per instance; sockets in {self.endpoint}",
                 f"query: tilewise query --name {state.name} [--instance I] \"SELECT ...\"",
                 "   or: from tilewise.engines.replicas import Client; "
                 f"Client('{socks[0] if socks else '...'}').connect().query('SELECT 42').rows"]
        if state.data.get("sources"):
            lines.append(f"{state.data.get('label', 'data')}: the {len(state.data['sources'])} tables are read in "
                         "place from their files by every instance (views)")
        elif state.data:
            lines.append(f"{state.data.get('label', 'data')}: the {len(state.data.get('tables', {}))} tables are "
                         "loaded in every instance")
        return lines
