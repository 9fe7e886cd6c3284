"""The TPC-H benchmark harness: for each policy, plan -> start the engine bound -> warm-up run ->
R timed runs -> validate every answer -> write results after each run.

A run is the specification's pair of tests (TPC-H 5.3):

- the **power test**: one stream; RF1, the queries in stream 00's order (Appendix A), RF2. Its
  query times are the per-query figures of the tables; they give Power@Size.
- the **throughput test**: S query streams at once, stream s running the queries in the order of
  row s of Appendix A, plus one refresh stream applying S pairs of RF1/RF2; its measurement
  interval Ts (first stream started to last stream, query or refresh, done) is the run's total
  time and gives Throughput@Size.

QphH@Size is the geometric mean of the two. The refresh functions run where the engine can write
(Engine.supports_refresh; DuckDB applies them to every replica); elsewhere the results say
"without refresh functions". Every answer is checked against a reference computed on exactly the
data state the query saw (see `States`); after a run, the refresh functions are undone (outside
the timed region) so every run and every policy starts from the loaded data and measures the same
work. Drives any engine through the registry (tilewise.engines.get).
"""

from __future__ import annotations

import math
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
from tilewise.data import dataset_for
from tilewise.data import refresh as RF
from tilewise.data import tpch as tpch_data
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model as M
from tilewise.results import stats
from tilewise.results.output import Writer

TESTS = ("power", "throughput")
# TPC-H 5.3.4: the minimum number of query streams of the throughput test per scale factor
SPEC_MIN_STREAMS = ((100000, 11), (30000, 10), (10000, 9), (3000, 8), (1000, 7), (300, 6), (100, 5), (30, 4),
                    (10, 3), (1, 2))


class WrongAnswer(TilewiseError):
    pass


@dataclass
class Config:
    engine: str = "duckdb"
    sf: float = 1.0
    policies: list[str] | str = field(default_factory=lambda: ["wim", "wic"])
    streams: int | None = None  # None: the TPC-H minimum for the SF, and >= instances on replica engines
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
    tests: tuple[str, ...] = TESTS
    refresh: bool | None = None  # None: where the engine can write
    benchmark: str = "tpch"  # "tpch" | "jcch" (JCC-H: skewed data and parameters)
    params: str | None = None  # JCC-H: "skewed" (default) | "normal" query parameters
    seed: int = 0  # JCC-H: seed of the query parameters (each stream draws its own from it)
    data_seed: int = 0  # JCC-H: seed of the data generator
    inject_wrong: tuple[int, ...] = ()  # test hook: corrupt these queries' answers before validation
    worker_memory: str | None = None  # JVM engines (spark, trino): memory per worker, e.g. 2g


class Reporter:
    """What the harness tells the user while it runs (the CLI renders it; tests can record it)."""

    def message(self, text: str) -> None: ...
    def start_policy(self, name: str, total_steps: int) -> None: ...
    def step(self, label: str) -> None: ...
    def end_policy(self, name: str) -> None: ...


# ---- decisions (pure) ---------------------------------------------------------------------------

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


def parse_tests(text: str | tuple | list) -> tuple[str, ...]:
    items = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [t for t in items if t not in TESTS]
    if bad or not items:
        raise UsageError(f"unknown test {', '.join(bad) or '(none)'}", "use --tests power, throughput or power,throughput")
    return tuple(t for t in TESTS if t in items)


def spec_min_streams(sf: float) -> int:
    for size, n in SPEC_MIN_STREAMS:
        if sf >= size:
            return n
    return 2


def default_streams(sf: float, replicas: bool, plans) -> int:
    """The TPC-H minimum for the scale factor; on a replica engine at least one stream per
    instance of the largest deployment (fewer streams than instances measures idle cores)."""
    n = spec_min_streams(sf)
    if replicas:
        n = max([n] + [len(p.instances) for _, p in plans])
    return n


def deployment_key(p) -> tuple:
    """Two plans with the same key deploy the same: the same instances on the same CPUs with their
    memory on the same nodes. A memory policy only matters when it can choose between nodes:
    membind, interleave or preferred to one node, and first-touch or local on CPUs of one node,
    all place every page on that node (on a one-node machine win, wicp and auto are wim)."""
    def mem(i):
        nodes = tuple(sorted(i.mem_nodes if i.mem_policy in ("membind", "interleave", "preferred") else
                             (i.numa_nodes or i.mem_nodes)))
        if len(nodes) == 1:
            return ("node", nodes)
        return ("first-touch" if i.mem_policy == "local" else i.mem_policy, nodes)
    return tuple(sorted((tuple(sorted(i.cpus)), mem(i)) for i in p.instances))


def idle_warning(label: str, instances: int, streams: int, replicas: bool) -> str | None:
    """On a replica engine every query runs on one instance: fewer streams than instances leaves
    instances without work, and a throughput comparison then measures idle cores."""
    if not replicas or streams >= instances:
        return None
    return (f"{label} has {instances} instances but the throughput test runs {streams} stream(s): "
            f"{instances - streams} instance(s) stay idle, so the comparison measures idle cores; use --streams "
            f"{instances} or more")


def power_at_size(sf: float, query_s: list[float], refresh_s: list[float]) -> float | None:
    """TPC-H 5.4.1: 3600 x SF / the geometric mean of the power test's query and refresh timing
    intervals. Intervals shorter than the longest / 1000 count as the longest / 1000."""
    xs = [x for x in list(query_s) + list(refresh_s) if x is not None]
    if not xs or not all(x > 0 for x in xs):
        return None
    floor = max(xs) / 1000.0
    xs = [max(x, floor) for x in xs]
    return 3600.0 * sf / math.exp(sum(math.log(x) for x in xs) / len(xs))


def throughput_at_size(sf: float, streams: int, queries_per_stream: int, interval_s: float) -> float | None:
    """TPC-H 5.4.2: S x 22 x 3600 / Ts x SF (with the queries actually run per stream)."""
    if not interval_s or interval_s <= 0:
        return None
    return streams * queries_per_stream * 3600.0 / interval_s * sf


def qphh_at_size(power: float | None, throughput: float | None) -> float | None:
    if not power or not throughput:
        return None
    return math.sqrt(power * throughput)


# ---- checks before anything starts ------------------------------------------------------------

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
    from tilewise import allocators, engines

    cfg.sf = _data_module(cfg).check_sf(cfg.sf)
    Q.QuerySet(cfg.benchmark, cfg.params, seed=cfg.seed, sf=cfg.sf)  # benchmark, --params
    if cfg.benchmark == "jcch":
        from tilewise.data import jcch

        cfg.seed, cfg.data_seed = jcch.check_seed(cfg.seed), jcch.check_seed(cfg.data_seed)
    if cfg.streams is not None and cfg.streams < 1:
        raise UsageError(f"--streams must be >= 1, got {cfg.streams}")
    if cfg.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {cfg.runs}")
    cfg.tests = parse_tests(cfg.tests)
    if cfg.worker_memory:
        if cfg.engine not in ("spark", "trino"):
            raise UsageError(f"--worker-memory sizes JVM workers; {cfg.engine} has none", "drop it")
        from tilewise.engines.procgroup import parse_size_mb

        parse_size_mb(cfg.worker_memory)
    engine_cls = engines.get(cfg.engine)
    if cfg.refresh and not getattr(engine_cls, "supports_refresh", False):
        raise UsageError(f"the {cfg.engine} engine cannot apply the refresh functions (it does not write its tables)",
                         "drop --refresh; the results then say 'without refresh functions'")
    if cfg.allocator != "system" and not allocators.find_library(cfg.allocator):
        raise UsageError(f"allocator {cfg.allocator!r} is not installed here",
                         "use --allocator system, or install it (make setup)")
    topo = topology.load(cfg.topology_src)
    plans = make_plans(cfg, topo)
    live_fp = topology.load(None).fingerprint() if cfg.topology_src else None
    for _, p in plans:
        launch.ensure_runnable(p, live_fp)
    return engine_cls, topo, plans


def _data_module(cfg: Config):
    if cfg.benchmark == "jcch":
        from tilewise.data import jcch

        return jcch
    return tpch_data


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


def _validation_rules() -> str:
    from tilewise.bench.validate import RULES

    return RULES


def engine_options(cfg: Config) -> dict:
    """Constructor arguments for the engine adapter from the harness configuration."""
    if cfg.worker_memory and cfg.engine in ("spark", "trino"):
        return {"worker_memory": cfg.worker_memory}
    return {}


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


# ---- the data states and their references ------------------------------------------------------

class States:
    """The sequence of data states of one run and their reference answers.

    A run applies its refresh functions in a fixed order (power RF1, power RF2, then the refresh
    stream's RF1/RF2 pairs); state i is the loaded data after the first i of them. A query that was
    submitted after j functions had completed (on every instance) and returned before function
    k + 1 was started can only have seen states j..k: its answer must equal the reference of one of
    them. References are computed by DataFusion for exactly that state (the loaded tables with the
    update sets' rows added and deleted), once per state, and cached beside the data.
    """

    def __init__(self, dataset, schedule: list[tuple[str, RF.RefreshSet]], *, validate: bool) -> None:
        self.dataset = dataset
        self.schedule = schedule
        self.sets = {rs.number: rs for _, rs in schedule}
        self.states = [RF.State()]
        for fn, rs in schedule:
            self.states.append(self.states[-1].after(fn, rs.number))
        self.validate = validate
        self._refs: dict[str, object] = {}
        self.lock = threading.Lock()
        self.started = 0
        self.completed = 0

    def reset(self) -> None:
        self.started = self.completed = 0

    def reference(self, i: int):
        from tilewise.bench import validate

        st = self.states[i]
        if st.key not in self._refs:
            self._refs[st.key] = validate.Reference(self.dataset, state=st, sets=self.sets)
        return self._refs[st.key]

    def apply(self, engine, k: int) -> float:
        """Apply the run's k-th refresh function (0-based); returns its time."""
        fn, rs = self.schedule[k]
        with self.lock:
            self.started += 1
        t = engine.apply_refresh(fn, rs)
        with self.lock:
            self.completed += 1
        return t

    def bounds(self) -> int:
        with self.lock:
            return self.completed

    def upper(self) -> int:
        with self.lock:
            return self.started


@dataclass
class Answer:
    query: int
    stream: int
    rows: list
    instance: int
    lo: int  # first data state the query may have seen
    hi: int  # last one


# ---- the benchmark ----------------------------------------------------------------------------

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


@dataclass
class _Ctx:
    cfg: Config
    rep: Reporter
    clock: Callable[[], float]
    streams: int
    states: States  # the run's data states (a single one without refresh functions)
    power_fns: tuple[int, int] | None  # indexes of the power test's RF1 and RF2 in the schedule
    stream_fns: list[int]  # indexes of the refresh stream's functions
    queries: Q.QuerySet  # the SQL of query n in stream s (0 = the power test)


def run(cfg: Config, reporter: Reporter | None = None, *, clock: Callable[[], float] = time.perf_counter,
        engine_cls=None) -> dict:
    """Run the benchmark; returns results.json's document (also written to cfg.out after each run).
    Raises WrongAnswer after writing everything when any answer was wrong. engine_cls replaces the
    registry's engine (tests drive the scheduling and validation logic with an in-process engine)."""
    from tilewise.environment import system_check

    rep = reporter or Reporter()
    registered, topo, plans = check_config(cfg)
    engine_cls = engine_cls or registered
    replicas = bool(getattr(engine_cls, "replicas", False))
    streams = cfg.streams or default_streams(cfg.sf, replicas, plans)
    writer = Writer(cfg.out, plots=cfg.plots)  # a bad --out fails before anything starts
    dataset = dataset_for(cfg.benchmark, cfg.sf, cfg.data_dir, seed=cfg.data_seed if cfg.benchmark == "jcch" else None,
                          log=rep.message)
    qset = Q.QuerySet(cfg.benchmark, cfg.params, seed=cfg.seed, sf=cfg.sf)
    version = _engine_version(engine_cls)
    if cfg.engine == "duckdb":
        warn = memory_warning(dataset, plans)
        if warn:
            rep.message(warn)
    supports = bool(getattr(engine_cls, "supports_refresh", False))
    refresh_on = supports if cfg.refresh is None else bool(cfg.refresh)
    check = system_check(numa_nodes=len(topo.cpu_nodes))
    for w in check["warnings"]:
        rep.message(f"warning: {w}")
    doc = M.new("tpch", topo=topo, engines={cfg.engine: version}, allocator=cfg.allocator, system_check=check, params={
        "engine": cfg.engine, "sf": cfg.sf, "policies": [label for label, _ in plans], "queries": list(cfg.queries),
        "streams": streams, "streams_requested": cfg.streams, "runs": cfg.runs, "warmup": cfg.warmup,
        "tests": list(cfg.tests), "refresh": cfg.refresh, "allocator": cfg.allocator, "mem": cfg.mem, "smt": cfg.smt,
        "dataset": dataset.to_json(), "benchmark": cfg.benchmark, "query_params": qset.params,
        "query_seed": qset.seed if cfg.benchmark == "jcch" else None,
    })
    doc.update({
        "requested": {"policies": [label for label, _ in plans], "queries": [f"q{n}" for n in cfg.queries]},
        "completed": {"policies": [], "queries": {}},
        "validation": {"reference": None, "float_rel_tol": 1e-9, "rules": _validation_rules(), "enabled": cfg.validate,
                       "wrong_answers": []},
        "refresh": {"applied": False, "supported": supports},
        "notes": [], "policies": {}, "summary": {},
    })
    schedule: list[tuple[str, RF.RefreshSet]] = []
    power_fns, stream_fns = None, []
    if refresh_on:
        nsets = (1 if "power" in cfg.tests else 0) + (streams if "throughput" in cfg.tests else 0)
        sets = RF.ensure_sets(dataset, nsets, log=rep.message)
        k = 0
        if "power" in cfg.tests:
            schedule += [("RF1", sets[0]), ("RF2", sets[0])]
            power_fns, k = (0, 1), 1
        for rs in sets[k:]:
            stream_fns += [len(schedule), len(schedule) + 1]
            schedule += [("RF1", rs), ("RF2", rs)]
        doc["refresh"].update({
            "applied": True, "generator": RF.GENERATOR, "orders_per_set": RF.orders_per_set(cfg.sf),
            "sets": [rs.to_json() for rs in sets],
            "restore": "after each run the refresh functions are undone outside the timed region (RF1's rows "
                       "deleted, RF2's rows inserted again from the loaded data), so every run starts from the "
                       "loaded data and reuses update sets 1..N"})
    else:
        why = ("--no-refresh" if cfg.refresh is False else f"the {cfg.engine} engine cannot write its tables")
        doc["refresh"]["reason"] = why
        doc["notes"].append(f"without refresh functions ({why}): Power@Size has no RF1/RF2 intervals and the "
                            "throughput test has no refresh stream; the figures are not comparable with "
                            "published TPC-H results")
    states = States(dataset, schedule, validate=cfg.validate)
    ctx = _Ctx(cfg, rep, clock, streams, states, power_fns, stream_fns, qset)
    stream_ids = ([0] if "power" in cfg.tests else []) + (list(range(1, streams + 1)) if "throughput" in cfg.tests else [])
    drawn = qset.describe(stream_ids, cfg.queries)
    if drawn:  # JCC-H: the parameters every stream runs, as qgen would log them
        doc["query_parameters"] = drawn
        doc["notes"] += drawn["notes"]
        rep.message(f"JCC-H {qset.params} query parameters, seed {qset.seed}: {len(stream_ids)} stream(s) "
                    "with their own (recorded in results.json)")
    if "power" in cfg.tests and replicas:
        doc["notes"].append("the power test runs one stream, so on a replica engine it uses one instance of a "
                            "multi-instance deployment (the specification's single-user test); compare deployments "
                            "on Throughput@Size and QphH@Size")
    if len(cfg.queries) < len(Q.NUMBERS):
        doc["notes"].append(f"{len(cfg.queries)} of the 22 queries: the TPC-H metrics are computed over these "
                            "only and are not comparable with full runs")
    if cfg.validate:
        ref = states.reference(0)
        doc["validation"]["reference"] = f"datafusion {ref.version}"
        rep.message(f"reference answers: DataFusion {ref.version} (cached in {ref.cache_dir})")
        for n in cfg.queries:  # computed now, not between runs: the loaded data and what the power test sees
            for i in ((0, 1) if power_fns is not None else (0,)):
                states.reference(i).answer_sql(qset.sql(n, 0), qset.key(n, 0))
            if cfg.benchmark == "jcch":  # every stream has its own SQL: its answers on the loaded data too
                for st in stream_ids:
                    states.reference(0).answer_sql(qset.sql(n, st), qset.key(n, st))
    writer.write(doc)
    wrong: list[str] = doc["validation"]["wrong_answers"]
    deployed: dict[tuple, str] = {}
    try:
        for label, p in plans:
            key = deployment_key(p)
            if key in deployed:
                _same_as(doc, label, p, deployed[key], rep)
                writer.write(doc)
                continue
            deployed[key] = label
            _policy(doc, ctx, engine_cls, label, p, dataset, writer, wrong, replicas)
    except BaseException as e:
        M.stopped(doc, e)
        raise
    else:
        M.finish(doc, complete=True)
    finally:
        writer.write(doc)
    if wrong:
        raise WrongAnswer(f"WRONG ANSWER in {len(wrong)} result(s): {wrong[0]}"
                          + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""),
                          f"see {writer.json_path}")
    return doc


def _same_as(doc: dict, label: str, p, other: str, rep: Reporter) -> None:
    doc["policies"][label] = {"policy": p.policy, "requested": p.requested, "reasons": list(p.reasons),
                              "instances": [_planned(i) for i in p.instances], "same_as": other, "complete": True,
                              "queries": {}, "run_wall_s": [], "tpch_runs": []}
    doc["completed"]["policies"].append(label)
    rep.message(f"{label}: the same deployment as {other} ({len(p.instances)} instance(s) on the same CPUs and "
                f"memory); not run again, reported as = {other}")


def _planned(inst) -> dict:
    return {"id": inst.id, "cpus": list(inst.cpus), "mem_nodes": list(inst.mem_nodes), "mem_policy": inst.mem_policy,
            "numa_nodes": list(inst.numa_nodes), "l3_domains": list(inst.l3_domains)}


def _policy(doc, ctx: _Ctx, engine_cls, label, p, dataset, writer, wrong: list[str], replicas: bool) -> None:
    cfg, rep = ctx.cfg, ctx.rep
    rec = {"policy": p.policy, "requested": p.requested, "reasons": list(p.reasons), "same_as": None, "instances": [],
           "queries": {}, "run_wall_s": [], "warmup_wall_s": [], "tpch_runs": [], "tpch_warmup": [],
           "complete": False}
    doc["policies"][label] = rec
    msg = idle_warning(label, len(p.instances), ctx.streams, replicas) if "throughput" in cfg.tests else None
    if msg:
        rec["idle_instances"] = len(p.instances) - ctx.streams
        doc["warnings"].append(msg)
        rep.message(f"warning: {msg}")
    nq = len(cfg.queries)
    per_run = (nq if "power" in cfg.tests else 0) + (ctx.streams * nq if "throughput" in cfg.tests else 0)
    rep.start_policy(label, (int(cfg.warmup) + cfg.runs) * per_run)
    engine = engine_cls(**engine_options(cfg))
    times: dict[int, list[float]] = {n: [] for n in cfg.queries}
    warm: dict[int, list[float]] = {n: [] for n in cfg.queries}
    rows_of: dict[int, int] = {}
    detail: dict[int, str] = {}
    try:
        rep.message(f"{label}: starting {len(p.instances)} {cfg.engine} instance(s) "
                    f"({', '.join(cpulist.format(i.cpus) for i in p.instances[:8])}"
                    f"{', ...' if len(p.instances) > 8 else ''})")
        t0 = ctx.clock()
        engine.start(p, dataset=dataset, allocator=cfg.allocator)
        rec["start_s"] = ctx.clock() - t0
        rec["instances"] = _instances(engine, p)
        bad = [i for i in rec["instances"] if i.get("binding_verified") is False]
        if bad:
            raise TilewiseError(f"{label}: binding of instance {bad[0]['id']} (pid {bad[0].get('pid')}) not applied: "
                                f"{bad[0].get('detail')}")
        for i in rec["instances"]:
            if i.get("binding_verified") is None:
                rep.message(f"{label}: binding of instance {i['id']} not checkable: {i.get('detail')}")
        total = int(cfg.warmup) + cfg.runs
        for r in range(total):
            timed = r >= int(cfg.warmup)
            name = f"run {r + 1 - int(cfg.warmup)}" if timed else "warm-up"
            one, answers = _one_run(engine, ctx, name)
            _check(answers, ctx, label, rows_of, detail, rep)
            if ctx.states.schedule and r < total - 1:
                _restore(engine, ctx)  # outside the timed region: the next run starts from the loaded data
            per_query = _per_query(one, cfg.queries)
            for n, t in per_query.items():
                (times if timed else warm)[n].append(t)
            one["run"] = r + 1 - int(cfg.warmup) if timed else 0
            (rec["tpch_runs"] if timed else rec["tpch_warmup"]).append(one)
            (rec["run_wall_s"] if timed else rec["warmup_wall_s"]).append(one["wall_s"])
            _queries(rec, cfg, times, warm, rows_of, detail, validated=cfg.validate)
            if timed:
                doc["completed"]["queries"][label] = [q for q, v in rec["queries"].items() if v.get("times_s")]
            writer.write(doc)  # after every run: a late failure loses nothing
        rec["complete"] = True
        doc["completed"]["policies"].append(label)
    except BaseException as e:
        rec["error"] = (str(e) or type(e).__name__) if isinstance(e, Exception) else "interrupted"
        raise
    finally:
        engine.stop()
        rep.end_policy(label)
        for n in sorted(detail):
            msg = f"{label}/q{n}: {detail[n]}"
            if msg not in wrong:
                wrong.append(msg)


def _per_query(one: dict, queries: list[int]) -> dict[int, float]:
    """A run's figure per query: its power-test time, else the median over the throughput streams."""
    if one.get("power"):
        return {n: one["power"]["queries"][f"q{n}"] for n in queries if f"q{n}" in one["power"]["queries"]}
    out = {}
    for n in queries:
        ts = [s["queries"][f"q{n}"] for s in one["throughput"]["streams"] if f"q{n}" in s["queries"]]
        if ts:
            out[n] = statistics.median(ts)
    return out


def _queries(rec: dict, cfg: Config, times, warm, rows_of, detail, *, validated: bool) -> None:
    for n in cfg.queries:
        q = {"times_s": times[n], "warmup_s": warm[n], "rows": rows_of.get(n), "valid": (n not in detail) if validated else None,
             **stats.query_stats(times[n])}
        if n in detail:
            q["error"] = detail[n]
        rec["queries"][f"q{n}"] = q


def _one_run(engine, ctx: _Ctx, label: str) -> tuple[dict, list[Answer]]:
    """One run: the power test, then the throughput test (those selected). Returns the run's
    record (times, TPC-H metrics) and every answer with the data states it may have seen."""
    cfg = ctx.cfg
    ctx.states.reset()
    answers: list[Answer] = []
    one: dict = {"power": None, "throughput": None}
    if "power" in cfg.tests:
        one["power"] = _power_test(engine, ctx, label, answers)
    if "throughput" in cfg.tests:
        one["throughput"] = _throughput_test(engine, ctx, label, answers)
    pw, th = one["power"], one["throughput"]
    one["power_at_size"] = power_at_size(cfg.sf, list(pw["queries"].values()),
                                         [pw[k] for k in ("rf1_s", "rf2_s") if pw.get(k) is not None]) if pw else None
    one["throughput_at_size"] = throughput_at_size(cfg.sf, ctx.streams, len(cfg.queries), th["interval_s"]) if th else None
    one["qphh_at_size"] = qphh_at_size(one["power_at_size"], one["throughput_at_size"])
    one["wall_s"] = th["interval_s"] if th else pw["wall_s"]
    return one, answers


def _ask(engine, ctx: _Ctx, n: int, stream: int, answers: list[Answer], lock=None) -> float:
    lo = ctx.states.bounds()
    res = engine.run_query(ctx.queries.sql(n, stream))
    hi = ctx.states.upper()
    a = Answer(n, stream, res.rows, res.instance, lo, hi)
    if lock is None:
        answers.append(a)
    else:
        with lock:
            answers.append(a)
    return res.elapsed_s


def _power_test(engine, ctx: _Ctx, label: str, answers: list[Answer]) -> dict:
    cfg = ctx.cfg
    order = Q.stream_order(0, cfg.queries)
    out: dict = {"order": order, "queries": {}, "refresh": "RF1/RF2" if ctx.power_fns else "none"}
    t0 = ctx.clock()
    if ctx.power_fns:
        out["rf1_s"] = ctx.states.apply(engine, ctx.power_fns[0])
    for n in order:
        out["queries"][f"q{n}"] = _ask(engine, ctx, n, 0, answers)
        ctx.rep.step(f"{label}, power q{n}")
    if ctx.power_fns:
        out["rf2_s"] = ctx.states.apply(engine, ctx.power_fns[1])
    out["wall_s"] = ctx.clock() - t0
    return out


def _throughput_test(engine, ctx: _Ctx, label: str, answers: list[Answer]) -> dict:
    cfg = ctx.cfg
    lock = threading.Lock()
    out: dict = {"streams": [{"stream": s, "order": Q.stream_order(s, cfg.queries), "queries": {}}
                             for s in range(1, ctx.streams + 1)],
                 "refresh_stream": [] if ctx.stream_fns else None}

    def stream(rec: dict) -> None:
        for n in rec["order"]:
            rec["queries"][f"q{n}"] = _ask(engine, ctx, n, rec["stream"], answers, lock)
            ctx.rep.step(f"{label}, throughput stream {rec['stream']} q{n}")

    def refresh_stream() -> None:
        for i in range(0, len(ctx.stream_fns), 2):
            fn1, fn2 = ctx.stream_fns[i], ctx.stream_fns[i + 1]
            t1 = ctx.states.apply(engine, fn1)
            t2 = ctx.states.apply(engine, fn2)
            out["refresh_stream"].append({"set": ctx.states.schedule[fn1][1].number, "rf1_s": t1, "rf2_s": t2})

    jobs = [lambda rec=rec: stream(rec) for rec in out["streams"]]
    if ctx.stream_fns:
        jobs.append(refresh_stream)
    t0 = ctx.clock()
    pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="tpch-stream")
    try:
        futures = [pool.submit(j) for j in jobs]
        for f in futures:
            f.result()
    except BaseException:
        engine.stop()  # unblocks the other streams (their instances are gone)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    out["interval_s"] = ctx.clock() - t0
    return out


def _restore(engine, ctx: _Ctx) -> None:
    for k in reversed(range(ctx.states.completed)):
        fn, rs = ctx.states.schedule[k]
        engine.apply_refresh(f"undo-{fn}", rs)


def _check(answers: list[Answer], ctx: _Ctx, label: str, rows_of: dict, detail: dict, rep: Reporter) -> None:
    """Every answer against the references of the data states it may have seen (after the run)."""
    cfg, states = ctx.cfg, ctx.states
    for a in answers:
        rows = _corrupt(a.rows) if a.query in cfg.inject_wrong else a.rows
        rows_of[a.query] = len(rows)
        if not cfg.validate:
            continue
        checks = []
        for i in range(a.lo, a.hi + 1):
            checks.append(states.reference(i).check_sql(ctx.queries.sql(a.query, a.stream),
                                                        ctx.queries.key(a.query, a.stream), rows))
            if checks[-1].ok:
                break
        if not checks[-1].ok and a.query not in detail:  # loud, at once, not only in the final table
            where = "" if a.hi == 0 else f" (compared with {states.states[a.lo].describe()}" + (
                f" and the {a.hi - a.lo} later state(s)" if a.hi > a.lo else "") + ")"
            detail[a.query] = checks[0].detail + where
            rep.message(f"WRONG ANSWER: {label} q{a.query} (stream {a.stream}, instance {a.instance}): {checks[0].detail}")


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
        d = _planned(inst)
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
