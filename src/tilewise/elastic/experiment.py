"""`tilewise bench elastic`: N clients on one DuckDB process, with and without the elastic allocator.

Cases: ``os`` (no allocator: every allowed core, the OS schedules) and one per allocation mode
(dense, sparse, adaptive), each for each workload: ``q6`` (every client runs TPC-H Q6 in a loop)
and ``mixed`` (every client runs a random one of the 22 queries in a loop, seeded). For each case:
throughput, latency, CPU-seconds the DBMS process used, cores allocated over time (the daemon's
log, also written to logs/<case>.jsonl for `tilewise elastic --replay`), and the daemon's own cost.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results import stats as S
from tilewise.results.kinds import elastic_log
from tilewise.results.output import LineWriter

CONFIGS = ("os", "dense", "sparse", "adaptive")
WORKLOADS = ("q6", "mixed")


def _readline(proc: subprocess.Popen, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TilewiseError(f"the DuckDB server did not answer ({what}) within {timeout:.0f} s")
        r, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if r:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                raise TilewiseError(f"the DuckDB server exited while {what}: {err.strip()[-500:]}")
            try:
                return json.loads(line)
            except ValueError:
                continue


def run_case(*, config: str, workload: str, tables: dict, queries: dict, clients: int, duration: float,
             interval: float, topo, th_min: float, th_max: float, threads: int, log_path: Path | None,
             seed: int = 1) -> dict:
    from tilewise import launch
    from tilewise.elastic import daemon, enforce, modes, petri

    cfg = {"tables": tables, "queries": queries, "clients": clients, "duration": duration, "threads": threads,
           "seed": seed}
    argv = [sys.executable, "-m", "tilewise.elastic.server", json.dumps(cfg)]
    recs: list[dict] = []
    d = None
    th = None
    sink = None
    res = None  # the clients' results: None while they run (the log then ends interrupted)
    with launch.Supervisor() as sup:
        s = sup.start(f"duckdb-{config}-{workload}", argv, verify_binding=False,
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc = s.proc
        ready = _readline(proc, 900, "loading the data")
        allowed = tuple(sorted(os.sched_getaffinity(proc.pid)))
        pool = modes.make_pool(topo, allowed)
        try:
            if config != "os":
                target = daemon.PidTarget(proc.pid)
                unit = daemon.Unit(f"{config}-{workload}", pool, petri.NetConfig(th_min, th_max, pool.n_total), config, target)
                unit.enforcer = enforce.choose("auto", proc.pid, None)
                sink = _log(log_path, topo, {"target": [unit.name], "mode": config, "workload": workload,
                                             "clients": clients, "duration": duration, "interval": interval,
                                             "th_min": th_min, "th_max": th_max, "dry_run": False, "enforce": "auto"})

                def log(rec: dict) -> None:
                    recs.append(rec)
                    sink.write(rec)

                d = daemon.Daemon([unit], interval=interval, log=log)
                d.start()
                th = threading.Thread(target=d.run, name="elastic", daemon=True)
                th.start()
            t_go = (time.monotonic() - d.t0) if d else 0.0
            proc.stdin.write("go\n")
            proc.stdin.flush()
            res = _readline(proc, duration + 600, "running the clients")["results"]
        finally:
            if d is not None:
                d.stopped = True
                if th is not None:
                    th.join(timeout=10)
                d.close()
                sink.write(elastic_log.end_record(t=None, stop_reason=d.stop_reason, stats=d.stats(),
                                                  problems=d.problems, interrupted=res is None))
            if sink is not None:
                sink.close()
        stats = d.stats() if d else None
        problems = list(d.problems) if d else []
    if res["errors"]:
        raise TilewiseError(f"{config}/{workload}: " + res["errors"][0])
    lat = [r[3] for r in res["records"]]
    # cores over time, on the clients' clock (0 = "go")
    if d is not None:
        timeline = [[round(r["t"] - t_go, 4), r["n_alloc"], round(r["u"], 2)] for r in recs if "n_alloc" in r and not r.get("event")]
        timeline = [x for x in timeline if -interval <= x[0] <= res["wall_s"] + interval]
    else:
        timeline = [[0.0, pool.n_total, None], [round(res["wall_s"], 4), pool.n_total, None]]
    mean_cores = _time_weighted(timeline, res["wall_s"]) if d is not None else float(pool.n_total)
    per_q: dict[str, list[float]] = {}
    for r in res["records"]:
        per_q.setdefault(str(r[1]), []).append(r[3])
    return {
        "config": config, "workload": workload, "clients": clients, "duration_s": duration,
        "queries_done": len(lat), "wall_s": round(res["wall_s"], 4),
        "throughput_qps": round(len(lat) / res["wall_s"], 4) if res["wall_s"] > 0 else None,
        "latency_ms": _lat(lat),
        "per_query_ms": {q: _lat(v) for q, v in sorted(per_q.items(), key=lambda kv: int(kv[0]))},
        "cpu_s": round(res["cpu_s"], 4), "cpu_s_per_query": round(res["cpu_s"] / len(lat), 5) if lat else None,
        "cores_total": pool.n_total, "cores_mean": round(mean_cores, 3),
        "core_seconds_allocated": round(mean_cores * res["wall_s"], 3),
        "ctx_involuntary": res.get("ctx_involuntary"),
        "load_s": round(ready.get("load_s", 0.0), 3), "duckdb": ready.get("duckdb"),
        "timeline": timeline, "daemon": stats, "problems": problems,
        "enforce": (d.units[0].enforcer.kind if d else "none"),
        "raw": res["records"],
    }


def _lat(xs: list[float]) -> dict:
    """Latency in ms: mean, p50 and p95 (results.stats.percentile)."""
    s = S.summarize([1e3 * x for x in xs], percentiles=(50, 95))
    return S.rounded(s, ("mean", "p50", "p95"), 3)


def _log(path: Path | None, topo, params: dict) -> LineWriter:
    """The daemon's log of this case (kind elastic.log), written as the daemon runs."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return LineWriter(path, model.new("elastic.log", topo=topo, params=params, allocator="system") if path else None)


def _time_weighted(timeline: list, wall: float) -> float:
    if not timeline:
        return 1.0
    total, prev_t, prev_n = 0.0, 0.0, 1
    for t, n, _ in timeline:
        t = min(max(t, 0.0), wall)
        total += prev_n * (t - prev_t)
        prev_t, prev_n = t, n
    total += prev_n * max(0.0, wall - prev_t)
    return total / wall if wall > 0 else float(prev_n)


def tables_for(workload: str, data: Path) -> dict:
    from tilewise.data import table_paths

    paths = table_paths(data)
    if workload == "q6":
        return {"lineitem": str(paths["lineitem"])}
    return {k: str(v) for k, v in paths.items()}


def queries_for(workload: str) -> dict:
    from tilewise.benchmarks.tpch import queries

    if workload == "q6":
        return {6: queries.load(6)}
    return {n: queries.load(n) for n in queries.NUMBERS}


def check_choice(text: str, allowed: tuple, what: str) -> list[str]:
    out = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise UsageError(f"unknown {what} {','.join(bad) or text!r}", f"choose from {','.join(allowed)}")
    return out


__all__ = ["run_case", "CONFIGS", "WORKLOADS"]
