"""Plain DuckDB TPC-H, no tilewise in the loop: the baseline of the harness-overhead measurement.

Same data (the Parquet set tilewise caches), same SQL, same work per query as a tilewise DuckDB
server (engines/duckdb/server.py): tables loaded into memory with CREATE TABLE AS from Parquet,
threads = CPUs allowed, then per query the server's own timed region (engines.duckdb.server.fetch_answer:
execute, the first rows as tuples, a large answer's rest as Arrow), or with --fetch rows execute +
fetchall (what workers did before; use it to measure an older tilewise). One warm-up pass, then
--runs timed passes.

Run it as a fresh process (that is the point):

  python -m tilewise.bench.plain_duckdb --sf 1 --runs 3            # readable
  python -m tilewise.bench.plain_duckdb --sf 1 --runs 3 --json     # for `tilewise bench overhead`

--sql FILE runs the queries listed in a JSON file ([{"query": 6, "sql": "..."}], in that order),
so the overhead benchmark can hand it exactly what the tilewise pass runs. --cpus binds this
process before DuckDB starts (DuckDB sizes its thread pool from the affinity mask).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

FORMAT = "tilewise-plain-duckdb/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tilewise.bench.plain_duckdb", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", default="1", help="scale factor of the cached data set (default 1)")
    ap.add_argument("--runs", type=int, default=3, help="timed passes after one warm-up pass (default 3)")
    ap.add_argument("--benchmark", default="tpch", help="whose cached data set and queries (default tpch)")
    ap.add_argument("--data", default=None, help="directory with the tables as <table>.parquet "
                    "(default: ~/.cache/tilewise/<benchmark>/sf<SF>; `tilewise bench <benchmark>` generates it)")
    ap.add_argument("--tables", default=None, help="the tables to load, comma-separated (default: every "
                    "<table>.parquet in --data)")
    ap.add_argument("--sql", default=None, metavar="FILE", help="JSON list of {query, sql} to run, in order "
                    "(default: the benchmark's queries with their qualification parameters, in catalog order)")
    ap.add_argument("--fetch", choices=("worker", "rows"), default="worker",
                    help="worker: fetch each answer as a tilewise worker does (default); rows: fetchall()")
    ap.add_argument("--cpus", default=None, help="bind to these CPUs first, e.g. 0-7 (default: as started)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    return a


def queries(sql_file: str | None, benchmark: str) -> list[tuple[int | str, str]]:
    if sql_file:
        return [(q["query"], q["sql"]) for q in json.loads(Path(sql_file).read_text())]
    from tilewise import benchmarks

    cat = benchmarks.get(benchmark).catalog
    return [(q, cat.text(q)) for q in cat.ids]


def run(a: argparse.Namespace) -> dict:
    if a.cpus:
        from tilewise import cpulist

        os.sched_setaffinity(0, cpulist.parse(a.cpus))
    from tilewise import dirs  # this baseline process imports as little of tilewise as it can

    data = Path(a.data or dirs.cache_dir(a.benchmark) / f"sf{float(a.sf):g}")
    tables = a.tables.split(",") if a.tables else sorted(p.stem for p in data.glob("*.parquet"))
    missing = [f"{t}.parquet" for t in tables if not (data / f"{t}.parquet").is_file()] or (
        [] if tables else ["<table>.parquet"])
    if missing:
        raise SystemExit(f"Error: {data} has no {missing[0]} (generate it: tilewise bench {a.benchmark} --sf {a.sf} once)")
    qs = queries(a.sql, a.benchmark)
    import duckdb

    from tilewise.engines.duckdb.server import connect, fetch_answer, load_tables

    threads = len(os.sched_getaffinity(0))
    con = connect(threads)  # as a server sets up its database (threads, lossless Arrow export)
    t0 = time.perf_counter()
    load_tables(con, {t: str(data / f"{t}.parquet") for t in tables})
    load_s = time.perf_counter() - t0
    per_q: dict[int | str, list[float]] = {n: [] for n, _ in qs}
    warm: dict[int | str, float] = {}
    walls, cpus = [], []
    for r in range(a.runs + 1):  # pass 0 is the warm-up
        c0, w0 = time.process_time(), time.perf_counter()
        for n, sql in qs:
            cur = con.cursor()  # as the worker: a cursor per query, made before the clock starts
            q0 = time.perf_counter()
            if a.fetch == "worker":
                fetch_answer(cur, sql)
            else:
                cur.execute(sql).fetchall()
            dt = time.perf_counter() - q0
            cur.close()
            if r:
                per_q[n].append(dt)
            else:
                warm[n] = dt
        if r:
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    return {"format": FORMAT, "duckdb": duckdb.__version__, "data": str(data), "sf": float(a.sf), "threads": threads,
            "cpus": sorted(os.sched_getaffinity(0)), "fetch": a.fetch, "load_s": load_s,
            "order": [n for n, _ in qs], "queries": {f"q{n}": ts for n, ts in per_q.items()},
            "warmup_s": {f"q{n}": t for n, t in warm.items()}, "run_wall_s": walls, "run_cpu_s": cpus}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    doc = run(a)
    if a.json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return
    print(f"loaded {doc['data']} in {doc['load_s']:.2f} s ({doc['threads']} threads, fetch {doc['fetch']})")
    for q, ts in doc["queries"].items():
        print(f"{q:<4} {statistics.median(ts):8.3f} s")
    med = {q: statistics.median(ts) for q, ts in doc["queries"].items()}
    print(f"sum of query medians {sum(med.values()):.3f} s")
    print(f"total (median of {a.runs} runs' wall time) {statistics.median(doc['run_wall_s']):.3f} s  runs: "
          + ", ".join(f"{w:.3f}" for w in doc["run_wall_s"]))


if __name__ == "__main__":
    main()
