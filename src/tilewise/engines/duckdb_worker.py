"""One DuckDB instance: a bound process that loads the tables into its own memory and runs queries.

Started by engines.duckdb with the plan instance's binding already applied (CPU affinity, memory
policy, LD_PRELOAD allocator). It talks to the parent over two dedicated pipes (file descriptors
given on the command line), never stdout. A message is an 8-byte header (two big-endian lengths:
a pickled dict, then a raw payload, possibly empty) followed by both. Requests carry an "id" that
the reply repeats: {"op": "load", "tables": {name: path}}, {"op": "query", "sql": ...},
{"op": "execute", "sql": [statements]} (one transaction: the TPC-H refresh functions, run like a
query by the thread that read it, concurrently with queries), {"op": "info"}, {"op": "exit"}. Replies: {"id": .., "ok": True, ...} or {"id": .., "ok": False,
"error": "..."}.

A query's answer is fetched inside the timed region (execute + fetch, ``fetch_answer``, which the
plain-DuckDB baseline calls too): its first SMALL rows as Python tuples, and only when there are more,
the rest as an Arrow table (for the small answers of most TPC-H queries tuples are cheapest, for
large ones Arrow is: Q16 at SF 1 is 18,314 rows). The tuples travel pickled, the Arrow part as the
payload in Arrow's IPC stream format, which the parent turns into rows only when asked (after its
clock stopped). HUGEINT columns are exported losslessly (a DuckDB extension type) so the rows
equal fetchall()'s, ints included.

Threads: leader/followers. Every serving thread takes its turn reading the pipe; the one that got
a query runs it itself (no hand-off, no thread per query) and, if no other thread is left waiting
for the next request, starts one first, so queries from several client streams still run
concurrently on one instance (sharing its DuckDB thread pool, as concurrent clients of one server
do). A thread that finds another already waiting goes back to wait too, up to two idle threads.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import time
import warnings

# fetch_answer takes the rest of a large answer from the executed cursor; DuckDB warns that this
# copies the Arrow buffers once (cheap next to building Python objects): not a user's concern
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)

_HEAD = struct.Struct(">II")
_MAX_IDLE = 2  # serving threads allowed to wait for the next request at once
SMALL = 256  # rows fetched as Python tuples before the rest of an answer is fetched as Arrow


def fetch_answer(cur, sql: str):
    """Execute and fetch the whole answer: (column names, the first rows as tuples, the rest as a
    pyarrow.Table or None). What a worker times per query, and what the plain baseline does."""
    cur.execute(sql)
    cols = [d[0] for d in cur.description] if cur.description else []
    if not cols:
        return cols, [], None
    head = cur.fetchmany(SMALL)
    rest = cur.to_arrow_table() if len(head) == SMALL else None
    return cols, head, rest


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


class Server:
    """The worker's request loop (leader/followers over the input pipe)."""

    def __init__(self, con, fd_in: int, fd_out: int) -> None:
        self.con, self.fd_in, self.fd_out = con, fd_in, fd_out
        self.read_lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.state = threading.Lock()
        self.waiting = 0  # threads waiting for (or reading) the next request
        self.serial = threading.Lock()  # load and info run one at a time, as before

    def reply(self, msg: dict, obj: dict, payload=None) -> None:
        obj["id"] = msg.get("id")
        with self.out_lock:
            write_msg(self.fd_out, obj, payload)

    def serve(self, main: bool = False) -> None:
        while True:
            with self.state:
                if self.waiting >= _MAX_IDLE and not main:
                    return  # enough threads are waiting for requests already (the main thread never leaves)
                self.waiting += 1
            with self.read_lock:
                msg = read_msg(self.fd_in)
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
        """End of input or an exit request. The worker process ends: in-memory database, nothing to
        save; _exit so queries still running in other threads are not torn down by interpreter
        finalisation (DuckDB aborts on that). (duckdb_server ends only one client's session.)"""
        os._exit(0)

    def handle(self, msg: dict) -> None:
        op = msg.get("op")
        try:
            if op == "query":
                self.query(msg)
            elif op == "execute":
                self.execute(msg)
            elif op == "load":
                with self.serial:
                    t0 = time.perf_counter()
                    for name, path in msg["tables"].items():
                        quoted = str(path).replace("'", "''")
                        self.con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet('{quoted}')")
                    self.reply(msg, {"ok": True, "elapsed_s": time.perf_counter() - t0})
            elif op == "info":
                with self.serial:
                    ver = self.con.execute("SELECT current_setting('threads'), version()").fetchone()
                self.reply(msg, {"ok": True, "pid": os.getpid(), "threads": int(ver[0]), "version": ver[1],
                                 "cpus": sorted(os.sched_getaffinity(0))})
            else:
                self.reply(msg, {"ok": False, "error": f"unknown request {op!r}"})
        except Exception as e:  # a failing request is an answer, not a crash
            self.reply(msg, {"ok": False, "error": f"{type(e).__name__}: {e}"})

    def execute(self, msg: dict) -> None:
        """Statements in one transaction, all or nothing (TPC-H RF1/RF2 and their undo)."""
        cur = self.con.cursor()
        try:
            t0 = time.perf_counter()
            cur.execute("BEGIN TRANSACTION")
            try:
                for stmt in msg["sql"]:
                    cur.execute(stmt)
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise
            elapsed = time.perf_counter() - t0
        finally:
            cur.close()
        self.reply(msg, {"ok": True, "elapsed_s": elapsed})

    def query(self, msg: dict) -> None:
        cur = self.con.cursor()
        try:
            t0 = time.perf_counter()
            cols, head, rest = fetch_answer(cur, msg["sql"])
            elapsed = time.perf_counter() - t0
        finally:
            cur.close()
        payload = arrow_ipc(rest) if rest is not None and rest.num_rows else None
        self.reply(msg, {"ok": True, "columns": cols, "rows": head, "elapsed_s": elapsed}, payload)


def main(argv: list[str]) -> int:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    import duckdb

    threads = len(os.sched_getaffinity(0))
    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {threads}")
    con.execute("SET arrow_lossless_conversion = true")  # HUGEINT as itself, not as decimal(38,0)
    Server(con, fd_in, fd_out).serve(main=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
