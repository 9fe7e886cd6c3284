#!/usr/bin/env python3
"""Where tilewise's time per query goes on the DuckDB worker path (what `bench overhead` sums up).

Starts one WIM DuckDB instance through the engine (as `bench tpch` does) and, per query, measures
the round trip seen by the caller minus the time the worker timed inside DuckDB ("gap": pipe,
wake-ups, result transfer, bookkeeping), plus the CPU time of the calling process and of the
worker and their context switches per query (CPU time and switch counts hold up on a busy
machine far better than wall time). A trivial query (SELECT 1) gives the fixed cost per query.

Run it against another source tree (e.g. an older commit) with PYTHONPATH:

  .venv/bin/python scripts/worker_path_profile.py --sf 0.1 --reps 5
  git archive COMMIT src | tar -x -C /tmp/before
  (cd /tmp && PYTHONPATH=/tmp/before/src /path/to/.venv/bin/python /path/to/scripts/worker_path_profile.py)
"""

import argparse
import json
import statistics
import time

import psutil

from tilewise import plan as planner
from tilewise import topology
from tilewise.benchmarks.tpch import queries as Q
from tilewise.benchmarks.tpch import data as tpch
from tilewise.engines.duckdb import DuckDBEngine


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def switches(p: psutil.Process) -> int:
    c = p.num_ctx_switches()
    return c.voluntary + c.involuntary


def measure(eng, worker, me, sqls, reps):
    gap = {n: [] for n, _ in sqls}
    c_me, c_w, s_me, s_w = cpu(me), cpu(worker), switches(me), switches(worker)
    n_q = 0
    for _ in range(reps):
        for n, sql in sqls:
            t0 = time.perf_counter()
            r = eng.run_query(sql)
            gap[n].append(time.perf_counter() - t0 - r.elapsed_s)
            len(r.rows)  # what validation touches first (ArrowRows decodes, rows stay lazy)
            n_q += 1
    return {"gap_ms_median": {f"q{n}" if isinstance(n, int) else n: round(statistics.median(v) * 1e3, 3) for n, v in gap.items()},
            "gap_ms_total_per_pass": round(sum(statistics.median(v) for v in gap.values()) * 1e3, 3),
            "caller_cpu_us_per_query": round((cpu(me) - c_me) / n_q * 1e6, 1),
            "worker_cpu_us_per_query": round((cpu(worker) - c_w) / n_q * 1e6, 1),
            "caller_switches_per_query": round((switches(me) - s_me) / n_q, 2),
            "worker_switches_per_query": round((switches(worker) - s_w) / n_q, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=5, help="passes over the 22 queries (after one warm-up pass)")
    ap.add_argument("--trivial", type=int, default=1000, help="SELECT 1 round trips")
    a = ap.parse_args()
    import tilewise

    ds = tpch.dataset(a.sf, None)
    p = planner.plan(topology.load(None), "wim")
    with DuckDBEngine() as eng:
        eng.start(p, dataset=ds)
        worker, me = psutil.Process(eng.status()[0].pid), psutil.Process()
        sqls = [(n, Q.load(n)) for n in Q.NUMBERS]
        measure(eng, worker, me, sqls, 1)  # warm-up
        tpch_part = measure(eng, worker, me, sqls, a.reps)
        trivial = measure(eng, worker, me, [("select1", "SELECT 1")], a.trivial)
        threads = worker.num_threads()
    print(json.dumps({"tilewise": tilewise.__file__, "sf": a.sf, "reps": a.reps, "tpch": tpch_part,
                      "trivial": {k: v for k, v in trivial.items() if k != "gap_ms_total_per_pass"},
                      "worker_threads_after": threads, "load_average": list(psutil.getloadavg())}, indent=1))


if __name__ == "__main__":
    main()
