"""The DBMS process of `tilewise bench elastic`: one DuckDB database, N client threads inside it.

Run as ``python -m tilewise.elastic.server CONFIG_JSON``. Protocol on stdin/stdout (one JSON
object per line): it loads the tables (CREATE TABLE ... AS SELECT * FROM read_parquet, so the
server's own threads first-touch the data), prints {"ready": ...}, waits for a line "go" on
stdin, runs the clients for the duration, and prints {"results": ...}.

Why one process with client threads: DuckDB is embedded, so "a server with N connections" is
one database with N cursors; separate client processes would each be a separate database with
its own copy of the data. The clients only wait on DuckDB (which releases the GIL), so the
process's CPU time is the engine's, and the elastic daemon manages exactly that process.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import threading
import time


def main() -> None:
    cfg = json.loads(sys.argv[1])
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {int(cfg['threads'])}")
    t0 = time.perf_counter()
    for name, path in cfg["tables"].items():
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}')")
    load_s = time.perf_counter() - t0
    queries = {int(k): v for k, v in cfg["queries"].items()}
    print(json.dumps({"ready": True, "load_s": load_s, "duckdb": duckdb.__version__}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    duration = float(cfg["duration"])
    stop_at = time.perf_counter() + duration
    records: list[list] = []
    errors: list[str] = []
    lock = threading.Lock()
    base = time.perf_counter()

    def client(i: int) -> None:
        cur = con.cursor()
        rng = random.Random(cfg.get("seed", 1) * 1000 + i)
        nums = sorted(queries)
        mine = []
        try:
            while time.perf_counter() < stop_at:
                q = nums[0] if len(nums) == 1 else rng.choice(nums)
                s = time.perf_counter()
                cur.execute(queries[q]).fetchall()
                e = time.perf_counter()
                mine.append([i, q, round(s - base, 6), round(e - s, 6)])
        except Exception as ex:  # noqa: BLE001 - reported to the harness, not swallowed
            with lock:
                errors.append(f"client {i}: {type(ex).__name__}: {ex}")
        finally:
            cur.close()
        with lock:
            records.extend(mine)

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(int(cfg["clients"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - w0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    print(json.dumps({"results": {"records": records, "wall_s": wall, "cpu_s": cpu, "errors": errors,
                                  "ctx_involuntary": ru1.ru_nivcsw - ru0.ru_nivcsw}}), flush=True)


if __name__ == "__main__":
    main()
