"""The benchmark harness (`bench tpch`, `bench <benchmark>`): for each policy, plan -> start the
engine bound -> warm-up run -> R timed runs -> validate every answer -> write results after each run.

It knows a benchmark only through its spec (tilewise.benchmarks.spec.Benchmark, from the registry
tilewise.benchmarks): its data set, its queries and each stream's order and SQL, its reference
rules, its refresh functions and its metrics. A run is the pair of tests of TPC-H 5.3 (TPC-H's
names below; other benchmarks name their figures themselves):

- the **power test**: one stream; RF1, the queries in stream 00's order (Appendix A), RF2. Its
  query times are the per-query figures of the tables; they give Power@Size.
- the **throughput test**: S query streams at once, stream s running the queries in the order of
  row s of Appendix A, plus one refresh stream applying S pairs of RF1/RF2; its measurement
  interval Ts (first stream started to last stream, query or refresh, done) is the run's total
  time and gives Throughput@Size.

QphH@Size is the geometric mean of the two. The refresh functions run where the benchmark has them
and the engine can write (its spec's capabilities.refresh; a replica engine applies them to every
replica); elsewhere the results say "without refresh functions". Every answer is checked against a reference computed on exactly the
data state the query saw (see `States`); after a run, the refresh functions are undone (outside
the timed region) so every run and every policy starts from the loaded data and measures the same
work. Drives any engine through the registry (tilewise.engines.get) the same way: its spec says
what it can do (capabilities, as data), its runtime runs the deployment.
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

from tilewise import allocators, benchmarks, changes, cpulist, dirs, engines, topology, userfiles, verification
from tilewise import plan as planner
from tilewise.bench import far_memory, on_layout
from tilewise.benchmarks import validate
from tilewise.benchmarks.validate import RULES, NoReference
from tilewise.data.sources import scan_files
from tilewise.engines import splits
from tilewise.benchmarks.spec import Benchmark, Measured, QueryId, QuerySet, check_seed
from tilewise.binding import admit_weights, ensure_runnable, set_interleave_weights
from tilewise.data.refresh import DataState, RefreshSet
from tilewise.engines.contract import EngineSpec, Query
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model as M
from tilewise.results import stats
from tilewise.results.kinds import benchmark as R
from tilewise.results.output import Writer

TESTS = ("power", "throughput")


class WrongAnswer(TilewiseError):
    pass


class QueryFailed(TilewiseError):
    """A query the engine could not run (its error recorded); raised after everything was written."""


@dataclass
class Config:
    engine: str = engines.DEFAULT_BENCH
    sf: float = 1.0
    policies: list[str] | str = field(default_factory=lambda: ["wim", "wic"])
    streams: int | None = None  # None: the benchmark's minimum for the SF, and >= instances on replica engines
    runs: int = 3
    out: str | Path = "tpch-results"
    topology_src: str | None = None
    queries: list[QueryId] | None = None  # None: all of the benchmark's
    allocator: str = "system"
    data_dir: str | Path | None = None
    smt: bool = False
    mem: str | None = None
    warmup: bool = True
    validate: bool = True
    plots: bool = True
    tests: tuple[str, ...] = TESTS
    refresh: bool | None = None  # None: where the benchmark has refresh functions and the engine can write
    benchmark: str = "tpch"  # a name of the benchmark registry (tilewise.benchmarks)
    params: str | None = None  # the benchmark's query parameter set (None: its default; only where it has sets)
    seed: int = 0  # seed of drawn query parameters (each stream draws its own from it)
    data_seed: int = 0  # seed of the data generator, where it takes one
    inject_wrong: tuple[QueryId, ...] = ()  # test hook: corrupt these queries' answers before validation
    worker_memory: str | None = None  # the engine's memory knob per worker (its spec's capabilities.memory), e.g. 2g
    exchange: str | None = None  # --exchange: the transport between cooperating tiles (its spec's exchanges)
    mem_variants: tuple[str, ...] = ()  # the far-memory study: near, far, interleave, weighted (bench.far_memory)
    layout: str | None = None  # the tables in this layout, read in place (bench.on_layout); None: loaded Parquet
    layout_dir: str | Path | None = None  # the layout store (default: <set dir>/layouts)
    query_timeout_s: float | None = None  # give up on a query after this long (it is reported as failed)


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
    twice = sorted({t for t in items if items.count(t) > 1})
    if twice:
        raise UsageError(f"--tests names {twice[0]} twice", "each test runs once per run; use --runs for more")
    return tuple(t for t in TESTS if t in items)


def default_streams(min_streams: int, replicas: bool, plans) -> int:
    """The benchmark's minimum for the scale factor (min_streams); on a replica engine at least one
    stream per instance of the largest deployment (fewer streams than instances measures idle cores)."""
    n = min_streams
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


# ---- checks before anything starts ------------------------------------------------------------

def make_plans(cfg: Config, topo) -> list[tuple[str, object]]:
    plans = []
    if cfg.mem_variants and cfg.mem:
        raise UsageError("--mem-variants and --mem cannot be combined", "the variants choose each run's memory policy")
    for label, pol, k in parse_policies(cfg.policies):
        if cfg.mem_variants:  # the far-memory study: each variant a deployment of its own
            plans += far_memory.variant_plans(topo, label, pol, k, cfg.smt, far_memory.parse_variants(cfg.mem_variants))
            continue
        try:
            p = planner.plan(topo, pol, instances=k, mem=cfg.mem, smt=cfg.smt)
        except UsageError as e:
            raise UsageError(f"policy {label}: {e.message}", e.hint) from None
        plans.append((label, p))
    return plans


def check_config(cfg: Config, engine: EngineSpec | None = None):
    """Everything that can be checked before anything is started; returns (engine spec, topology, plans).
    engine: the engine's spec when not the registry's (cfg.engine)."""
    spec = benchmarks.get(cfg.benchmark)
    cfg.sf = spec.data.check_sf(cfg.sf)
    cfg.queries = spec.catalog.check(cfg.queries)
    spec.query_set(cfg.params, seed=cfg.seed, sf=cfg.sf)  # --params
    if spec.query_seed:
        cfg.seed = check_seed(cfg.seed)
    if spec.data.seeded:
        cfg.data_seed = spec.data.check_seed(cfg.data_seed)
    if cfg.streams is not None and cfg.streams < 1:
        raise UsageError(f"--streams must be >= 1, got {cfg.streams}")
    if cfg.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {cfg.runs}")
    cfg.tests = parse_tests(cfg.tests)
    if cfg.layout:
        on_layout.check(spec, cfg.layout)
    for option, d in (("--out", cfg.out), ("--data-dir", cfg.data_dir), ("--layout-dir", cfg.layout_dir)):
        if d:
            userfiles.check_dir(d, option)
    dirs.state_dir()  # a bad TILEWISE_STATE_DIR: refused before the data is generated
    engine = engine or engines.get(cfg.engine)
    engine.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = engine.missing()
    if why:  # before any data is generated or a server started: what to install
        raise TilewiseError(f"{engine.title} cannot run here: {why}")
    cfg.exchange = engine.check_exchange(cfg.exchange)
    if cfg.worker_memory:
        if engine.capabilities.memory is None:
            raise UsageError(f"--worker-memory sizes an engine's workers; {engine.name} has no memory setting",
                             "drop it")
        engine.capabilities.memory.parse(cfg.worker_memory)
    if cfg.refresh and spec.refresh is None:
        raise UsageError(f"{spec.title} has no refresh functions here", "drop --refresh")
    if cfg.refresh and not engine.capabilities.refresh:
        raise UsageError(f"the {cfg.engine} engine cannot apply the refresh functions (it does not write its tables)",
                         "drop --refresh; the results then say 'without refresh functions'")
    engine.check_allocator(cfg.allocator)
    if cfg.allocator != "system" and not allocators.find_library(cfg.allocator):
        raise UsageError(f"allocator {cfg.allocator!r} is not installed here",
                         "use --allocator system, or install it (make setup)")
    topo = topology.load(cfg.topology_src)
    plans = make_plans(cfg, topo)
    live_fp = topology.load(None).fingerprint() if cfg.topology_src else None
    k = on_layout.files_per_table(cfg.layout) if cfg.layout else None
    for _, p in plans:
        if engine.check_shares is not None and k is not None:  # tiles that own whole files
            engine.check_shares({cfg.layout: k}, len(p.instances), "layout")
        ensure_runnable(p, live_fp)
    # the global weighted-interleave weights of every deployment: refused now, not after the first ran
    admit_weights(sorted({(n, w) for _, p in plans for i in p.instances for n, w in i.weights.items()}))
    return engine, topo, plans


def memory_warning(dataset, plans) -> str | None:
    """On a replica engine each instance holds its own copy of the tables: warn when the copies may not fit."""
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
    return RULES


def memory_mb(cfg: Config, engine: EngineSpec, p) -> dict[int, int] | None:
    """--worker-memory for every instance of plan p, else None: the engine's own default here."""
    if not cfg.worker_memory:
        return None
    mb = engine.capabilities.memory.parse(cfg.worker_memory)
    return {i.id: mb for i in p.instances}


# ---- the data states and their references ------------------------------------------------------

class States:
    """The sequence of data states of one run and their reference answers.

    A run applies its refresh functions in a fixed order (power RF1, power RF2, then the refresh
    stream's RF1/RF2 pairs); state i is the loaded data after the first i of them. A query that was
    submitted after j functions had completed (on every instance) and returned before function
    k + 1 was started can only have seen states j..k: its answer must equal the reference of one of
    them. References are computed by DataFusion for exactly that state (the loaded tables with the
    update sets' rows added and deleted), once per state, and cached beside the data. Without
    refresh functions there is one state, the loaded data (`loaded` None).
    """

    def __init__(self, dataset, schedule: list[tuple[str, RefreshSet]], *, validate: bool,
                 loaded: DataState | None = None) -> None:
        self.dataset = dataset
        self.schedule = schedule
        self.sets = {rs.number: rs for _, rs in schedule}
        self.states: list[DataState | None] = [loaded]
        for fn, rs in schedule:
            self.states.append(self.states[-1].after(fn, rs.number))
        self.validate = validate
        self.null_order: str | None = None  # the engine's, where the benchmark asks (engine_null_order)
        self._refs: dict[tuple, object] = {}
        self.lock = threading.Lock()
        self.started = 0
        self.completed = 0

    def reset(self) -> None:
        self.started = self.completed = 0

    def reference(self, i: int):
        st = self.states[i]
        key = (st.key if st is not None else "loaded", self.null_order)
        if key not in self._refs:
            self._refs[key] = validate.Reference(self.dataset, state=st, sets=self.sets, null_order=self.null_order)
        return self._refs[key]

    def computed(self) -> int:
        """Reference answers computed so far (not read from the cache)."""
        return sum(len(r.computed) for r in self._refs.values())

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
    query: QueryId
    stream: int
    rows: list
    instance: int
    lo: int  # first data state the query may have seen
    hi: int  # last one
    error: str | None = None  # the engine could not run it: its error (no rows)


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
    queries: QuerySet  # the SQL of query n in stream s (0 = the power test)
    spec: Benchmark
    engine: EngineSpec | None = None  # its dialect hook gives the text the engine runs
    stream_ids: list = field(default_factory=list)  # the streams a run has (0: the power test)
    prepared: set = field(default_factory=set)  # NULL orders whose references are computed
    no_reference: dict = field(default_factory=dict)  # query -> why the reference has no answer
    stopping: bool = False  # the run is being torn down: an engine error now is not a query's
    route: Callable[[str], str] | None = None  # a two-copy layout's choice of copy per query (bench.on_layout)
    tiles: dict | None = None  # this policy's per-tile scan figures (a cooperating engine on a layout)
    tiles_now: bool = False  # the run that measures them (the warm-up, else the first timed run)
    _engine_sql: dict = field(default_factory=dict)

    def engine_sql(self, n: QueryId, stream: int) -> str:
        """The text the engine runs for query n of a stream: the benchmark's, through the engine's
        dialect hook where it has one (computed once)."""
        key = (n, stream)
        if key not in self._engine_sql:
            text = self.queries.sql(n, stream)
            q = Query(self.cfg.benchmark, n, stream, self.queries.key(n, stream), self.queries.catalog.divisions(n))
            sql = self.engine.sql(text, q) if self.engine is not None else text
            self._engine_sql[key] = self.route(sql) if self.route is not None else sql
        return self._engine_sql[key]

    def rewritten(self, n: QueryId) -> bool:
        """The engine runs another text than the benchmark's for query n (in some stream)."""
        return any(self._engine_sql[k] != self.queries.sql(*k) for k in self._engine_sql if k[0] == n)


def run(cfg: Config, reporter: Reporter | None = None, *, clock: Callable[[], float] = time.perf_counter,
        engine_cls=None) -> dict:
    """Run the benchmark; returns results.json's document (also written to cfg.out after each run).
    Raises WrongAnswer after writing everything when any answer was wrong. engine_cls replaces the
    registry's engine runtime (tests drive the scheduling and validation logic with an in-process
    engine); its spec (engine_cls.spec) says what it can do."""
    rep = reporter or Reporter()
    engine, topo, plans = check_config(cfg, engine_cls.spec if engine_cls is not None else None)
    spec = benchmarks.get(cfg.benchmark)
    engine_cls = engine_cls or engine.runtime_class()
    replicas = engine.capabilities.replicas
    streams = cfg.streams or default_streams(spec.metrics.min_streams(cfg.sf), replicas, plans)
    writer = Writer(cfg.out, plots=cfg.plots)  # a bad --out fails before anything starts
    dataset = spec.dataset(cfg.sf, cfg.data_dir, seed=cfg.data_seed if spec.data.seeded else None, log=rep.message)
    qset = spec.query_set(cfg.params, seed=cfg.seed, sf=cfg.sf)
    version = engine.version()
    served, route, layout_info = dataset, None, None
    if cfg.layout:  # the engine reads the tables in place in this layout; references stay on the Parquet set
        served, route, layout_info = on_layout.prepare(
            spec, dataset, cfg.layout, data_dir=cfg.data_dir, layout_dir=cfg.layout_dir,
            seed=cfg.data_seed if spec.data.seeded else None, log=rep.message)
        engine.check_reads(served)
    elif replicas:
        warn = memory_warning(dataset, plans)
        if warn:
            rep.message(warn)
    supports = engine.capabilities.refresh and not served.in_place
    refresh_on = (supports and spec.refresh is not None) if cfg.refresh is None else bool(cfg.refresh)
    check = system_check(numa_nodes=len(topo.cpu_nodes))
    for w in check["warnings"]:
        rep.message(f"warning: {w}")
    params = R.Params.new(
        engine=cfg.engine, sf=cfg.sf, policies=[label for label, _ in plans], queries=list(cfg.queries),
        streams=streams, streams_requested=cfg.streams, runs=cfg.runs, warmup=cfg.warmup, tests=list(cfg.tests),
        refresh=cfg.refresh, allocator=cfg.allocator, mem=cfg.mem, smt=cfg.smt,
        dataset=R.Dataset.from_json(dataset.to_json()), benchmark=cfg.benchmark, query_params=qset.params,
        query_seed=qset.seed, mem_variants=list(cfg.mem_variants), query_timeout_s=cfg.query_timeout_s,
        **({"layout": cfg.layout} if cfg.layout else {}), **({"exchange": cfg.exchange} if cfg.exchange else {}))
    doc = M.new("benchmark", topo=topo, engines={cfg.engine: version}, allocator=cfg.allocator, system_check=check,
                params=params.to_json())
    if layout_info is not None:
        doc["layout"] = layout_info
    doc.update({
        "requested": R.PolicyList.new(policies=[label for label, _ in plans],
                                      queries=[f"q{n}" for n in cfg.queries]).to_json(),
        "completed": R.PolicyList.new(policies=[], queries={}).to_json(),
        "validation": R.Validation.new(reference=None, float_rel_tol=1e-9, rules=_validation_rules(),
                                       enabled=cfg.validate, wrong_answers=[], failed_queries=[],
                                       not_comparable=[]).to_json(),
        "notes": [], "policies": {}, "summary": {},
    })
    refresh, schedule, power_fns, stream_fns = _refresh_schedule(cfg, spec, dataset, served, streams, supports,
                                                                 refresh_on, rep.message)
    doc["refresh"] = refresh.to_json()
    doc["notes"] += spec.metrics.notes(queries=len(cfg.queries), total_queries=len(spec.catalog.ids),
                                       refresh_reason=refresh.reason)
    states = States(dataset, schedule, validate=cfg.validate, loaded=spec.refresh.loaded() if refresh_on else None)
    ctx = _Ctx(cfg, rep, clock, streams, states, power_fns, stream_fns, qset, spec, engine, route=route)
    stream_ids = ([0] if "power" in cfg.tests else []) + (list(range(1, streams + 1)) if "throughput" in cfg.tests else [])
    drawn = qset.describe(stream_ids, cfg.queries)
    if drawn:  # drawn parameters (JCC-H): what every stream runs, as the benchmark's generator would log them
        doc["query_parameters"] = drawn
        doc["notes"] += drawn["notes"]
        if qset.per_stream:
            rep.message(f"{spec.title} {qset.params} query parameters, seed {qset.seed}: {len(stream_ids)} stream(s) "
                        "with their own (recorded in results.json)")
        else:
            rep.message(f"{spec.title} {qset.params} query parameters in every stream (recorded in results.json)")
    if "power" in cfg.tests and replicas:
        doc["notes"].append("the power test runs one stream, so on a replica engine it uses one instance of a "
                            "multi-instance deployment (the specification's single-user test); compare deployments "
                            f"on {' and '.join(title for _, title in spec.metrics.names[1:])}")
    ctx.stream_ids = stream_ids
    if cfg.validate:
        doc["validation"]["reference"] = f"datafusion {validate.reference_engine_version()}"
        if not spec.engine_null_order:  # else once the engine's NULL order is known (_policy)
            _prepare_references(ctx, doc)
    writer.checkpoint(doc)
    wrong: list[str] = doc["validation"]["wrong_answers"]
    deployed: dict[tuple, str] = {}
    try:
        for label, p in plans:
            key = deployment_key(p)
            if key in deployed:
                _same_as(doc, label, p, deployed[key], rep)
                writer.checkpoint(doc)
                continue
            deployed[key] = label
            weights = sorted({(n, w) for i in p.instances for n, w in i.weights.items()})
            # weighted interleave: the weights are global, set for this deployment's run and restored after it
            with changes.Session(f"bench {label} weights") as session:
                for line in set_interleave_weights(session, weights) if weights else ():
                    rep.message(f"{label}: {line}")
                _policy(doc, ctx, engine_cls, label, p, served, writer, wrong, replicas)
            if cfg.mem_variants:
                doc["far_memory"] = far_memory.summarize(doc)
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
    failed = doc["validation"]["failed_queries"]
    if failed:
        raise QueryFailed(f"the {cfg.engine} engine could not run {len(failed)} quer{'y' if len(failed) == 1 else 'ies'}: "
                          f"{failed[0]}" + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""),
                          f"see {writer.json_path}; leave them out with --queries")
    return doc


def _prepare_references(ctx: _Ctx, doc: dict) -> None:
    """Every reference answer the run needs, computed now (not between runs): on the loaded data and
    what the power test sees, and each stream's own SQL where streams draw parameters. A statement
    DataFusion cannot answer is recorded as not comparable (never as valid)."""
    states, qset, cfg = ctx.states, ctx.queries, ctx.cfg
    if states.null_order in ctx.prepared:
        return
    ctx.prepared.add(states.null_order)
    ref = states.reference(0)
    order = f", NULLs sorted as {cfg.engine} sorts them ({ref.null_order})" if states.null_order else ""
    ctx.rep.message(f"reference answers: DataFusion {ref.version}{order} (cached in {ref.cache_dir})")
    if states.null_order:
        doc["validation"]["null_order"] = states.null_order
    t0, used, before = time.perf_counter(), 0, states.computed()
    for n in cfg.queries:
        jobs = [(i, 0) for i in ((0, 1) if ctx.power_fns is not None else (0,))]
        if qset.per_stream:  # every stream has its own SQL: its answers on the loaded data too
            jobs += [(0, st) for st in ctx.stream_ids if st != 0]
        for i, st in jobs:
            used += 1
            try:
                states.reference(i).answer_sql(qset.sql(n, st), qset.key(n, st), n)
            except validate.NoReference as e:
                ctx.no_reference.setdefault(n, str(e))
    computed = states.computed() - before
    doc["validation"]["references"] = {"answers": used, "computed": computed, "cached": used - computed,
                                       "seconds": round(time.perf_counter() - t0, 3), "dir": str(ref.cache_dir)}
    ctx.rep.message(f"reference answers: {used - computed} cached, {computed} computed in "
                    f"{time.perf_counter() - t0:.1f} s")
    _not_comparable(ctx, doc)


def _not_comparable(ctx: _Ctx, doc: dict) -> None:
    """Every query without a reference answer (in some stream) in results.json, said once."""
    for n, why in ctx.no_reference.items():
        msg = f"q{n}: not comparable: {why}"
        if msg not in doc["validation"]["not_comparable"]:
            doc["validation"]["not_comparable"].append(msg)
            ctx.rep.message(f"warning: {msg}; its answers there are not validated")


def _refresh_schedule(cfg: Config, spec, dataset, served, streams: int, supports: bool, refresh_on: bool, log):
    """(the refresh record, the schedule of (function, update set), the power test's two entries of it,
    the refresh stream's): the power test applies set 1's pair around its queries, the refresh
    stream one pair per query stream; or why the functions do not run."""
    schedule: list[tuple[str, RefreshSet]] = []
    power_fns, stream_fns = None, []
    if not refresh_on:
        why = ("--no-refresh" if cfg.refresh is False else f"{spec.title} has no refresh functions here"
               if spec.refresh is None else f"the tables are read in place from layout {cfg.layout} (files are "
               "not written)" if served.in_place else f"the {cfg.engine} engine cannot write its tables")
        return R.Refresh.new(applied=False, supported=supports, reason=why), schedule, power_fns, stream_fns
    f1, f2 = spec.refresh.functions
    nsets = (1 if "power" in cfg.tests else 0) + (streams if "throughput" in cfg.tests else 0)
    sets = spec.refresh.ensure_sets(dataset, nsets, log=log)
    k = 0
    if "power" in cfg.tests:
        schedule += [(f1, sets[0]), (f2, sets[0])]
        power_fns, k = (0, 1), 1
    for rs in sets[k:]:
        stream_fns += [len(schedule), len(schedule) + 1]
        schedule += [(f1, rs), (f2, rs)]
    refresh = R.Refresh.new(applied=True, supported=supports, sets=[rs.to_json() for rs in sets],
                            restore=spec.refresh.restore, extra=spec.refresh.describe(cfg.sf))
    return refresh, schedule, power_fns, stream_fns


def _same_as(doc: dict, label: str, p, other: str, rep: Reporter) -> None:
    doc["policies"][label] = R.Policy.new(
        policy=p.policy, requested=p.requested, reasons=list(p.reasons), same_as=other, complete=True,
        instances=[_planned(i) for i in p.instances], queries={}, run_wall_s=[], runs=[]).to_json()
    doc["completed"]["policies"].append(label)
    rep.message(f"{label}: the same deployment as {other} ({len(p.instances)} instance(s) on the same CPUs and "
                f"memory); not run again, reported as = {other}")


def _planned(inst, **read_back) -> R.Instance:
    """A plan instance's record: as planned, and what was read back or reported for it."""
    return R.Instance.new(id=inst.id, cpus=list(inst.cpus), mem_nodes=list(inst.mem_nodes), mem_policy=inst.mem_policy,
                          numa_nodes=list(inst.numa_nodes), l3_domains=list(inst.l3_domains), **read_back)


def _policy(doc, ctx: _Ctx, engine_cls, label, p, dataset, writer, wrong: list[str], replicas: bool) -> None:
    cfg, rep = ctx.cfg, ctx.rep
    rec = R.Policy.new(policy=p.policy, requested=p.requested, reasons=list(p.reasons), same_as=None, instances=[],
                       queries={}, run_wall_s=[], warmup_wall_s=[], runs=[], warmup=[], complete=False).to_json()
    doc["policies"][label] = rec
    msg = idle_warning(label, len(p.instances), ctx.streams, replicas) if "throughput" in cfg.tests else None
    if msg:
        rec["idle_instances"] = len(p.instances) - ctx.streams
        doc["warnings"].append(msg)
        rep.message(f"warning: {msg}")
    nq = len(cfg.queries)
    per_run = (nq if "power" in cfg.tests else 0) + (ctx.streams * nq if "throughput" in cfg.tests else 0)
    rep.start_policy(label, (int(cfg.warmup) + cfg.runs) * per_run)
    engine = engine_cls()
    engine.exchange = cfg.exchange
    times: dict[QueryId, list[float]] = {n: [] for n in cfg.queries}
    warm: dict[QueryId, list[float]] = {n: [] for n in cfg.queries}
    rows_of: dict[QueryId, int] = {}
    detail: dict[QueryId, str] = {}  # wrong answers
    failed: dict[QueryId, str] = {}  # queries the engine could not run: its error
    try:
        rep.message(f"{label}: starting {len(p.instances)} {cfg.engine} instance(s) "
                    f"({', '.join(cpulist.format(i.cpus) for i in p.instances[:8])}"
                    f"{', ...' if len(p.instances) > 8 else ''})")
        t0 = ctx.clock()
        engine.start(p, dataset=dataset, allocator=cfg.allocator, memory_mb=memory_mb(cfg, ctx.engine, p))
        rec["start_s"] = ctx.clock() - t0
        rec["instances"] = _instances(engine, p)
        bad = [i for i in rec["instances"] if i.get("binding_verified") is False]
        if bad:
            raise TilewiseError(f"{label}: binding of instance {bad[0]['id']} (pid {bad[0].get('pid')}) not applied: "
                                f"{bad[0].get('detail')}")
        for i in rec["instances"]:
            if i.get("binding_verified") is None:
                rep.message(f"{label}: binding of instance {i['id']} not checkable: {i.get('detail')}")
        if cfg.validate and ctx.spec.engine_null_order:  # references sorted as this engine sorts NULLs
            ctx.states.null_order = validate.probe_null_order(lambda sql: engine.run_query(sql).rows)
            _prepare_references(ctx, doc)
        ctx.tiles = _predicted_tiles(ctx, p, dataset) if "power" in cfg.tests else None
        if ctx.tiles is not None:
            rec["tiles"] = ctx.tiles
        total = int(cfg.warmup) + cfg.runs
        for r in range(total):
            timed = r >= int(cfg.warmup)
            name = f"run {r + 1 - int(cfg.warmup)}" if timed else "warm-up"
            ctx.tiles_now = ctx.tiles is not None and r == 0
            if ctx.tiles_now:
                ctx.tiles["measured_in"] = name
            one, answers = _one_run(engine, ctx, name, rec.get("start_s"))
            _check(answers, ctx, label, rows_of, detail, failed, rep)
            _not_comparable(ctx, doc)
            if ctx.states.schedule and r < total - 1:
                _restore(engine, ctx)  # outside the timed region: the next run starts from the loaded data
            per_query = _per_query(one, cfg.queries)
            for n, t in per_query.items():
                (times if timed else warm)[n].append(t)
            one.run = r + 1 - int(cfg.warmup) if timed else 0
            (rec["runs"] if timed else rec["warmup"]).append(one.to_json())
            (rec["run_wall_s"] if timed else rec["warmup_wall_s"]).append(one.wall_s)
            _queries(rec, ctx, times, warm, rows_of, detail, failed)
            if timed:
                doc["completed"]["queries"][label] = [q for q, v in rec["queries"].items() if v.get("times_s")]
            writer.checkpoint(doc)  # after every run: a late failure loses nothing
        _peak_memory(engine, rec)
        rec["complete"] = True
        doc["completed"]["policies"].append(label)
    except BaseException as e:
        rec["error"] = (str(e) or type(e).__name__) if isinstance(e, Exception) else "interrupted"
        raise
    finally:
        engine.stop()
        rep.end_policy(label)
        for n in cfg.queries:
            for msgs, what in ((wrong, detail), (doc["validation"]["failed_queries"], failed)):
                msg = f"{label}/q{n}: {what[n]}" if n in what else None
                if msg and msg not in msgs:
                    msgs.append(msg)


def _predicted_tiles(ctx: _Ctx, p, dataset) -> dict | None:
    """For a cooperating engine reading a layout in place: per table, the files, row groups and bytes
    each tile's tasks read by the engine's split rule (engines.splits), to set beside what each tile
    really did per query (measured in one run, _tile_delta). An engine whose per-tile figures are
    cheap (capabilities.tile_stats) is measured whatever the layout, without a prediction."""
    if ctx.engine is None or ctx.engine.capabilities.replicas:
        return None
    rule = ctx.engine.scan_split if dataset.in_place else None
    if rule is None and not ctx.engine.capabilities.tile_stats:
        return None
    cores = sum(len(i.cpus) for i in p.instances)
    tables = {}
    for t, src in (dataset.table_sources().items() if rule is not None else ()):
        if src.format == "parquet":
            tables[t] = splits.per_tile(scan_files(src), len(p.instances), cores, rule)
    return {"predicted": tables, "rule": rule.describe() if rule is not None else None, "queries": {},
            "measured_in": None}


def _tile_delta(before: dict, after: dict) -> list[dict]:
    """Per tile, what one query did there: the difference of each of the engine's counters (tasks and
    input bytes; where the engine says so, rows scanned and what its exchange received)."""
    out = []
    for inst in sorted(set(before) | set(after)):
        a, b = after.get(inst, {}), before.get(inst, {})
        out.append({"tile": inst, **{k: a.get(k, 0) - b.get(k, 0) for k in sorted(set(a) | set(b))}})
    return out


def _per_query(one: R.Run, queries: list[QueryId]) -> dict[QueryId, float]:
    """A run's figure per query: its power-test time, else the median over the throughput streams."""
    if one.power:
        return {n: one.power.queries[f"q{n}"] for n in queries if f"q{n}" in one.power.queries}
    out = {}
    for n in queries:
        ts = [s.queries[f"q{n}"] for s in one.throughput.streams if f"q{n}" in s.queries]
        if ts:
            out[n] = statistics.median(ts)
    return out


def _queries(rec: dict, ctx: _Ctx, times, warm, rows_of, detail, failed) -> None:
    """Each query's record: times, rows, whether its answers were valid (None: not checked, or no
    reference answer: `not_comparable` says why), the engine's error where it could not run it, and
    whether the engine ran a rewritten text (its dialect hook's rewrite)."""
    for n in ctx.cfg.queries:
        if n in failed or n in detail:
            valid = False
        elif not ctx.cfg.validate or n in ctx.no_reference:
            valid = None  # not checked, or (in some stream) without a reference answer
        else:
            valid = True
        q = R.Query.new(times_s=times[n], warmup_s=warm[n], rows=rows_of.get(n), valid=valid,
                        **stats.query_stats(times[n]))
        if n in detail:
            q.error = detail[n]
        if n in failed:
            q.error = q.failed = failed[n]
        elif ctx.cfg.validate and n in ctx.no_reference:
            q.not_comparable = ctx.no_reference[n]
        if ctx.rewritten(n):
            q.rewritten = True
        rec["queries"][f"q{n}"] = q.to_json()


def _one_run(engine, ctx: _Ctx, label: str, load_s: float | None) -> tuple[R.Run, list[Answer]]:
    """One run: the power test, then the throughput test (those selected). Returns the run's
    record (times, the benchmark's metrics) and every answer with the data states it may have seen."""
    cfg = ctx.cfg
    ctx.states.reset()
    answers: list[Answer] = []
    pw = _power_test(engine, ctx, label, answers) if "power" in cfg.tests else None
    th = _throughput_test(engine, ctx, label, answers) if "throughput" in cfg.tests else None
    failed = sorted({f"q{a.query}" for a in answers if a.error is not None}, key=str)
    figures = ctx.spec.metrics.figures(Measured(
        sf=cfg.sf, queries=len(cfg.queries) - len(failed), total_queries=len(ctx.spec.catalog.ids),
        power_s=list(pw.queries.values()) if pw else None,
        power_refresh_s=[pw.get(k) for k in _refresh_keys(ctx) if pw.get(k) is not None] if pw else [],
        streams=ctx.streams, interval_s=th.interval_s if th else None, refresh=bool(ctx.states.schedule),
        load_s=load_s))
    own = {k: figures.pop(k) for k in list(figures) if k in R.Run.__dataclass_fields__}  # TPC-H's, typed
    one = R.Run.new(power=pw, throughput=th, **({"failed": failed} if failed else {}),  # failed: not timed
                    **own, extra=figures, wall_s=th.interval_s if th else pw.wall_s)
    return one, answers


def _refresh_keys(ctx: _Ctx) -> list[str]:
    """A run record's keys of the refresh functions' times: "rf1_s", "rf2_s"."""
    return [f"{fn.lower()}_s" for fn in ctx.spec.refresh.functions] if ctx.spec.refresh else []


def _ask(engine, ctx: _Ctx, n: QueryId, stream: int, answers: list[Answer], lock=None) -> float | None:
    """Run query n of a stream; its time, or None when the engine could not run it (the engine's
    error is kept with the answer; an engine that is no longer healthy ends the run instead)."""
    lo = ctx.states.bounds()
    try:
        res = engine.run_query(ctx.engine_sql(n, stream), timeout_s=ctx.cfg.query_timeout_s)
    except TilewiseError as e:
        if ctx.stopping or not _healthy(engine):
            raise
        a = Answer(n, stream, [], -1, lo, ctx.states.upper(), error=" ".join(str(e).split()) or type(e).__name__)
        elapsed = None
    else:
        a = Answer(n, stream, res.rows, res.instance, lo, ctx.states.upper())
        elapsed = res.elapsed_s
    if lock is None:
        answers.append(a)
    else:
        with lock:
            answers.append(a)
    return elapsed


def _healthy(engine) -> bool:
    """Every instance of the engine answers its status as healthy (a failed query left it running)."""
    try:
        statuses = engine.status()
    except Exception:  # noqa: BLE001 - a status call that fails is an unhealthy engine
        return False
    return bool(statuses) and all(s.healthy for s in statuses)


def _power_test(engine, ctx: _Ctx, label: str, answers: list[Answer]) -> R.PowerTest:
    cfg = ctx.cfg
    out = R.PowerTest.new(order=ctx.spec.catalog.stream_order(0, cfg.queries), queries={},
                          refresh="/".join(ctx.spec.refresh.functions) if ctx.power_fns else "none")
    t0 = ctx.clock()
    k1, k2 = _refresh_keys(ctx) or (None, None)
    if ctx.power_fns:  # the refresh functions' seconds under the benchmark's names ("rf1_s")
        out.extra[k1] = ctx.states.apply(engine, ctx.power_fns[0])
    for n in out.order:
        before = engine.scan_stats() if ctx.tiles_now else None
        t = _ask(engine, ctx, n, 0, answers)
        if t is not None:
            out.queries[f"q{n}"] = t
        if before is not None:
            ctx.tiles["queries"][f"q{n}"] = _tile_delta(before, engine.scan_stats() or {})
        ctx.rep.step(f"{label}, power q{n}")
    if ctx.power_fns:
        out.extra[k2] = ctx.states.apply(engine, ctx.power_fns[1])
    out.wall_s = ctx.clock() - t0
    return out


def _throughput_test(engine, ctx: _Ctx, label: str, answers: list[Answer]) -> R.ThroughputTest:
    cfg = ctx.cfg
    lock = threading.Lock()
    out = R.ThroughputTest.new(
        streams=[R.Stream.new(stream=s, order=ctx.spec.catalog.stream_order(s, cfg.queries), queries={})
                 for s in range(1, ctx.streams + 1)],
        refresh_stream=[] if ctx.stream_fns else None)

    def stream(rec: R.Stream) -> None:
        for n in rec.order:
            t = _ask(engine, ctx, n, rec.stream, answers, lock)
            if t is not None:
                rec.queries[f"q{n}"] = t
            ctx.rep.step(f"{label}, throughput stream {rec.stream} q{n}")

    def refresh_stream() -> None:
        k1, k2 = _refresh_keys(ctx)
        for i in range(0, len(ctx.stream_fns), 2):
            fn1, fn2 = ctx.stream_fns[i], ctx.stream_fns[i + 1]
            t1 = ctx.states.apply(engine, fn1)
            t2 = ctx.states.apply(engine, fn2)
            out.refresh_stream.append({"set": ctx.states.schedule[fn1][1].number, k1: t1, k2: t2})

    jobs = [lambda rec=rec: stream(rec) for rec in out.streams]
    if ctx.stream_fns:
        jobs.append(refresh_stream)
    t0 = ctx.clock()
    pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="tpch-stream")
    try:
        futures = [pool.submit(j) for j in jobs]
        for f in futures:
            f.result()
    except BaseException:
        ctx.stopping = True  # the other streams' errors from here on end them, not their queries
        engine.stop()  # unblocks the other streams (their instances are gone)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    out.interval_s = ctx.clock() - t0
    return out


def _restore(engine, ctx: _Ctx) -> None:
    for k in reversed(range(ctx.states.completed)):
        fn, rs = ctx.states.schedule[k]
        engine.apply_refresh(f"undo-{fn}", rs)


def _check(answers: list[Answer], ctx: _Ctx, label: str, rows_of: dict, detail: dict, failed: dict,
           rep: Reporter) -> None:
    """Every answer against the references of the data states it may have seen (after the run); an
    answer the engine could not give is recorded with its error, one without a reference answer
    is not comparable."""
    cfg, states = ctx.cfg, ctx.states
    for a in answers:
        if a.error is not None:
            if a.query not in failed:
                failed[a.query] = a.error
                rep.message(f"FAILED: {label} q{a.query} (stream {a.stream}): the {cfg.engine} engine could not run it: "
                            f"{a.error}")
            continue
        rows = _corrupt(a.rows) if a.query in cfg.inject_wrong else a.rows
        rows_of[a.query] = len(rows)
        if not cfg.validate:
            continue
        checks = []
        try:
            for i in range(a.lo, a.hi + 1):
                checks.append(states.reference(i).check_sql(ctx.queries.sql(a.query, a.stream),
                                                            ctx.queries.key(a.query, a.stream), rows, a.query))
                if checks[-1].ok:
                    break
        except NoReference as e:  # this text has no answer (another stream's text of the query may have one)
            ctx.no_reference.setdefault(a.query, str(e))
            continue
        if not checks[-1].ok and a.query not in detail:  # loud, at once, not only in the final table
            where = "" if a.hi == 0 else f" (compared with {states.states[a.lo].describe()}" + (
                f" and the {a.hi - a.lo} later state(s)" if a.hi > a.lo else "") + ")"
            detail[a.query] = checks[0].detail + where
            rep.message(f"WRONG ANSWER: {label} q{a.query} (stream {a.stream}, instance {a.instance}): {checks[0].detail}")


def _instances(engine, p) -> list[dict]:
    """Per instance: as planned, its binding read back (engine.status()), and the engine's settings
    as it reports them (engine.info(): threads, memory, load time)."""
    out = []
    try:
        statuses = {s.id: s for s in engine.status()}
        failed = ""
    except Exception as e:  # noqa: BLE001 - recorded as "not checkable", never skipped silently
        statuses, failed = {}, f"the engine's status call failed: {str(e) or type(e).__name__}"
    for inst in p.instances:
        s = statuses.get(inst.id)
        if s is not None:
            seen = {"pid": s.pid, "binding_verified": s.binding_verified, "healthy": s.healthy,
                    "verification": s.verdict}
            if s.verification is not None:  # the record read back from /proc, as the engine's status gave it
                seen["checks"] = s.verification.get("checks", {})
            if s.detail:
                seen["detail"] = s.detail
        else:
            seen = {"binding_verified": None, "verification": verification.NOT_CHECKABLE,
                    "detail": failed or "the engine reported no status for this instance"}
        try:
            info = engine.info(inst.id) or {}
        except Exception:  # noqa: BLE001 - settings are recorded when the engine gives them
            info = {}
        # the engine's settings (settings, load: its own), and its resident memory once the data set is
        # loaded (all of it; anonymous)
        for k, name in (("load_s", "load_s"), ("threads", "threads"), ("memory_mb", "memory_mb"),
                        ("settings", "settings"), ("load", "load"), ("rss_mb", "rss_loaded_mb"),
                        ("rss_anon_mb", "rss_anon_loaded_mb")):
            if info.get(k) is not None:
                seen[name] = info[k]
        out.append(_planned(inst, **seen).to_json())
    return out


def _peak_memory(engine, rec: dict) -> None:
    """Each instance's peak resident memory after the runs (where the engine reports it)."""
    for d in rec.get("instances", []):
        try:
            peak = (engine.info(d["id"]) or {}).get("peak_rss_mb")
        except Exception:  # noqa: BLE001 - recorded when the engine gives it
            peak = None
        if peak is not None:
            d["rss_peak_mb"] = peak
