"""The server side of a replica engine: one bound process per instance that loads the data set into
its own memory and answers queries on a Unix socket. An engine supplies a Handler (its connection,
how it loads tables, runs a query, applies a transaction); this module does the rest, the same for
every engine: ``python -m <engine's server module> --socket PATH [--tables FILE] [--memory-mb N]
[--workdir DIR]`` calls ``serve.main(Handler)``. The client is engines.replicas.

A server that cannot run with what it was given (a memory size the engine refuses, tables that do
not fit in it) raises Refused from the handler: the server prints one line starting with REFUSED and
exits with status 2 before it listens, and the runtime turns that line into the user's error.

Wire format (both directions, on the socket): a message is an 8-byte header (two big-endian lengths:
a pickled dict, then a raw payload, possibly empty) followed by both. Requests carry an "id" that
the reply repeats: {"op": "query", "sql": ...}, {"op": "execute", "sql": [statements]} (one
transaction: the TPC-H refresh functions, run like a query by the thread that read it, concurrently
with queries), {"op": "load", "tables": {name: path}}, {"op": "switch", "table": name, "source": {...}}
(serve a table from another copy of its files: cracking), {"op": "info"}, {"op": "exit"} (ends this
connection). Replies: {"id": .., "ok": True, ...} or {"id": .., "ok": False, "error": "..."}.

Tables are loaded into the engine (``--tables FILE``: name -> Parquet path) or, for a data set read
in place (a layout, raw CSV/TBL/JSON; the file then holds {"in_place": true, "sources": {name:
TableSource JSON}}), attached: the engine reads the files per query (Handler.attach; views in DuckDB).

A query's answer is fetched inside the engine's timed region: its first rows as Python tuples and,
only when there are more, the rest as an Arrow table, sent as the payload in Arrow's IPC stream
format, which the client turns into rows only when asked (after its clock stopped).

Threads: leader/followers. Every serving thread of a connection takes its turn reading it; the one
that got a query runs it itself (no hand-off, no thread per query) and, if no other thread is left
waiting for the next request, starts one first, so queries from several client streams run
concurrently on one instance (sharing its engine's thread pool, as concurrent clients of one server
do). A thread that finds another already waiting goes back to wait too, up to two idle threads.

The socket is private to the user (mode 0600 in a 0700 directory): the protocol carries pickles.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_HEAD = struct.Struct(">II")
_MAX_IDLE = 2  # serving threads allowed to wait for the next request at once
READY = "tilewise server ready on"  # the line a server prints when it accepts connections
REFUSED = "tilewise server refused:"  # the line a server prints when it refuses what it was given


# ---- the wire ----------------------------------------------------------------------------------

def read_msg(fd: int):
    """The next message as a dict (with "payload": bytes when one came), or None at end of file."""
    head = _read_exact(fd, _HEAD.size)
    if head is None:
        return None
    n, m = _HEAD.unpack(head)
    body = _read_exact(fd, n)
    if body is None:
        return None
    msg = pickle.loads(body)
    if m:
        payload = _read_exact(fd, m)
        if payload is None:
            return None
        msg["payload"] = payload
    return msg


def write_msg(fd: int, obj, payload=None) -> None:
    """obj (a dict, pickled) and an optional raw payload (bytes-like), in one message."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    plen = len(payload) if payload is not None else 0
    bufs = [memoryview(_HEAD.pack(len(data), plen) + data)]
    if plen:
        bufs.append(memoryview(payload).cast("B"))
    while bufs:
        k = os.writev(fd, bufs)
        while k and bufs:
            if k >= len(bufs[0]):
                k -= len(bufs[0])
                bufs.pop(0)
            else:
                bufs[0] = bufs[0][k:]
                k = 0


def _read_exact(fd: int, n: int) -> bytes | None:
    if n == 0:
        return b""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            return None  # EOF: the other side is gone
        got += k
    return buf


def arrow_ipc(table) -> object:
    """An Arrow table as one IPC stream buffer (one copy of the table's buffers)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


# ---- what an engine supplies ----------------------------------------------------------------------

@dataclass
class Answer:
    columns: list[str]
    rows: list[tuple]  # all rows, or the first ones when `rest` holds the others
    elapsed_s: float  # the engine's own time for the query (what the harness records)
    rest: object | None = None  # a pyarrow.Table with the rows after `rows`, or None


class Refused(Exception):
    """What the server was given cannot work (raised by a handler's __init__ or load): the message
    says what, the hint how to fix it (e.g. which option to change)."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.message, self.hint = message, hint
        super().__init__(f"{message}; {hint}" if hint else message)


class Handler:
    """One engine inside its server process. Subclasses open the engine in __init__ and implement
    load() and query(); execute() where the engine writes its tables (refresh functions). A handler
    whose __init__ takes a `workdir` keyword gets the private directory its runtime made for the
    engine's own files (ReplicaServers.workdir), removed with the deployment."""

    concurrent = True  # queries may run on several threads at once; False: they take turns

    def __init__(self, threads: int, memory_mb: int | None) -> None:
        self.threads, self.memory_mb = threads, memory_mb

    def load(self, tables: dict[str, str]) -> None:
        """Load each table (name -> Parquet path) into the engine's own memory."""
        raise NotImplementedError

    def attach(self, sources: dict[str, dict]) -> None:
        """Read each table in place (name -> a TableSource's JSON): per query, from its files. Also
        what switching a table to another copy does (the spec's capabilities.reads/switch say so)."""
        raise NotImplementedError("this engine does not read tables in place")

    def attached(self) -> dict[str, str]:
        """name -> the layout of the copy each table is read from now (for `info`)."""
        return {}

    def query(self, sql: str) -> Answer:
        raise NotImplementedError

    def execute(self, statements: list[str]) -> None:
        """Run the statements in one transaction, all or nothing."""
        raise NotImplementedError("this engine does not write its tables")

    def info(self) -> dict:
        """The engine's settings: at least "threads" and "version"."""
        return {"threads": self.threads}


# ---- the request loop -----------------------------------------------------------------------------

class Server:
    """One connection's request loop (leader/followers over its socket)."""

    def __init__(self, handler: Handler, conn: socket.socket, shared: dict) -> None:
        self.handler, self.conn, self.shared = handler, conn, shared
        self.fd = conn.fileno()
        self.read_lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.state = threading.Lock()
        self.waiting = 0  # threads waiting for (or reading) the next request

    def reply(self, msg: dict, obj: dict, payload=None) -> None:
        obj["id"] = msg.get("id")
        with self.out_lock:
            write_msg(self.fd, obj, payload)

    def serve(self, main: bool = False) -> None:
        while True:
            with self.state:
                if self.waiting >= _MAX_IDLE and not main:
                    return  # enough threads are waiting for requests already (the main thread never leaves)
                self.waiting += 1
            with self.read_lock:
                msg = read_msg(self.fd)
            with self.state:
                self.waiting -= 1
                spawn = self.waiting == 0
            if msg is None or msg.get("op") == "exit":
                self.ended()
                return
            if spawn:  # keep someone reading while this thread works
                threading.Thread(target=self.serve, daemon=True).start()
            self.handle(msg)

    def ended(self) -> None:
        """End of this connection: every thread serving it now reads EOF. The socket is closed when
        the last of them is gone (it is referenced by this object only), so no fd is closed while
        another thread still reads it."""
        try:
            self.conn.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def handle(self, msg: dict) -> None:
        op = msg.get("op")
        h = self.handler
        try:
            if op == "query":
                with self.shared["turns"]:
                    a = h.query(msg["sql"])
                payload = arrow_ipc(a.rest) if a.rest is not None and a.rest.num_rows else None
                self.reply(msg, {"ok": True, "columns": a.columns, "rows": a.rows, "elapsed_s": a.elapsed_s}, payload)
            elif op == "execute":
                t0 = time.perf_counter()
                with self.shared["turns"]:
                    h.execute(list(msg["sql"]))
                self.reply(msg, {"ok": True, "elapsed_s": time.perf_counter() - t0})
            elif op == "load":
                with self.shared["serial"]:
                    self.shared["load_s"] = _load(h, msg["tables"])
                self.reply(msg, {"ok": True, "elapsed_s": self.shared["load_s"]})
            elif op == "switch":
                t0 = time.perf_counter()
                with self.shared["serial"]:
                    h.attach({msg["table"]: msg["source"]})
                self.reply(msg, {"ok": True, "elapsed_s": time.perf_counter() - t0})
            elif op == "info":
                with self.shared["serial"]:
                    info = h.info()
                ru = resource.getrusage(resource.RUSAGE_SELF)  # the whole process, its exited threads included
                self.reply(msg, {"ok": True, "pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
                                 "load_s": self.shared.get("load_s"), "memory_mb": h.memory_mb,
                                 "cpu_s": ru.ru_utime + ru.ru_stime, "ctx_involuntary": ru.ru_nivcsw,
                                 "tables": h.attached(), **resident_mb(), **info})
            else:
                self.reply(msg, {"ok": False, "error": f"unknown request {op!r}"})
        except Exception as e:  # a failing request is an answer, not a crash
            self.reply(msg, {"ok": False, "error": f"{type(e).__name__}: {e}"})


_STATUS_KEYS = {"VmRSS:": "rss_mb", "VmHWM:": "peak_rss_mb", "RssAnon:": "rss_anon_mb"}


def resident_mb(pid: int | str = "self") -> dict:
    """A process's resident memory now, at its peak, and its anonymous part now (MiB;
    /proc/PID/status VmRSS, VmHWM, RssAnon: the rest is file pages, e.g. the engine's library,
    which instances share through the page cache). {} for a process that is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = _STATUS_KEYS.get(line.split(maxsplit=1)[0] if line.strip() else "")
                if key:
                    out[key] = int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _load(h: Handler, tables: dict) -> float:
    """Load (name -> Parquet path) or, for {"in_place": true, "sources": ...}, attach the tables."""
    t0 = time.perf_counter()
    if isinstance(tables.get("sources"), dict) and tables.get("in_place"):
        h.attach(tables["sources"])
    else:
        h.load(tables)
    return time.perf_counter() - t0


def main(handler_cls: type[Handler], argv: list[str] | None = None) -> int:
    """The server process: open the engine bound as started (threads = its CPUs), load the tables,
    listen, serve every connection on its own threads."""
    ap = argparse.ArgumentParser(prog=f"python -m {handler_cls.__module__}")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tables", default=None, help="JSON file: table -> Parquet path")
    ap.add_argument("--memory-mb", type=int, default=None)
    ap.add_argument("--workdir", default=None, help="a private directory for the engine's own files")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        kw = {"workdir": args.workdir} if args.workdir else {}
        handler = handler_cls(len(os.sched_getaffinity(0)), args.memory_mb or None, **kw)
        shared = {"serial": threading.Lock(), "turns": _NoLock() if handler.concurrent else threading.Lock(),
                  "load_s": None}
        if args.tables:
            tables = json.loads(Path(args.tables).read_text())
            shared["load_s"] = _load(handler, tables)
            print(f"loaded {len(tables.get('sources', tables))} tables in {shared['load_s']:.2f} s", flush=True)
    except Refused as e:
        print(f"{REFUSED} {json.dumps({'message': e.message, 'hint': e.hint})}", flush=True)
        return 2
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
    print(f"{READY} {path}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=Server(handler, conn, shared).serve, kwargs={"main": True}, daemon=True).start()


def run(handler_cls: type[Handler]) -> None:
    """`if __name__ == "__main__": serve.run(MyHandler)` in an engine's server module."""
    try:
        sys.exit(main(handler_cls))
    except KeyboardInterrupt:
        os._exit(130)
