#!/usr/bin/env python3
"""Resident memory per instance of any engine, after it ran a benchmark's queries once.

Starts the engine's runtime (from the registry, as `bench tpch` does) on a plan, runs every query of
the benchmark's power stream once (each routed to the least busy instance; --per-instance runs them
on every instance), then reads each worker's whole process tree from /proc: RSS summed over the
processes, and PSS (shared pages counted once: a PostgreSQL server's shared buffers appear in the
RSS of every backend that touched them). Stops everything; prints one JSON document.

  .venv/bin/python scripts/engine_rss.py --engine postgres --sf 1 --policy wim
  .venv/bin/python scripts/engine_rss.py --engine duckdb --sf 1 --policy wic --per-instance
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def tree_memory(pid: int) -> dict:
    import psutil

    rss = pss = 0
    n = 0
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return {"processes": 0, "rss_mb": None, "pss_mb": None}
    for p in procs:
        try:
            mi = p.memory_full_info()
        except psutil.Error:
            continue
        n += 1
        rss += mi.rss
        pss += getattr(mi, "pss", 0)
    return {"processes": n, "rss_mb": round(rss / 2**20, 1), "pss_mb": round(pss / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--benchmark", default="tpch")
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--policy", default="wim")
    ap.add_argument("--worker-memory", default=None)
    ap.add_argument("--per-instance", action="store_true", help="run the queries on every instance")
    args = ap.parse_args(argv)

    from tilewise import benchmarks, engines, plan, topology
    from tilewise.engines.contract import Query

    spec = engines.get(args.engine)
    bench = benchmarks.get(args.benchmark)
    p = plan.plan(topology.load(None), args.policy)
    mem = None
    if args.worker_memory:
        mb = spec.capabilities.memory.parse(args.worker_memory)
        mem = {i.id: mb for i in p.instances}
    ds = bench.dataset(bench.data.check_sf(args.sf))
    qs = bench.query_set(None, seed=0, sf=args.sf)
    rt = spec.runtime_class()()
    doc: dict = {"engine": spec.name, "version": spec.version(), "benchmark": bench.name, "sf": args.sf,
                 "policy": args.policy, "instances": {}}
    t0 = time.monotonic()
    rt.start(p, dataset=ds, memory_mb=mem)
    doc["start_s"] = round(time.monotonic() - t0, 2)
    try:
        targets = [i.id for i in p.instances] if args.per_instance else [None]
        t1 = time.monotonic()
        for inst in targets:
            for q in bench.catalog.stream_order(0, None):
                sql = spec.sql(qs.sql(q, 0), Query(bench.name, q, 0, qs.key(q, 0)))
                rt.run_query(sql, instance=inst)
        doc["queries_s"] = round(time.monotonic() - t1, 2)
        for s in rt.status():
            doc["instances"][str(s.id)] = {"pid": s.pid, "cpus": list(s.cpus), **tree_memory(s.pid),
                                           **{k: v for k, v in rt.info(s.id).items() if k in ("memory_mb", "load_s")}}
    finally:
        rt.stop()
    json.dump(doc, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
