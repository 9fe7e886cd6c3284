"""`tilewise bench elastic`: N clients on one engine process (DuckDB by default), with and without
the elastic allocator; ``run(config, reporter) -> results document``.

Cases: ``os`` (no allocator: every allowed core, the OS schedules) and one per allocation mode
(dense, sparse, adaptive), each for each workload: ``q6`` (every client runs TPC-H Q6 in a loop)
and ``mixed`` (every client runs a random one of the 22 queries in a loop, seeded). For each case:
throughput, latency, CPU-seconds the DBMS process used, cores allocated over time (the daemon's
log, also written to logs/<case>.jsonl for `tilewise elastic --replay`), and the daemon's own cost.

The DBMS process is the engine's own runtime (the one `bench tpch` and `up` use): one instance
holding the workload's tables, started on every allowed CPU; the clients are threads of tilewise
sending queries to it, so its CPU time is the engine's, and the elastic daemon manages exactly that
process. Latency is the engine's own time per query (execute + fetch, as the runtime reports it).
Any engine whose instances are replicas (one process each) can be the DBMS.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tilewise import engines, topology
from tilewise import plan as planner
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.benchmarks.tpch import queries as tpch_queries
from tilewise.data import table_paths
from tilewise.elastic import daemon, enforce, modes, petri
from tilewise.engines.contract import EngineSpec, Query
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results import stats as S
from tilewise.results.kinds import elastic_log
from tilewise.results.output import LineWriter, Writer

CONFIGS = ("os", "dense", "sparse", "adaptive")
WORKLOADS = ("q6", "mixed")


@dataclass(frozen=True)
class Tables:
    """The tables a workload needs (the engine loads only those), as the runtime reads a data set."""

    dir: Path
    tables: dict[str, Path]

    @property
    def label(self) -> str:
        return f"{', '.join(self.tables)} from {self.dir}"

    def to_json(self) -> dict:
        return {"dir": str(self.dir), "tables": sorted(self.tables)}


def _clients(runtime, queries: dict[int, str], clients: int, duration: float, seed: int) -> dict:
    """N client threads, each looping over its queries on instance 0 until the duration is over."""
    stop_at = time.perf_counter() + duration
    records: list[list] = []
    errors: list[str] = []
    lock = threading.Lock()
    base = time.perf_counter()

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        nums = sorted(queries)
        mine = []
        try:
            while time.perf_counter() < stop_at:
                q = nums[0] if len(nums) == 1 else rng.choice(nums)
                s = time.perf_counter()
                r = runtime.run_query(queries[q], instance=0)
                mine.append([i, q, round(s - base, 6), round(r.elapsed_s, 6)])
        except Exception as ex:  # noqa: BLE001 - reported to the harness, not swallowed
            with lock:
                errors.append(f"client {i}: {type(ex).__name__}: {ex}")
        with lock:
            records.extend(mine)

    before = runtime.info(0)
    w0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), name=f"client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - w0
    after = runtime.info(0)
    cpu = (after.get("cpu_s") or 0.0) - (before.get("cpu_s") or 0.0)
    ctx = after.get("ctx_involuntary")
    return {"records": records, "wall_s": wall, "cpu_s": cpu, "errors": errors,
            "ctx_involuntary": None if ctx is None else ctx - (before.get("ctx_involuntary") or 0)}


def run_case(*, config: str, workload: str, tables: dict, queries: dict, clients: int, duration: float,
             interval: float, topo, th_min: float, th_max: float, threads: int, log_path: Path | None,
             seed: int = 1, spec: EngineSpec | None = None) -> dict:
    spec = spec or engines.get(engines.DEFAULT_BENCH)  # threads: the engine's, = the CPUs it starts on
    if not spec.capabilities.replicas:
        raise UsageError(f"bench elastic manages one engine process; {spec.name}'s workers cooperate across several",
                         "use an engine whose instances are replicas (tilewise engines list)")
    data = Tables(Path(next(iter(tables.values()))).parent, {k: Path(v) for k, v in tables.items()})
    texts = {n: spec.sql(sql, Query("tpch", n, 0, f"q{int(n):02d}")) for n, sql in queries.items()}
    whole = planner.plan(topo, "wim", smt=True)  # one instance on every allowed CPU (the allocator trims it)
    recs: list[dict] = []
    d = None
    th = None
    sink = None
    res = None  # the clients' results: None while they run (the log then ends interrupted)
    runtime = spec.runtime_class()()
    try:
        runtime.start(whole, dataset=data)
        ready = runtime.info(0)
        pid = runtime.status()[0].pid
        allowed = tuple(sorted(os.sched_getaffinity(pid)))
        pool = modes.make_pool(topo, allowed)
        try:
            if config != "os":
                target = daemon.PidTarget(pid)
                unit = daemon.Unit(f"{config}-{workload}", pool, petri.NetConfig(th_min, th_max, pool.n_total), config, target)
                unit.enforcer = enforce.choose("auto", pid, None)
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
            res = _clients(runtime, texts, clients, duration, seed)
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
    finally:
        runtime.stop()
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
        "load_s": round(ready.get("load_s") or 0.0, 3), spec.name: spec.version(),
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
    paths = table_paths(data)
    if workload == "q6":
        return {"lineitem": str(paths["lineitem"])}
    return {k: str(v) for k, v in paths.items()}


def queries_for(workload: str) -> dict:
    if workload == "q6":
        return {6: tpch_queries.load(6)}
    return {n: tpch_queries.load(n) for n in tpch_queries.NUMBERS}


def check_choice(text: str, allowed: tuple, what: str) -> list[str]:
    out = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise UsageError(f"unknown {what} {','.join(bad) or text!r}", f"choose from {','.join(allowed)}")
    return out


# ---- the use case: `tilewise bench elastic` ---------------------------------------------------

@dataclass
class Config:
    engine: str = engines.DEFAULT_BENCH  # an engine whose instances are replicas (one process each)
    sf: str | float = "0.1"  # TPC-H scale factor
    clients: int = 4
    duration: float = 10.0  # seconds each case runs its clients
    workloads: str = ",".join(WORKLOADS)
    configs: str = ",".join(CONFIGS)
    interval: float = 0.1  # the daemon's tick
    th_min: float = 10.0
    th_max: float = 70.0
    data_dir: str | None = None
    out: str | Path = "results/elastic"  # results.json, elastic.png, logs/<case>.jsonl
    seed: int = 1
    plots: bool = True
    topology_src: str | None = None  # must be this machine's


class Reporter:
    def message(self, text: str) -> None: ...  # progress lines


def notes(t) -> list[str]:
    """What this machine can and cannot show of the allocator's effect."""
    out = []
    if len(t.cpu_nodes) < 2:
        out.append("one NUMA node: dense, sparse and adaptive choose the same cores here; only the elastic "
                   "sizing (how many cores) differs from os, not where they are")
    if len(t.usable_cores()) <= 2:
        out.append(f"{len(t.usable_cores())} cores: the allocator can only move between 1 and "
                   f"{len(t.usable_cores())} cores; the paper's gains (locality over 16+ cores, 4 sockets) cannot show")
    out.append("no hardware counters here: L3 misses, interconnect traffic and remote/local ratios are not measured")
    return out


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """Every workload x config case; returns the elastic results document, rewritten in cfg.out
    after each case (a late failure loses nothing) and marked stopped when interrupted."""
    rep = reporter or Reporter()
    if cfg.th_min >= cfg.th_max:
        raise UsageError(f"--th-min must be below --th-max (got {cfg.th_min:g}, {cfg.th_max:g})")
    spec = engines.get(cfg.engine)
    why = spec.missing()
    if why:
        raise UsageError(f"{spec.title} cannot run here: {why}")
    wl = check_choice(cfg.workloads, WORKLOADS, "workload")
    cf = check_choice(cfg.configs, CONFIGS, "config")
    sf = tpch_data.check_sf(cfg.sf)
    t = topology.load(cfg.topology_src)
    if not topology.is_live(t):
        raise UsageError("bench elastic runs processes: it needs this machine's topology", "drop --topology")
    writer = Writer(cfg.out, plots=False)
    data = tpch_data.ensure_data(sf, cfg.data_dir)
    threads = len(os.sched_getaffinity(0))
    params = {"engine": spec.name, "sf": sf, "clients": cfg.clients, "duration_s": cfg.duration,
              "interval_s": cfg.interval, "th_min": cfg.th_min, "th_max": cfg.th_max, "duckdb_threads": threads,
              "seed": cfg.seed, "workloads": wl, "configs": cf}
    doc = model.new("elastic", topo=t, engines={spec.name: spec.version()}, allocator="system",
                    system_check=system_check(numa_nodes=len(t.cpu_nodes)), params=params)
    doc.update({"notes": notes(t), "cases": []})
    try:
        for w in wl:
            tables, queries = tables_for(w, data), queries_for(w)
            for c in cf:
                rep.message(f"{w} / {c}: {cfg.clients} clients for {cfg.duration:g} s ...")
                case = run_case(config=c, workload=w, tables=tables, queries=queries, clients=cfg.clients,
                                duration=cfg.duration, interval=cfg.interval, topo=t, th_min=cfg.th_min,
                                th_max=cfg.th_max, threads=threads, log_path=writer.dir / "logs" / f"{w}-{c}.jsonl",
                                seed=cfg.seed, spec=spec)
                doc["cases"].append(case)
                writer.write(doc)  # a late failure loses nothing
    except BaseException as e:
        model.stopped(doc, e)
        writer.write(doc)
        raise
    model.finish(doc, complete=True)
    writer.write(doc, plots=cfg.plots)
    return doc


__all__ = ["run", "run_case", "CONFIGS", "WORKLOADS"]
