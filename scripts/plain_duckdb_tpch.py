#!/usr/bin/env python3
"""Plain DuckDB TPC-H, no tilewise in the loop: the baseline for the harness-overhead measurement.

Same data (the Parquet set tilewise caches), same 22 SQL files, same work per query as a tilewise
DuckDB worker: tables loaded into memory, threads = CPUs allowed, then execute + fetchall.
Prints per-query medians and the median over runs of one pass's wall time (compare with the
`total s` of `tilewise bench tpch --policies wim --streams 1`).

  .venv/bin/python scripts/plain_duckdb_tpch.py --sf 1 --runs 3
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import duckdb

QUERIES = Path(__file__).resolve().parents[1] / "src" / "tilewise" / "queries"
TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", default="1")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", default=None, help="directory with the 8 tables as <table>.parquet "
                    "(default: ~/.cache/tilewise/tpch/sf<SF>, generate it with tilewise bench tpch once)")
    a = ap.parse_args()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    data = Path(a.data or Path(cache) / "tilewise" / "tpch" / f"sf{float(a.sf):g}")
    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {len(os.sched_getaffinity(0))}")
    t0 = time.perf_counter()
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{data / (t + '.parquet')}')")
    print(f"loaded {data} in {time.perf_counter() - t0:.2f} s")
    sql = {n: (QUERIES / f"q{n:02d}.sql").read_text().strip().rstrip(";") for n in range(1, 23)}
    per_q = {n: [] for n in sql}
    walls = []
    for r in range(a.runs + 1):  # run 0 is the warm-up
        w0 = time.perf_counter()
        for n, q in sql.items():
            q0 = time.perf_counter()
            con.execute(q).fetchall()
            if r:
                per_q[n].append(time.perf_counter() - q0)
        if r:
            walls.append(time.perf_counter() - w0)
    for n, ts in per_q.items():
        print(f"q{n:<3} {statistics.median(ts):8.3f} s")
    print(f"sum of query medians {sum(statistics.median(t) for t in per_q.values()):.3f} s")
    print(f"total (median of {a.runs} runs' wall time) {statistics.median(walls):.3f} s  runs: "
          + ", ".join(f"{w:.3f}" for w in walls))


if __name__ == "__main__":
    main()
