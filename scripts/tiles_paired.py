#!/usr/bin/env python3
"""Paired TPC-H power tests of tiles deployments and one DataFusion process (docs/tiles.md).

The deployments are up at the same time and take turns, one whole power test (the 22 queries) each,
so that a change in the machine's speed (a shared VM's neighbours) hits all of them alike; each is
compared with the first run by run. `tilewise bench` measures one deployment after the other, which
on a noisy machine leaves confidence intervals wider than the differences between transports.

Deployments: `df` is one DataFusion process (the Python binding, DataFusion 55, two target
partitions, in this script's process, on the CPUs it may use); `POLICY:EXCHANGE:DATA` is a tiles
cluster (`tilewise up --engine tiles --policy POLICY --exchange EXCHANGE`, DATA the shm data path:
direct or grpc, TILEWISE_TILES_SHM_DATA) queried through Flight SQL (ADBC). The answers are not
validated here (`tilewise bench` does that, same engine, same SQL).

  .venv/bin/python scripts/tiles_paired.py --data DIR --runs 6 df wim:shm:direct wic:shm:direct wic:shm:grpc

DIR holds one Parquet file or folder per table (e.g. a parquet-K layout's folders). Prints each run,
then per deployment the median and range of its totals and of its ratio to the first deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

TILEWISE = str(Path(sys.executable).parent / "tilewise")


def datafusion_runner(data: str):
    from datafusion import SessionConfig, SessionContext

    ctx = SessionContext(SessionConfig().with_target_partitions(2))
    for t in sorted(os.listdir(data)):
        p = os.path.join(data, t)
        if t.endswith(".parquet"):
            ctx.register_parquet(t.removesuffix(".parquet"), p)
        elif os.path.isdir(p):
            ctx.register_parquet(t, p + "/")
    return lambda sql: ctx.sql(sql).collect()


def tiles_runner(spec: str, data: str, up: list[str]):
    import adbc_driver_flightsql.dbapi as flightsql

    policy, exchange, mode = spec.split(":")
    name = f"paired-{policy}-{exchange}-{mode}"
    cp = subprocess.run([TILEWISE, "up", "--engine", "tiles", "--exchange", exchange, "--policy", policy, "--data", data,
                         "--name", name, "--json"], env=dict(os.environ, TILEWISE_TILES_SHM_DATA=mode),
                        capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(cp.stderr.strip())
    up.append(name)
    cur = flightsql.connect(json.loads(cp.stdout)["endpoint"]).cursor()

    def run(sql: str) -> None:
        cur.execute(sql)
        cur.fetch_arrow_table()
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a folder of one Parquet file or folder per table")
    ap.add_argument("--runs", type=int, default=6, help="power tests per deployment after a warm-up (default 6)")
    ap.add_argument("deployments", nargs="+", help="df or POLICY:EXCHANGE:DATA (e.g. wic:shm:direct)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from tilewise.benchmarks.tpch import queries

    texts = queries.all()
    up: list[str] = []
    try:
        runners = {d: datafusion_runner(args.data) if d == "df" else tiles_runner(d, args.data, up)
                   for d in args.deployments}

        def power(run) -> float:
            total = 0.0
            for sql in texts.values():
                t0 = time.perf_counter()
                run(sql)
                total += time.perf_counter() - t0
            return total

        for run in runners.values():
            power(run)  # warm-up: the page cache, each process's first plans
        totals: dict[str, list[float]] = {d: [] for d in runners}
        for i in range(args.runs):
            for d, run in runners.items():
                totals[d].append(power(run))
            print(f"run {i + 1}: " + ", ".join(f"{d} {v[-1]:.2f} s" for d, v in totals.items()), flush=True)
        base = args.deployments[0]
        for d, v in totals.items():
            ratios = [a / b for a, b in zip(v, totals[base])]
            print(f"{d:18s} median {statistics.median(v):6.2f} s (min {min(v):.2f}, max {max(v):.2f}); "
                  f"ratio to {base}: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    finally:
        for name in up:
            subprocess.run([TILEWISE, "down", "--name", name], capture_output=True)


if __name__ == "__main__":
    main()
