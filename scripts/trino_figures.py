#!/usr/bin/env python3
"""Figures for the Trino closing note: the 22 TPC-H queries under wim and n=2, cold and warm, on
Trino, DuckDB and Spark (same machine, same run, same data); start-up time; resident memory per
JVM; plus win/wicp on a loaded topology's plan (planned, not executed: settings per node).

    python scripts/trino_figures.py --sf 1 --out results/trino-figures [--engines trino,duckdb,spark]

Per engine and policy: start the engine bound (timed: start_s; Trino's first start also gathers the
data set's statistics, timed apart as prepare_s), run the 22 queries once (cold: the first run
after start), then --warm-runs more (warm: the median per query), validate every answer against
the reference, record the resident memory of every JVM after start and after the runs, stop.
Writes figures.json and figures.md in --out. On a quiet 2-core machine at SF 1: about 25-35 minutes
(Spark dominates). Timings taken on a busy machine are not reportable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def rss_of(engine) -> dict[str, float]:
    import psutil

    pids = {m.label: m.pid for m in engine.members}  # every process: coordinator/master, workers, servers
    out = {}
    for label, pid in pids.items():
        try:
            out[label] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            pass
    return out


def run_one(name: str, policy: str, k, dataset, ref, warm_runs: int, worker_memory: str | None) -> dict:
    from tilewise import engines, plan, topology
    from tilewise.benchmarks.tpch import queries as Q

    p = plan.plan(topology.load(None), policy, instances=k)
    spec = engines.get(name)
    knob = spec.capabilities.memory
    memory = {i.id: knob.parse(worker_memory) for i in p.instances} if worker_memory and knob else None
    eng = spec.runtime_class()()
    rec = {"engine": name, "policy": policy if k is None else f"n={k}", "instances": [list(i.cpus) for i in p.instances]}
    t0 = time.monotonic()
    try:
        eng.start(p, dataset=dataset, memory_mb=memory)
        rec["start_s"] = round(time.monotonic() - t0, 2)
        if getattr(eng, "prepare_info", None):  # Trino: JVM start-up and preparing the data set apart
            rec["jvm_start_s"] = round(eng.start_s, 2)
            rec["prepare_s"] = round(rec["start_s"] - eng.start_s, 2)
            rec["statistics_prepared_now"] = eng.prepare_info.get("prepared")
        rec["rss_mb_after_start"] = rss_of(eng)
        runs = []
        wrong = []
        for r in range(1 + warm_runs):
            times = {}
            wall0 = time.monotonic()
            for n in Q.NUMBERS:
                res = eng.run_query(Q.load(n))
                times[f"q{n}"] = round(res.elapsed_s, 4)
                chk = ref.check(n, res.rows)
                if not chk.ok:
                    wrong.append(f"run {r + 1} q{n}: {chk.detail}")
            runs.append({"wall_s": round(time.monotonic() - wall0, 3), "queries": times})
        rec["cold"] = runs[0]
        if warm_runs:
            rec["warm_wall_s"] = round(statistics.median(x["wall_s"] for x in runs[1:]), 3)
            rec["warm_queries"] = {q: round(statistics.median(x["queries"][q] for x in runs[1:]), 4)
                                   for q in runs[0]["queries"]}
        rec["runs"] = runs
        rec["wrong_answers"] = wrong
        rec["rss_mb_after_runs"] = rss_of(eng)
    finally:
        eng.stop()
    return rec


def planned_not_executed(topology_src: str) -> list[dict]:
    """win and wicp on a loaded topology: the Trino nodes tilewise would start, with their settings."""
    from tilewise import nic, plan, topology
    from tilewise.engines.trino import runtime as tc

    t = topology.load(topology_src)
    mem = {n.id: n.memory_bytes for n in t.numa_nodes}
    out = []
    for pol in ("win", "wicp"):
        p = plan.plan(t, pol)
        heap = tc.TrinoCluster.default_memory_mb(p, mem)
        place = nic.place_coordinator(p, None, None)
        out.append({"topology": t.source, "policy": pol, "executed": False,
                    "reason": "a loaded topology can be planned, not executed, on this machine",
                    "coordinator": {"shares_instance": place.coordinator.id if place.coordinator else None,
                                    "heap_mb": tc.coordinator_memory_mb(heap)},
                    "workers": [{"instance": i.id, "cpus": len(i.cpus), "mem": f"{i.mem_policy}:{list(i.mem_nodes)}",
                                 "heap_mb": heap[i.id], "task.concurrency": tc.task_concurrency(len(i.cpus)),
                                 "gc_threads": len(i.cpus)} for i in p.instances]})
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Trino vs DuckDB vs Spark, TPC-H SF {doc['sf']:g} ({doc['machine']})", ""]
    lines.append("| engine | policy | start s | cold 22q s | warm 22q s | answers | RSS per process after runs (MiB) |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in doc["results"]:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['policy']} | error: {r['error'][:80]} | | | | |")
            continue
        rss = ", ".join(f"{k} {v:.0f}" for k, v in r.get("rss_mb_after_runs", {}).items()) or "-"
        lines.append(f"| {r['engine']} | {r['policy']} | {r['start_s']:.1f} | {r['cold']['wall_s']:.1f} | "
                     f"{r.get('warm_wall_s', float('nan')):.1f} | {'valid' if not r['wrong_answers'] else 'WRONG'} | {rss} |")
    lines += ["", "Planned, not executed (loaded topology):", ""]
    for p in doc["planned"]:
        ws = p["workers"]
        lines.append(f"- {p['policy']} on {p['topology']}: coordinator with instance {p['coordinator']['shares_instance']} "
                     f"(heap {p['coordinator']['heap_mb']} MiB); {len(ws)} workers of {ws[0]['cpus']} cores, heap "
                     f"{ws[0]['heap_mb']} MiB, task.concurrency {ws[0]['task.concurrency']}, {ws[0]['mem']} ...")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--engines", default="trino,duckdb,spark")
    ap.add_argument("--policies", default="wim,n=2")
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--worker-memory", default="2560m", help="JVM heap per worker (trino, spark); <= 8 GB in all")
    ap.add_argument("--loaded-topology", default="tests/fixtures/epyc7713x2.xml")
    ap.add_argument("--out", default="results/trino-figures")
    a = ap.parse_args(argv)
    from tilewise import environment, topology
    from tilewise.benchmarks import validate
    from tilewise.benchmarks.tpch import data as tpch_data

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = tpch_data.dataset(a.sf, log=lambda m: print(m, file=sys.stderr))
    ref = validate.Reference(ds)
    ref.prepare(range(1, 23))
    doc = {"format": "tilewise-trino-figures/1", "sf": a.sf, "machine": topology.load(None).summary(),
           "environment": environment.capture(topology.load(None)),
           "worker_memory": a.worker_memory, "results": [],
           "planned": planned_not_executed(a.loaded_topology)}
    for name in [e.strip() for e in a.engines.split(",") if e.strip()]:
        for pol in [p.strip() for p in a.policies.split(",") if p.strip()]:
            k = int(pol[2:]) if pol.startswith("n=") else None
            print(f"{name} {pol} ...", file=sys.stderr, flush=True)
            try:
                rec = run_one(name, "n" if k else pol, k, ds, ref, a.warm_runs, a.worker_memory)
            except Exception as e:  # one failing engine must not lose the others' figures
                rec = {"engine": name, "policy": pol, "error": f"{type(e).__name__}: {e}"}
            doc["results"].append(rec)
            (out / "figures.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "figures.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if all("error" not in r and not r["wrong_answers"] for r in doc["results"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
