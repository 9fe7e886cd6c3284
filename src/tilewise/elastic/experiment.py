"""`tilewise bench elastic`: N clients on one engine instance (DuckDB by default; PostgreSQL's
server and any replica engine the same way), with and without the elastic allocator, as a use
case: ``run(config, reporter) -> results document``.

Cases: ``os`` (static: no allocator, every allowed core, the OS schedules) and one per allocation
mode (dense, sparse, adaptive), each for each workload: ``q6`` (every client runs query 6 of the
benchmark, TPC-H's Q6 by default, in a loop) and ``mixed`` (every client runs a random one of the
queries in a loop, seeded; paper 002's mixed-phases TPC-H throughput load; ``--queries`` narrows
the set). ``--benchmark`` picks any registered benchmark's data and queries.

The DBMS is the engine's own runtime (the one `bench tpch` and `up` use): one instance holding the
workload's tables, started on every allowed CPU. Its instance is a process tree rooted at the pid
the runtime reports (the engine contract: a DuckDB server is one process; a PostgreSQL server is a
postmaster with a backend per connection and parallel workers forked per query); the elastic
daemon manages that whole tree, processes born during the run included (within a tick: see
daemon.PidTarget). The clients are threads of tilewise sending queries to it, so the tree's CPU
time is the engine's (metrics.tree_cpu_seconds: every live process's time and that of the children
it reaped). Latency is the engine's own time per query (QueryResult.elapsed_s).

Each case is a load step: the daemon starts (at one core), ``idle`` seconds pass without a query,
the clients run for ``duration`` seconds (the step up), then ``idle`` seconds pass again (the step
down). Measured: throughput, latency, CPU-seconds, allocated and used cores over time (the daemon's
log; under ``os`` a dry-run daemon measures the same without changing anything), core-seconds, and
the reaction to each step: ticks (and seconds) from the step to the first core allocated, resp.
released. The daemon's log of each case is written to logs/<workload>-<config>.jsonl.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tilewise import benchmarks, engines, topology
from tilewise import plan as planner
from tilewise.elastic import daemon, enforce, modes, petri
from tilewise.elastic.metrics import tree_cpu_seconds
from tilewise.engines.contract import EngineSpec, Query
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results import stats as S
from tilewise.results.kinds import elastic_log
from tilewise.results.output import LineWriter, Writer

CONFIGS = ("os", "dense", "sparse", "adaptive")
WORKLOADS = ("q6", "mixed")


@dataclass
class Config:
    engine: str = engines.DEFAULT_BENCH
    benchmark: str = "tpch"  # whose data and queries (tilewise.benchmarks)
    sf: str | float = "0.1"
    clients: int = 4
    duration: float = 10.0
    workloads: str = "q6,mixed"
    configs: str = "os,dense,sparse,adaptive"
    queries: str | None = None  # mixed: which queries (default all)
    interval: float = 0.1
    th_min: float = 10.0
    th_max: float = 70.0
    idle: float = 1.0  # seconds without load before and after the clients (the steps)
    data_dir: str | None = None
    out: str | Path = "results/elastic"  # results.json, elastic.png, logs/<case>.jsonl
    seed: int = 1
    plots: bool = True
    topology_src: str | None = None


class Reporter:
    def message(self, text: str) -> None: ...  # progress lines


def _clients(runtime, queries: dict[int, str], clients: int, duration: float, seed: int, root: int) -> dict:
    """N client threads, each looping over its queries on instance 0 until the duration is over."""
    stop_at = time.perf_counter() + duration
    records: list[list] = []
    errors: list[str] = []
    lock = threading.Lock()
    base = time.perf_counter()

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        nums = list(queries)  # the catalog's order
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
    cpu0 = tree_cpu_seconds(root)
    w0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), name=f"client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - w0
    cpu1 = tree_cpu_seconds(root)
    after = runtime.info(0)
    ctx = after.get("ctx_involuntary")
    return {"records": records, "wall_s": wall, "cpu_s": (cpu1 or 0.0) - (cpu0 or 0.0), "errors": errors,
            "ctx_involuntary": None if ctx is None else ctx - (before.get("ctx_involuntary") or 0)}


def check_engine(spec: EngineSpec) -> None:
    if not spec.capabilities.replicas:
        raise UsageError(f"bench elastic manages one engine instance; {spec.name}'s workers cooperate across several",
                         "use an engine whose instances are replicas (tilewise engines list)")


def run_case(*, config: str, workload: str, data, queries: dict, clients: int, duration: float,
             interval: float, topo, th_min: float, th_max: float, log_path: Path | None, seed: int = 1,
             spec: EngineSpec | None = None, idle: float = 0.0, bench=None) -> dict:
    """One case on `data` (the benchmark's Dataset: the engine loads all of it, as paper 002's
    database held the whole TPC-H set for its Q6 runs too); bench: whose queries (default TPC-H)."""
    spec = spec or engines.get(engines.DEFAULT_BENCH)
    bench = bench or benchmarks.get(data.benchmark if data is not None else "tpch")
    check_engine(spec)
    cat = bench.catalog
    texts = {n: spec.sql(sql, Query(bench.name, n, 0, cat.ref_key(n), cat.divisions(n))) for n, sql in queries.items()}
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
        target = daemon.PidTarget(pid)
        dry = config == "os"  # static: every core; a dry-run daemon measures the cores used
        unit = daemon.Unit(f"{config}-{workload}", pool, petri.NetConfig(th_min, th_max, pool.n_total),
                           "dense" if dry else config, target)
        if not dry:
            unit.enforcer = enforce.choose("auto", pid, None, tree_pids=set(target.tasks().values()))
        try:
            sink = _log(log_path, topo, {"target": [unit.name], "mode": "static (dry run)" if dry else config,
                                         "workload": workload, "clients": clients, "duration": duration,
                                         "interval": interval, "th_min": th_min, "th_max": th_max, "dry_run": dry,
                                         "enforce": "none" if dry else "auto", "engine": spec.name})

            def log(rec: dict) -> None:
                recs.append(rec)
                sink.write(rec)

            d = daemon.Daemon([unit], interval=interval, log=log, dry_run=dry)
            d.start()
            th = threading.Thread(target=d.run, name="elastic", daemon=True)
            th.start()
            time.sleep(idle)  # the step up comes after an idle phase: the daemon sits at one core
            t_go = time.monotonic() - d.t0
            res = _clients(runtime, texts, clients, duration, seed, pid)
            t_stop = time.monotonic() - d.t0
            time.sleep(idle)  # the step down: the daemon gives the cores back
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
        stats = d.stats()
        problems = list(d.problems)
    finally:
        runtime.stop()
    if res["errors"]:
        raise TilewiseError(f"{config}/{workload}: " + res["errors"][0])
    lat = [r[3] for r in res["records"]]
    ticks = [r for r in recs if "n_alloc" in r and not r.get("event")]
    # cores over time, on the clients' clock (0 = the step up): [t, allocated, load %, used]; used: the
    # tree's CPU seconds per second since the previous tick (what ended meanwhile included)
    timeline = []
    prev = None
    for r in ticks:
        used = None
        if prev is not None and r.get("cpu_s") is not None and prev.get("cpu_s") is not None and r["t"] > prev["t"]:
            used = round(max(0.0, r["cpu_s"] - prev["cpu_s"]) / (r["t"] - prev["t"]), 3)
        timeline.append([round(r["t"] - t_go, 4), pool.n_total if dry else r["n_alloc"],
                         None if dry else round(r["u"], 2), used])
        prev = r
    in_run = [x for x in timeline if -interval <= x[0] <= res["wall_s"] + interval]
    mean_cores = float(pool.n_total) if dry else _time_weighted(in_run, res["wall_s"])
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
        "cores_used_mean": round(res["cpu_s"] / res["wall_s"], 3) if res["wall_s"] > 0 else None,
        "reaction": None if dry else reaction(ticks, t_go, t_stop, interval),
        "idle_s": idle, "processes_max": _processes_max(ticks),
        "ctx_involuntary": res.get("ctx_involuntary"),
        "load_s": round(ready.get("load_s") or 0.0, 3), "engine": spec.name, spec.name: spec.version(),
        "timeline": timeline, "daemon": stats, "problems": problems,
        "enforce": "none (static)" if dry else unit.enforcer.kind,
        "raw": res["records"],
    }


def reaction(ticks: list[dict], t_up: float, t_down: float, interval: float) -> dict:
    """Ticks (and seconds) from each load step to the controller's answer: the first core allocated
    after the step up (at t_up), the first released after the step down (t_down), counting the
    ticks that fall after the step (1 = the very next tick answered). None where it did not answer
    (the load never crossed a threshold, or a single core was all it ever had)."""
    def first(after: float, until: float | None, action: str) -> dict | None:
        n = 0
        for r in ticks:
            if r["t"] <= after:
                continue
            if until is not None and r["t"] > until:
                return None
            n += 1
            if r.get("action") == action:
                return {"ticks": n, "s": round(r["t"] - after, 4)}
        return None

    return {"up": first(t_up, t_down, "allocate"), "down": first(t_down, None, "release"), "interval_s": interval}


def _processes_max(ticks: list[dict]) -> int | None:
    return max((r.get("processes") for r in ticks if r.get("processes") is not None), default=None)


def _lat(xs: list[float]) -> dict:
    """Latency in ms: mean, p50 and p95 (results.stats.percentile)."""
    s = S.summarize([1e3 * x for x in xs], percentiles=(50, 95))
    return S.rounded(s, ("mean", "p50", "p95"), 3)


def _log(path: Path | None, topo, params: dict) -> LineWriter:
    """The daemon's log of this case (kind elastic.log), written as the daemon runs."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return LineWriter(path, model.new("elastic.log", topo=topo, params=params, allocator="system") if path else None)


def _time_weighted(timeline: list, wall: float, first: float = 1.0) -> float:
    """The mean of a step function [t, value, ...] over [0, wall] (before its first point: `first`)."""
    if not timeline:
        return first
    total, prev_t, prev_n = 0.0, 0.0, first
    for t, n, *_ in timeline:
        t = min(max(t, 0.0), wall)
        total += prev_n * (t - prev_t)
        prev_t, prev_n = t, n
    total += prev_n * max(0.0, wall - prev_t)
    return total / wall if wall > 0 else float(prev_n)


def queries_for(workload: str, selection: str | None = None, bench=None) -> dict:
    """{query id: text} of a workload in the benchmark's catalog (default TPC-H): q6 is its query 6
    (every part of it where it has parts), mixed the selection (default all), in catalog order."""
    cat = (bench or benchmarks.get("tpch")).catalog
    ids = cat.parse("6" if workload == "q6" else selection)
    return {n: cat.text(n) for n in ids}


def check_choice(text: str, allowed: tuple, what: str) -> list[str]:
    out = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise UsageError(f"unknown {what} {','.join(bad) or text!r}", f"choose from {','.join(allowed)}")
    return out


def notes(t) -> list[str]:
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
    """Every workload x configuration; returns the elastic results document, rewritten in cfg.out
    after each case (a late failure loses nothing) and marked stopped when interrupted."""
    rep = reporter or Reporter()
    if cfg.th_min >= cfg.th_max:
        raise UsageError(f"--th-min must be below --th-max (got {cfg.th_min:g}, {cfg.th_max:g})")
    spec = engines.get(cfg.engine)
    check_engine(spec)
    spec.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = spec.missing()
    if why:
        raise UsageError(f"{spec.title} cannot run here: {why}")
    wl = check_choice(cfg.workloads, WORKLOADS, "workload")
    cf = check_choice(cfg.configs, CONFIGS, "config")
    if cfg.queries is not None and "mixed" not in wl:
        raise UsageError("--queries chooses the mixed workload's queries", "add --workloads mixed, or drop --queries")
    bench = benchmarks.get(cfg.benchmark)
    query_sets = {w: queries_for(w, cfg.queries, bench) for w in wl}  # a bad --queries fails before anything starts
    sf = bench.data.check_sf(cfg.sf)
    t = topology.load(cfg.topology_src)
    if not topology.is_live(t):
        raise UsageError("bench elastic runs processes: it needs this machine's topology", "drop --topology")
    writer = Writer(cfg.out, plots=False)
    out = writer.dir
    data = bench.data.dataset(sf, cfg.data_dir, log=rep.message)
    params = {"engine": spec.name, "benchmark": bench.name, "sf": sf, "clients": cfg.clients, "duration_s": cfg.duration,
              "interval_s": cfg.interval, "th_min": cfg.th_min, "th_max": cfg.th_max, "idle_s": cfg.idle,
              "threads": len(os.sched_getaffinity(0)), "seed": cfg.seed, "workloads": wl, "configs": cf,
              "queries": list(query_sets.get("mixed", {})) or None}
    doc = model.new("elastic", topo=t, engines={spec.name: spec.version()}, allocator="system",
                    system_check=system_check(numa_nodes=len(t.cpu_nodes)), params=params)
    doc.update({"notes": notes(t), "cases": []})
    try:
        for w in wl:
            for c in cf:
                rep.message(f"{w} / {c}: {cfg.idle:g} s idle, {cfg.clients} clients for {cfg.duration:g} s, "
                            f"{cfg.idle:g} s idle ...")
                case = run_case(config=c, workload=w, data=data, queries=query_sets[w], clients=cfg.clients,
                                duration=cfg.duration, interval=cfg.interval, topo=t, th_min=cfg.th_min,
                                th_max=cfg.th_max, log_path=out / "logs" / f"{w}-{c}.jsonl", seed=cfg.seed, spec=spec,
                                idle=cfg.idle, bench=bench)
                doc["cases"].append(case)
                writer.write(doc)  # a late failure loses nothing
    except BaseException as e:
        model.stopped(doc, e)
        writer.write(doc)
        raise
    model.finish(doc, complete=True)
    doc["files"] = {"json": str(writer.json_path), "logs": str(out / "logs")}
    writer.write(doc, plots=cfg.plots)
    return doc


__all__ = ["run", "run_case", "Config", "CONFIGS", "WORKLOADS"]
