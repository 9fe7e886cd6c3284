"""One DuckDB instance: a bound process that loads the tables into its own memory and runs queries.

Started by engines.duckdb with the plan instance's binding already applied (CPU affinity, memory
policy, LD_PRELOAD allocator). It talks to the parent over two dedicated pipes (file descriptors
given on the command line), never stdout: each message is a 4-byte big-endian length followed by a
pickle. Requests carry an "id" that the reply repeats: {"op": "load", "tables": {name: path}},
{"op": "query", "sql": ...}, {"op": "info"}, {"op": "exit"}. Replies: {"id": .., "ok": True, ...} or
{"id": .., "ok": False, "error": "..."}. Queries run concurrently, each on its own cursor in its own
thread (several client streams on one instance share its DuckDB thread pool, as concurrent clients
of one server do); load and info run in order.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import time


def read_msg(fd: int):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    body = _read_exact(fd, n)
    if body is None:
        return None
    return pickle.loads(body)


def write_msg(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = memoryview(struct.pack(">I", len(data)) + data)
    while buf:
        k = os.write(fd, buf)
        buf = buf[k:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            return None  # EOF: the other side is gone
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    import duckdb

    threads = len(os.sched_getaffinity(0))
    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {threads}")
    out_lock = threading.Lock()

    def reply(msg: dict, obj: dict) -> None:
        obj["id"] = msg.get("id")
        with out_lock:
            write_msg(fd_out, obj)

    def run_query(msg: dict) -> None:
        try:
            cur = con.cursor()
            try:
                t0 = time.perf_counter()
                cur.execute(msg["sql"])
                rows = cur.fetchall()
                elapsed = time.perf_counter() - t0
                cols = [d[0] for d in cur.description] if cur.description else []
            finally:
                cur.close()
            reply(msg, {"ok": True, "columns": cols, "rows": rows, "elapsed_s": elapsed})
        except Exception as e:  # a failing query is an answer, not a crash
            reply(msg, {"ok": False, "error": f"{type(e).__name__}: {e}"})

    while True:
        msg = read_msg(fd_in)
        if msg is None or msg.get("op") == "exit":
            # in-memory database: nothing to save; _exit so queries still running in other
            # threads are not torn down by interpreter finalisation (DuckDB aborts on that)
            os._exit(0)
        op = msg.get("op")
        try:
            if op == "query":
                threading.Thread(target=run_query, args=(msg,), daemon=True).start()
            elif op == "load":
                t0 = time.perf_counter()
                for name, path in msg["tables"].items():
                    quoted = str(path).replace("'", "''")
                    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet('{quoted}')")
                reply(msg, {"ok": True, "elapsed_s": time.perf_counter() - t0})
            elif op == "info":
                ver = con.execute("SELECT current_setting('threads'), version()").fetchone()
                reply(msg, {"ok": True, "pid": os.getpid(), "threads": int(ver[0]), "version": ver[1],
                            "cpus": sorted(os.sched_getaffinity(0))})
            else:
                reply(msg, {"ok": False, "error": f"unknown request {op!r}"})
        except Exception as e:
            reply(msg, {"ok": False, "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
