#!/usr/bin/env python3
"""The measurements of issue 24 (thesis 004, ch. 5 on one machine), as the exact tilewise commands.

    python scripts/layout_study.py STEP --sf N [--engine E] [--out DIR] [--data-dir DIR] [--runs R] [--dry-run]

STEP (each writes results.json + CSV under OUT/<step>-sf<N>/, shown again by `tilewise report`;
with --engine other than duckdb, OUT/<step>-<engine>-sf<N>/):

  formats   CSV (and TBL) as it is vs Parquet with one file per table: the whole TPC-H workload,
            time, bytes read from storage (page cache dropped per file before every run), CPU-seconds,
            what transcoding cost and its break-even in workload runs (the thesis's table 5.1)
  chunks    Parquet with 1, 2, 4, ..., 128 files per table, the whole workload (figures 5.3 and 5.6)
  sorted    lineitem sorted on l_shipdate, one copy and a second copy beside the original, for
            Q6, Q14, Q15, Q20 and for the whole workload (table 5.2)
  crack     `tilewise up --sf N --raw tbl --crack parquet-K` (its own layout store, so every table is
            transformed now) with a query loop: time to the first answer
            on the raw data, query times while the tables are transformed in the background, and after
            (a CSV timeline: every query with its time and the copy lineitem was read from)
  tiles     Spark (and Trino, when installed) on 2 tiles: per K, how lineitem's files and row groups
            split over the tiles (predicted) and what each tile read (measured), Q1, Q6, Q14
            (--engine does not apply: the step is about engines whose tiles share a scan)
  all       every step above

--dry-run prints the commands without running them. Every command runs on a quiet machine only:
`tilewise` itself warns (load average, other busy processes) and records the load in results.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

TW = [sys.executable, "-m", "tilewise"]
CHUNKS = [1, 2, 4, 8, 16, 32, 64, 128]
SORT_QUERIES = "6,14,15,20"


def run(cmd: list[str], dry: bool, env: dict | None = None) -> int:
    print("$ " + shlex.join(["tilewise", *cmd[3:]] if cmd[:3] == TW else cmd), flush=True)
    if dry:
        return 0
    t0 = time.monotonic()
    rc = subprocess.run(cmd, env=env).returncode
    print(f"# exit {rc} after {time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    return rc


def where(a, name: str) -> Path:
    """OUT/<name>-sf<N>, with the engine in the name when it is not DuckDB (the default)."""
    return Path(a.out) / (f"{name}-sf{a.sf:g}" if a.engine == "duckdb" else f"{name}-{a.engine}-sf{a.sf:g}")


def layout(a, name: str, *extra: str) -> list[str]:
    return [*TW, "data", "layout", "--benchmark", "tpch", "--sf", f"{a.sf:g}", "--engine", a.engine,
            "--runs", str(a.runs), "--out", str(where(a, name)), *(["--data-dir", a.data_dir] if a.data_dir else []),
            *extra]


def formats(a) -> int:
    rc = run(layout(a, "formats-csv", "--raw", "csv", "--layouts", "parquet-1"), a.dry_run)
    return rc or run(layout(a, "formats-tbl", "--raw", "tbl", "--layouts", "parquet-1"), a.dry_run)


def chunks(a) -> int:
    return run(layout(a, "chunks", "--raw", "tbl", "--layouts", ",".join(f"parquet-{k}" for k in CHUNKS)), a.dry_run)


def sorted_(a) -> int:
    names = f"parquet-{a.k},parquet-{a.k}-sorted-l_shipdate,parquet-{a.k}+sorted-l_shipdate"
    rc = run(layout(a, "sorted-q6-14-15-20", "--raw", "tbl", "--queries", SORT_QUERIES, "--layouts", names), a.dry_run)
    return rc or run(layout(a, "sorted-all", "--raw", "tbl", "--layouts", names), a.dry_run)


def tiles(a) -> int:
    rc = 0
    engines = ["spark"] + (["trino"] if a.trino else [])
    for engine in engines:
        for k in [1, 2, 4, 8, 16, 32]:
            out = Path(a.out) / f"tiles-{engine}-k{k}-sf{a.sf:g}"
            rc |= run([*TW, "bench", "tpch", "--engine", engine, "--sf", f"{a.sf:g}", "--policies", "n=2",
                       "--queries", "1,6,14", "--tests", "power", "--runs", "3", "--layout", f"parquet-{k}",
                       "--no-plots", "--out", str(out), *(["--data-dir", a.data_dir] if a.data_dir else [])], a.dry_run)
    return rc


def crack(a) -> int:
    """up on the raw TBL with --crack, then a loop of TPC-H queries until every table switched and
    `--after` more rounds; a CSV timeline and a summary."""
    out = where(a, "crack")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TILEWISE_CLUSTER_DIR=str(out / "clusters"))
    name = "crackstudy"
    # a store of its own: copies the other steps made are not reused, every table is transformed
    up = [*TW, "up", "--engine", a.engine, "--policy", a.policy, "--sf", f"{a.sf:g}", "--raw", "tbl",
          "--crack", f"parquet-{a.k}", "--layout-dir", str(out / "store"), "--name", name,
          *(["--data-dir", a.data_dir] if a.data_dir else [])]
    print(f"# then: a loop of queries {a.queries} on the cluster until every table switched, {a.after} more rounds")
    if a.dry_run:
        run(up, True)
        return 0
    t0 = time.monotonic()
    if run(up, False, env):
        return 1
    os.environ["TILEWISE_CLUSTER_DIR"] = env["TILEWISE_CLUSTER_DIR"]
    from tilewise import benchmarks, cluster

    spec = benchmarks.get("tpch")
    rows, after = [], None
    try:
        while True:
            st = cluster.load(name)
            crack_state = st.data["crack"]["state"]
            for q in [int(x) for x in a.queries.split(",")]:
                cl = st.cluster()
                try:
                    copy = cl.info(0)["tables"]["lineitem"]
                    r = cl.run_query(spec.catalog.text(q))
                finally:
                    cl.close()
                rows.append({"t_s": round(time.monotonic() - t0, 3), "query": f"q{q}", "elapsed_s": round(r.elapsed_s, 4),
                             "lineitem": copy, "crack": crack_state, "load": round(os.getloadavg()[0], 2)})
                print(rows[-1], flush=True)
            if crack_state in ("done", "failed"):
                after = (after or 0) + 1
                if after > a.after:
                    break
        st = cluster.load(name)
        (out / "crack.json").write_text(json.dumps(st.data["crack"], indent=2))
    finally:
        run([*TW, "down", "--name", name], False, env)
    with open(out / "timeline.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    first = rows[0]
    raw = [r["elapsed_s"] for r in rows if r["lineitem"] != f"parquet-{a.k}"]
    cracked = [r["elapsed_s"] for r in rows if r["lineitem"] == f"parquet-{a.k}" and r["crack"] == "done"]
    print(f"first answer {first['t_s']:.1f} s after `up` began (its query {first['elapsed_s']:.3f} s on raw data); "
          f"{len(raw)} queries before lineitem switched, {len(cracked)} after every table switched; "
          f"timeline: {out / 'timeline.csv'}")
    return 0


STEPS = {"formats": formats, "chunks": chunks, "sorted": sorted_, "crack": crack, "tiles": tiles}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=[*STEPS, "all"])
    ap.add_argument("--sf", type=float, required=True)
    ap.add_argument("--out", default="results/layout-study")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default="duckdb", help="formats, chunks, sorted, crack: an engine that reads files in "
                                                         "place (duckdb, clickhouse, spark)")
    ap.add_argument("--k", type=int, default=8, help="files per table for sorted/crack (default 8)")
    ap.add_argument("--policy", default="wim", help="crack: the deployment's policy")
    ap.add_argument("--queries", default="1,6,14", help="crack: the query loop")
    ap.add_argument("--after", type=int, default=3, help="crack: rounds after every table switched")
    ap.add_argument("--trino", action="store_true", help="tiles: Trino too (tilewise engines install trino)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    steps = list(STEPS) if a.step == "all" else [a.step]
    rc = 0
    for s in steps:
        rc |= STEPS[s](a)
    return rc


if __name__ == "__main__":
    sys.exit(main())
