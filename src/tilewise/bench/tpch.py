"""The TPC-H benchmark harness: for each policy, plan -> start the engine bound -> warm-up ->
R timed runs of S concurrent streams -> validate every answer -> write results after each policy.

Drives any engine through the registry (tilewise.engines.get), so `--engine spark` works the same.
Timing: per query, the engine-internal elapsed time (QueryResult.elapsed_s); with several streams,
a run's value for a query is the median over the streams. total_s of a policy is the median over
runs of the wall time of one run (all streams finished), i.e. the throughput measure.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from tilewise import cpulist, launch, topology
from tilewise.bench import queries as Q
from tilewise.data import tpch as tpch_data
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model as M
from tilewise.results import report
from tilewise.results.output import Writer


class WrongAnswer(TilewiseError):
    pass


@dataclass
class Config:
    engine: str = "duckdb"
    sf: float = 1.0
    policies: list[str] = field(default_factory=lambda: ["wim", "wic"])
    streams: int = 1
    runs: int = 3
    out: str | Path = "tpch-results"
    topology_src: str | None = None
    queries: list[int] = field(default_factory=lambda: list(Q.NUMBERS))
    allocator: str = "system"
    data_dir: str | Path | None = None
    smt: bool = False
    mem: str | None = None
    warmup: bool = True
    validate: bool = True
    plots: bool = True
    inject_wrong: tuple[int, ...] = ()  # test hook: corrupt these queries' answers before validation


class Reporter:
    """What the harness tells the user while it runs (the CLI renders it; tests can record it)."""

    def message(self, text: str) -> None: ...
    def start_policy(self, name: str, total_steps: int) -> None: ...
    def step(self, label: str) -> None: ...
    def end_policy(self, name: str) -> None: ...


def parse_policies(text: str | list[str]) -> list[tuple[str, str, int | None]]:
    """"wim,wic,n=4" -> [(label, policy, instances)]; duplicates are an error."""
    items = text if isinstance(text, list) else [p for p in text.split(",")]
    out, seen = [], set()
    for raw in items:
        name = raw.strip().lower()
        if not name:
            continue
        k = None
        if name.startswith("n=") or (name.startswith("n") and name[1:].isdigit()):
            try:
                k = int(name[2:] if name.startswith("n=") else name[1:])
            except ValueError:
                raise UsageError(f"bad policy {raw!r}", "write n=K, e.g. n=4") from None
            pol = "n"
        else:
            pol = name
        if name in seen:
            raise UsageError(f"policy {raw!r} is listed twice", "list each policy once")
        seen.add(name)
        out.append((name, pol, k))
    if not out:
        raise UsageError("no policies given", "use e.g. --policies wim,wic,auto")
    return out


def make_plans(cfg: Config, topo) -> list[tuple[str, object]]:
    from tilewise import plan as planner

    plans = []
    for label, pol, k in parse_policies(cfg.policies):
        try:
            p = planner.plan(topo, pol, instances=k, mem=cfg.mem, smt=cfg.smt)
        except UsageError as e:
            raise UsageError(f"policy {label}: {e.message}", e.hint) from None
        plans.append((label, p))
    return plans


def check_config(cfg: Config):
    """Everything that can be checked before anything is started; returns (engine class, topology, plans)."""
    from tilewise import engines

    cfg.sf = tpch_data.check_sf(cfg.sf)
    if cfg.streams < 1:
        raise UsageError(f"--streams must be >= 1, got {cfg.streams}")
    if cfg.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {cfg.runs}")
    engine_cls = engines.get(cfg.engine)
    from tilewise import allocators

    if cfg.allocator != "system" and not allocators.find_library(cfg.allocator):
        raise UsageError(f"allocator {cfg.allocator!r} is not installed here",
                         "use --allocator system, or install it (make setup)")
    topo = topology.load(cfg.topology_src)
    plans = make_plans(cfg, topo)
    live_fp = topology.load(None).fingerprint() if cfg.topology_src else None
    for _, p in plans:
        launch.ensure_runnable(p, live_fp)
    return engine_cls, topo, plans


def _corrupt(rows: list) -> list:
    """The injected wrong answer: the first numeric value of the first row is off by 1 %; else a row is dropped."""
    rows = [list(r) for r in rows]
    if rows:
        for j, v in enumerate(rows[0]):
            if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
                rows[0][j] = v * (Decimal("1.01") if isinstance(v, Decimal) else 1.01) + 1
                return [tuple(r) for r in rows]
        return [tuple(r) for r in rows[:-1]]
    return [("injected wrong row",)]


def _stream_order(qs: list[int], s: int, streams: int) -> list[int]:
    if streams <= 1 or not qs:
        return list(qs)
    k = (s * len(qs) // streams) % len(qs)
    return qs[k:] + qs[:k]


def run(cfg: Config, reporter: Reporter | None = None, *, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Run the benchmark; returns results.json's document (also written to cfg.out after each policy).
    Raises WrongAnswer after writing everything when any answer was wrong."""
    rep = reporter or Reporter()
    engine_cls, topo, plans = check_config(cfg)
    writer = Writer(cfg.out, plots=cfg.plots)  # a bad --out fails before anything starts
    dataset = tpch_data.dataset(cfg.sf, cfg.data_dir, log=rep.message)
    version = _engine_version(engine_cls)
    if cfg.engine == "duckdb":
        warn = memory_warning(dataset, plans)
        if warn:
            rep.message(warn)
    from tilewise.environment import system_check

    check = system_check(numa_nodes=len(topo.cpu_nodes))
    for w in check["warnings"]:
        rep.message(f"warning: {w}")
    doc = M.new("tpch", topo=topo, engines={cfg.engine: version}, allocator=cfg.allocator, system_check=check, params={
        "engine": cfg.engine, "sf": cfg.sf, "policies": [label for label, _ in plans],
        "queries": list(cfg.queries), "streams": cfg.streams, "runs": cfg.runs, "warmup": cfg.warmup,
        "allocator": cfg.allocator, "mem": cfg.mem, "smt": cfg.smt, "dataset": dataset.to_json(),
    })
    doc.update({
        "validation": {"reference": None, "float_rel_tol": 1e-9, "rules": _validation_rules(), "enabled": cfg.validate},
        "policies": {},
        "summary": {},
    })
    ref = None
    if cfg.validate:
        from tilewise.bench import validate

        ref = validate.Reference(dataset)
        doc["validation"]["reference"] = f"datafusion {ref.version}"
        rep.message(f"reference answers: DataFusion {ref.version} (cached in {ref.cache_dir})")
        ref.prepare(cfg.queries)
    writer.write(doc)
    wrong: list[str] = []
    for label, p in plans:
        rec = {"policy": p.policy, "requested": p.requested, "reasons": list(p.reasons), "instances": [],
               "queries": {}, "run_wall_s": [], "complete": False}
        doc["policies"][label] = rec
        steps = (int(cfg.warmup) + cfg.runs) * cfg.streams * len(cfg.queries)
        rep.start_policy(label, steps)
        engine = engine_cls()
        try:
            rep.message(f"{label}: starting {len(p.instances)} {cfg.engine} instance(s) "
                        f"({', '.join(cpulist.format(i.cpus) for i in p.instances[:8])}"
                        f"{', ...' if len(p.instances) > 8 else ''})")
            t0 = clock()
            engine.start(p, dataset=dataset, allocator=cfg.allocator)
            rec["start_s"] = clock() - t0
            rec["instances"] = _instances(engine, p)
            bad = [i for i in rec["instances"] if i.get("binding_verified") is False]
            if bad:
                raise TilewiseError(f"{label}: binding of instance {bad[0]['id']} not applied: {bad[0].get('detail')}")
            for i in rec["instances"]:
                if i.get("binding_verified") is None:
                    rep.message(f"{label}: binding of instance {i['id']} not checkable: {i.get('detail')}")
            per_query: dict[int, list[float]] = {n: [] for n in cfg.queries}
            rows_of: dict[int, int] = {}
            valid: dict[int, bool] = {n: True for n in cfg.queries}
            detail: dict[int, str] = {}
            for r in range(int(cfg.warmup) + cfg.runs):
                timed = r >= int(cfg.warmup)
                wall, results = _one_run(engine, cfg, rep, clock, "warm-up" if not timed else f"run {r + 1 - int(cfg.warmup)}")
                for n, res_list in results.items():
                    for res in res_list:
                        rows = _corrupt(res.rows) if n in cfg.inject_wrong else res.rows
                        rows_of[n] = len(rows)
                        if ref is not None:
                            chk = ref.check(n, rows)
                            if not chk.ok:
                                valid[n] = False
                                if n not in detail:  # loud, at once, not only in the final table
                                    detail[n] = chk.detail
                                    rep.message(f"WRONG ANSWER: {label} q{n} (instance {res.instance}): {chk.detail}")
                    if timed:
                        per_query[n].append(statistics.median(x.elapsed_s for x in res_list))
                if timed:
                    rec["run_wall_s"].append(wall)
            for n in cfg.queries:
                st = report.query_stats(per_query[n])
                q = {"times_s": per_query[n], "rows": rows_of.get(n), "valid": valid[n] if ref else None, **st}
                if n in detail:
                    q["error"] = detail[n]
                    wrong.append(f"{label}/q{n}: {detail[n]}")
                rec["queries"][f"q{n}"] = q
            rec["complete"] = True
        except BaseException as e:
            rec["error"] = (str(e) or type(e).__name__) if isinstance(e, Exception) else "interrupted"
            raise
        finally:
            engine.stop()
            rep.end_policy(label)
            M.finish(doc, complete=False)
            writer.write(doc)
    doc["validation"]["wrong_answers"] = wrong
    M.finish(doc, complete=True)
    writer.write(doc)
    if wrong:
        raise WrongAnswer(f"WRONG ANSWER in {len(wrong)} result(s): {wrong[0]}"
                          + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""),
                          f"see {writer.json_path}")
    return doc


def _validation_rules() -> str:
    from tilewise.bench.validate import RULES

    return RULES


def _engine_version(engine_cls) -> str:
    """An engine module's engine_version(), else a class attribute `version`, else "unknown"."""
    import importlib

    mod = importlib.import_module(engine_cls.__module__)
    fn = getattr(mod, "engine_version", None)
    try:
        if fn:
            return str(fn())
    except Exception:
        pass
    v = getattr(engine_cls, "version", None)
    return v if isinstance(v, str) else "unknown"


def memory_warning(dataset, plans) -> str | None:
    """Each DuckDB instance holds its own copy of the tables: warn when the copies may not fit."""
    try:
        parquet = dataset.parquet_bytes()
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    worst_label, worst = max(((label, len(p.instances)) for label, p in plans), key=lambda x: x[1])
    need = int(parquet * 3 * worst)  # in memory, the tables take roughly 3x their Parquet size
    if need > avail:
        return (f"warning: {worst_label} starts {worst} instances, each loading its own copy of the tables "
                f"(about {need / 2**30:.1f} GiB in all) but only {avail / 2**30:.1f} GiB is available; "
                "use a smaller --sf or fewer instances if it runs out of memory")
    return None


VERDICT = {True: "verified", False: "mismatch", None: "not checkable"}


def _instances(engine, p) -> list[dict]:
    out = []
    try:
        statuses = {s.id: s for s in engine.status()}
        failed = ""
    except Exception as e:  # noqa: BLE001 - recorded as "not checkable", never skipped silently
        statuses, failed = {}, f"the engine's status call failed: {str(e) or type(e).__name__}"
    load_s = getattr(engine, "load_s", {}) or {}
    for inst in p.instances:
        d = {"id": inst.id, "cpus": list(inst.cpus), "mem_nodes": list(inst.mem_nodes), "mem_policy": inst.mem_policy,
             "numa_nodes": list(inst.numa_nodes), "l3_domains": list(inst.l3_domains)}
        s = statuses.get(inst.id)
        if s is not None:
            d.update({"pid": s.pid, "binding_verified": s.binding_verified, "healthy": s.healthy,
                      "verification": VERDICT[s.binding_verified]})
            if s.detail:
                d["detail"] = s.detail
        else:
            d.update({"binding_verified": None, "verification": VERDICT[None],
                      "detail": failed or "the engine reported no status for this instance"})
        if inst.id in load_s:
            d["load_s"] = load_s[inst.id]
        info = getattr(engine, "info", None)
        if info is not None:
            try:
                d["threads"] = info(inst.id).get("threads")
            except Exception:
                pass
        out.append(d)
    return out


def _one_run(engine, cfg: Config, rep: Reporter, clock, label: str):
    """One pass: every stream runs every selected query once. Returns (wall seconds, {n: [QueryResult]})."""
    results: dict[int, list] = {n: [] for n in cfg.queries}
    lock = threading.Lock()

    def stream(s: int) -> None:
        for n in _stream_order(cfg.queries, s, cfg.streams):
            res = engine.run_query(Q.load(n))
            with lock:
                results[n].append(res)
            rep.step(f"{label}, q{n}")

    t0 = clock()
    if cfg.streams == 1:
        stream(0)
    else:
        pool = ThreadPoolExecutor(max_workers=cfg.streams, thread_name_prefix="tpch-stream")
        try:
            futures = [pool.submit(stream, s) for s in range(cfg.streams)]
            for f in futures:
                f.result()
        except BaseException:
            engine.stop()  # unblocks the other streams (their instances are gone)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return clock() - t0, results
