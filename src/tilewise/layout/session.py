"""`tilewise data layout`: measure candidate layouts of a data set for a workload, an engine and a
plan; report per layout and query the time, bytes read and CPU-seconds, per transformation its
cost and break-even, and a recommendation with its reasons; `--apply` makes the chosen layout.

The steps (run(config, reporter) -> the "layout" results document, written after each layout):
1. the source: a directory of raw tables (``--data``) or a benchmark's tables as its generator
   writes them as text (``--benchmark B --sf N --raw csv|tbl``);
2. the workload: the benchmark's queries (``--queries``) or a file of SQL (``--sql``); its
   predicates give the sort column (workload.sort_candidates);
3. the candidates (candidates.candidates, or ``--layouts`` as named), each made through the layout
   store (tilewise.data.layouts: atomic, cached, checked), what making each cost recorded;
4. one deployment of the engine by the plan, reading the tables in place; per layout every table is
   switched to its copy (or the deployment restarted, for engines that cannot switch), each query
   run once unmeasured (its answer checked: against the benchmark's reference answers, else against
   the answer on the data as it is) and then ``--runs`` times measured (measure.run);
5. two-copy layouts take, per query, the measured runs of the copy its predicates choose;
6. break-even and the recommendation (advise), pure functions of what was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise import benchmarks, engines, topology
from tilewise import plan as planner
from tilewise.benchmarks import sqlshape, validate
from tilewise.data import Dataset, raw
from tilewise.data import layouts as L
from tilewise.data.sources import scan_files
from tilewise.engines import splits
from tilewise.errors import TilewiseError, UsageError
from tilewise.layout import advise, candidates, measure
from tilewise.layout import workload as W
from tilewise.results import model as M
from tilewise.results import stats
from tilewise.results.output import Writer


@dataclass
class Config:
    data: str | None = None  # a directory of raw tables
    benchmark: str | None = None  # its queries (and, without data, its tables at sf)
    sf: float | None = None
    raw_format: str = "csv"  # the benchmark's tables as its generator writes them as text
    data_dir: str | None = None
    queries: str | None = None  # a selection of the benchmark's queries ("1,6,14")
    sql_file: str | None = None
    engine: str = engines.DEFAULT_BENCH
    policy: str = "auto"
    instances: int | None = None
    topology_src: str | None = None
    layouts: list[str] | None = None  # measure these (the as-is baseline is always measured)
    runs: int = 3
    drop: str = "files"
    expected_runs: float | None = None
    apply: bool = False
    apply_layout: str | None = None  # apply this layout instead of the recommendation
    layout_dir: str | None = None
    out: str | None = None
    max_file_mb: float = 200.0
    validate: bool = True
    timeout_s: float | None = None


class Reporter:
    def message(self, text: str) -> None: ...


@dataclass
class _Ctx:
    cfg: Config
    rep: Reporter
    sources: dict
    dataset: Dataset  # the data as it is, read in place
    statements: list
    columns: dict
    reference: object = None  # validate.Reference on the benchmark's own Parquet, or None
    answers: dict = field(default_factory=dict)  # key -> rows on the data as it is (no reference)
    wrong: list = field(default_factory=list)


# ---- checks and inputs --------------------------------------------------------------------------

def check(cfg: Config) -> None:
    if cfg.data is None and cfg.benchmark is None:
        raise UsageError("give the data (--data DIR) or a benchmark (--benchmark B --sf N)",
                         "e.g. tilewise data layout --benchmark tpch --sf 1")
    if cfg.sql_file is None and cfg.benchmark is None:
        raise UsageError("give the workload: --benchmark B (its queries) or --sql FILE",
                         "e.g. --sql queries.sql, one SELECT per statement")
    if cfg.sql_file is not None and cfg.queries is not None:
        raise UsageError("--queries selects a benchmark's queries; it does not apply to --sql", "drop one of them")
    if cfg.data is None and cfg.sf is None:
        raise UsageError("--benchmark without --data needs --sf", "e.g. --sf 1")
    if cfg.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {cfg.runs}")
    if cfg.expected_runs is not None and not cfg.expected_runs > 0:
        raise UsageError("--expected-runs must be > 0")
    if cfg.raw_format not in raw.WRITABLE:
        raise UsageError(f"--raw {cfg.raw_format!r}: tilewise writes a benchmark's raw tables as "
                         f"{' or '.join(raw.WRITABLE)}")
    measure.check_drop(cfg.drop)
    spec = engines.get(cfg.engine)
    if not spec.capabilities.reads:
        raise UsageError(f"{spec.title} loads Parquet into memory and reads no file in place: a layout does not "
                         "change what it does per query",
                         f"use --engine {' or '.join(s.name for s in engines.specs(lambda s: s.capabilities.reads))}")
    spec.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = spec.missing()
    if why:
        raise TilewiseError(f"{spec.title} cannot run here: {why}")


def _source(cfg: Config, rep: Reporter) -> tuple[dict, Dataset, Dataset | None]:
    """(sources, the data as it is as a Dataset read in place, the benchmark's own Parquet set or None)."""
    if cfg.data is not None:
        ds = raw.dataset(cfg.data)
        if "," in ds.layout:
            raise UsageError(f"{ds.dir} mixes formats ({ds.layout})", "give --data a folder of one format")
        return ds.table_sources(), ds, None
    spec = benchmarks.get(cfg.benchmark)
    sf = spec.data.check_sf(cfg.sf)
    seed = spec.data.default_seed if spec.data.seeded else None
    ds = spec.data.raw(sf, cfg.raw_format, cfg.data_dir, seed=seed, log=rep.message)
    canonical = spec.dataset(sf, cfg.data_dir, seed=seed, log=rep.message) if cfg.validate else None
    return ds.table_sources(), ds, canonical


def _statements(cfg: Config) -> list[W.Statement]:
    if cfg.sql_file is not None:
        return W.from_file(cfg.sql_file)
    spec = benchmarks.get(cfg.benchmark)
    return W.from_catalog(spec.catalog, spec.catalog.parse(cfg.queries))


def _specs(cfg: Config, srcs: dict, fmt: str, cands: list[candidates.Candidate]) -> list[tuple[L.LayoutSpec, str]]:
    """The layouts to measure: the as-is baseline, then the candidates or those named; a two-copy
    layout brings the two single-copy layouts it is made of."""
    base = L.LayoutSpec(format=fmt, files=0)
    if cfg.layouts:
        named = [(L.parse(n, source_format=fmt), "named with --layouts") for n in cfg.layouts]
    else:
        named = [(c.spec, c.why) for c in cands]
    out: list[tuple[L.LayoutSpec, str]] = [(base, "the data as it is: the baseline")]
    for spec, why in named:
        L.sort_table(spec, srcs)  # a sort column no table has: an error now
        if spec.copies == 2:
            for part, w in ((L.LayoutSpec("parquet", spec.files, spec.row_group_rows), f"one of {spec.name}'s copies"),
                            (L.LayoutSpec("parquet", spec.files, spec.row_group_rows, spec.sort, 1),
                             f"one of {spec.name}'s copies")):
                if part.name not in [s.name for s, _ in out]:
                    out.append((part, w))
        if spec.name not in [s.name for s, _ in out]:
            out.append((spec, why))
    return out


# ---- the use case --------------------------------------------------------------------------------

def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    rep = reporter or Reporter()
    check(cfg)
    spec = engines.get(cfg.engine)
    topo = topology.load(cfg.topology_src)
    p = planner.plan(topo, cfg.policy, instances=cfg.instances)
    tiles = len(p.instances)
    threads = min(len(i.cpus) for i in p.instances)
    writer = Writer(cfg.out, plots=False) if cfg.out else None
    statements = _statements(cfg)
    srcs, asis, canonical = _source(cfg, rep)
    W.check_tables(statements, set(srcs))
    fmt = next(iter(srcs.values())).format
    columns = {t: set(s.names) for t, s in srcs.items()}
    sizes = {t: s.bytes for t, s in srcs.items()}
    sorts = W.sort_candidates(statements, columns, sizes)
    best = W.best_sort(sorts)
    store = L.Store(cfg.layout_dir or L.default_root(srcs))
    hooks = L.Hooks(log=rep.message)
    bounds = candidates.Bounds(max_file_bytes=cfg.max_file_mb * 1e6)
    rows = None
    if not cfg.layouts:  # the row-group rule needs row counts: the transcoding alone gives them
        one = store.realize(srcs, L.LayoutSpec("parquet", 1), hooks)
        rows = {t: c[0].source.rows for t, c in one.copies.items()}
    cands = candidates.candidates(fmt, sizes, tiles=tiles, threads=threads, sort=best, rows=rows, bounds=bounds)
    specs = _specs(cfg, srcs, fmt, cands)
    doc = M.new("layout", topo=topo, engines={spec.name: spec.version()}, params={
        "engine": spec.name, "policy": cfg.policy, "instances": cfg.instances, "data": cfg.data,
        "benchmark": cfg.benchmark, "sf": cfg.sf, "raw": cfg.raw_format if cfg.data is None else None,
        "queries": [s.key for s in statements], "sql_file": cfg.sql_file, "runs": cfg.runs, "drop": cfg.drop,
        "expected_runs": cfg.expected_runs, "layouts": cfg.layouts, "max_file_mb": cfg.max_file_mb,
        "apply": cfg.apply_layout or cfg.apply or None})
    doc.update({
        "source": {"label": asis.label, "format": fmt, "dir": str(asis.dir), "store": str(store.root),
                   "tables": {t: {"files": len(s.files), "bytes": s.bytes, "rows": (rows or {}).get(t)}
                              for t, s in srcs.items()}},
        "deployment": {"tiles": tiles, "threads_per_tile": threads, "plan": p.policy,
                       "instances": [{"id": i.id, "cpus": list(i.cpus)} for i in p.instances]},
        "workload": {"statements": {s.key: {"where": s.where, "predicates": [
            [x.table, x.column, x.op] for x in W.predicates(s.sql, columns)]} for s in statements},
            "sort_candidates": sorts[:10], "sort": best},
        "cache": {"drop": cfg.drop, "method": measure.DESCRIBE[cfg.drop]},
        "candidates": [{"name": s.name, "why": why} for s, why in specs],
        "layouts": [], "recommendation": None,
    })
    if writer:
        writer.write(doc)
    made: dict[str, L.LayoutSet] = {}
    for s, _ in specs:  # every layout made before any is measured (the machine is quiet while measuring)
        made[s.name] = store.realize(srcs, s, hooks)
    ctx = _Ctx(cfg, rep, srcs, asis, statements, columns)
    if canonical is not None and cfg.validate:
        ctx.reference = validate.Reference(canonical)
    entries: dict[str, dict] = {}
    try:
        _measure_all(ctx, spec, p, specs, made, entries, doc, writer)
    except BaseException as e:
        M.stopped(doc, e)
        if writer:
            writer.write(doc)
        raise
    doc["layouts"] = [entries[s.name] for s, _ in specs if s.name in entries]
    advise.annotate(doc["layouts"], specs[0][0].name)
    rec = advise.recommend(doc["layouts"], baseline=specs[0][0].name, expected_runs=cfg.expected_runs,
                           max_file_bytes=bounds.max_file_bytes)
    doc["recommendation"] = rec.to_json()
    if ctx.wrong:
        doc["warnings"] = list(doc.get("warnings") or []) + ctx.wrong
    if cfg.apply or cfg.apply_layout:
        doc["applied"] = _apply(cfg.apply_layout or rec.layout, store, srcs, fmt, hooks, rep)
    M.finish(doc, complete=True)
    if writer:
        writer.write(doc)
    if ctx.wrong:
        raise TilewiseError(f"WRONG ANSWER on a layout: {ctx.wrong[0]}", "a transformation changed the data; "
                            "report it as a bug" + (f"; see {writer.json_path}" if writer else ""))
    return doc


def _apply(name: str, store: L.Store, srcs: dict, fmt: str, hooks, rep) -> dict:
    spec = L.parse(name, source_format=fmt)
    if spec.raw:
        rep.message(f"{name} is the data as it is: nothing to write")
        return {"layout": name, "path": None, "note": "the data as it is: nothing was written"}
    path = store.apply(srcs, spec, hooks)
    rep.message(f"applied {name}: {path} (bench --layout {name} --layout-dir {store.root} reads it)")
    return {"layout": name, "path": str(path)}


# ---- measuring ------------------------------------------------------------------------------------

def _measure_all(ctx: _Ctx, spec, p, specs, made, entries, doc, writer) -> None:
    cfg, rep = ctx.cfg, ctx.rep
    rt = spec.runtime_class()()
    singles = [(s, why) for s, why in specs if s.copies == 1]
    try:
        rt.start(p, dataset=ctx.dataset, log=rep.message)
        current = ctx.dataset.table_sources()
        for s, why in singles:
            ls = made[s.name]
            srcs = ls.sources()
            if any(srcs[t] != current.get(t) for t in srcs):
                if spec.capabilities.switch:
                    for t, src in srcs.items():
                        if src != current.get(t):
                            rt.switch_table(t, src.to_json())
                else:  # an engine that cannot switch: a deployment per layout
                    rt.stop()
                    rt = spec.runtime_class()()
                    rt.start(p, dataset=ctx.dataset.with_sources(srcs, layout=s.name), log=rep.message)
                current = dict(srcs)
            rep.message(f"measuring {s.name}: {len(ctx.statements)} queries x {cfg.runs} runs")
            entries[s.name] = _measure_layout(ctx, rt, s, why, ls)
            tiles = _tiles(spec, p, ls)
            if tiles:
                entries[s.name]["tiles"] = tiles
            doc["layouts"] = [entries[x.name] for x, _ in specs if x.name in entries]
            if writer:
                writer.write(doc)
    finally:
        rt.stop()
    for s, why in specs:
        if s.copies == 2:
            entries[s.name] = _two_copies(ctx, s, why, made[s.name], entries)


def _measure_layout(ctx: _Ctx, rt, s: L.LayoutSpec, why: str, ls: L.LayoutSet) -> dict:
    cfg = ctx.cfg
    files = [f for src in ls.sources().values() for f in src.files]
    queries = {}
    for st in ctx.statements:
        try:
            r = rt.run_query(st.sql, timeout_s=cfg.timeout_s)  # unmeasured: engine caches warm, answer checked
        except TilewiseError as e:
            raise TilewiseError(f"{st.where} failed on layout {s.name}: {e}") from None
        valid = _check(ctx, st, s.name, r)
        samples = [measure.run(rt, st.sql, files=files, drop=cfg.drop, timeout_s=cfg.timeout_s)[1]
                   for _ in range(cfg.runs)]
        queries[st.key] = _query_entry(samples, valid)
    return _entry(s, why, ls, queries)


def _query_entry(samples, valid: bool | None, copy: str | None = None) -> dict:
    times = [x.time_s for x in samples]
    qs = stats.query_stats(times)
    out = {"times_s": times, "median_s": qs["median_s"], "ci95": qs["ci95_s"],
           "bytes_read_runs": [x.bytes_read for x in samples], "bytes_requested_runs": [x.bytes_requested for x in samples],
           "cpu_s_runs": [x.cpu_s for x in samples]}
    out["bytes_read"] = stats.summarize(out["bytes_read_runs"])["median"]
    out["bytes_requested"] = stats.summarize(out["bytes_requested_runs"])["median"]
    out["cpu_s"] = stats.summarize(out["cpu_s_runs"])["median"]
    out["valid"] = valid
    if copy is not None:
        out["copy"] = copy
    return out


def _entry(s: L.LayoutSpec, why: str, ls: L.LayoutSet, queries: dict) -> dict:
    runs = min((len(q["times_s"]) for q in queries.values()), default=0)
    per_run = [sum(q["times_s"][i] for q in queries.values()) for i in range(runs)]
    summ = stats.summarize(per_run)
    files = {}
    for t, cs in ls.copies.items():
        for c in cs:
            sz = [int(b) for b in c.source.extra.get("bytes") or []] or [c.source.bytes]
            key = t if c is cs[0] else f"{t} ({c.source.layout})"
            files[key] = {"files": len(c.source.files), "row_groups": sum(c.source.extra.get("row_groups") or []) or None,
                          "bytes": sum(sz), "max_file_bytes": max(sz)}
    cost = ls.cost()
    tables = {t: [{"copy": c.source.layout, "time_s": (c.manifest.get("cost") or {}).get("time_s"),
                   "cpu_s": (c.manifest.get("cost") or {}).get("cpu_s"),
                   "bytes_written": (c.manifest.get("cost") or {}).get("bytes_written"), "made_now": c.built}
                  for c in cs] for t, cs in ls.copies.items()} if not s.raw else {}
    return {
        "name": s.name, "spec": s.to_json(), "why": why, "queries": queries,
        "workload": {"median_s": sum(q["median_s"] for q in queries.values()) if queries else None,
                     "runs_s": per_run, "ci95": summ["ci95"],
                     "bytes_read": sum(q["bytes_read"] or 0 for q in queries.values()),
                     "cpu_s": sum(q["cpu_s"] or 0 for q in queries.values())},
        "transform": {**cost, "tables": tables} if not s.raw else {"time_s": 0.0, "cpu_s": 0.0, "bytes_written": 0,
                                                                   "tables": {}},
        "files": files, "storage_bytes": sum(f["bytes"] for f in files.values()),
        "max_file_bytes": max((f["max_file_bytes"] for f in files.values()), default=0),
    }


def _tiles(spec, p, ls: L.LayoutSet) -> dict | None:
    """For an engine whose workers share each scan (its split rule, engines.splits): per Parquet
    table, the tasks, files, row groups and bytes each tile gets."""
    if spec.scan_split is None or spec.capabilities.replicas:
        return None
    cores = sum(len(i.cpus) for i in p.instances)
    return {t: splits.per_tile(scan_files(src), len(p.instances), cores, spec.scan_split)
            for t, src in ls.sources().items() if src.format == "parquet"} or None


def _two_copies(ctx: _Ctx, s: L.LayoutSpec, why: str, ls: L.LayoutSet, entries: dict) -> dict:
    """Per query the runs of the copy its predicates choose (the sorted one when it filters on the
    sort column); both copies' files and what making both cost."""
    plain = entries[L.LayoutSpec("parquet", s.files, s.row_group_rows).name]
    srt = entries[L.LayoutSpec("parquet", s.files, s.row_group_rows, s.sort, 1).name]
    table = L.sort_table(s, ctx.sources)
    queries = {}
    for st in ctx.statements:
        use_sorted = W.filters_on(st.sql, table, s.sort, ctx.columns)
        q = dict((srt if use_sorted else plain)["queries"][st.key])
        q["copy"] = "sorted" if use_sorted else "original"
        queries[st.key] = q
    e = _entry(s, why, ls, queries)
    e["measured_from"] = {"original": plain["name"], "sorted": srt["name"]}
    return e


def _check(ctx: _Ctx, st: W.Statement, layout: str, r) -> bool | None:
    """The answer is right: against the benchmark's reference (its own Parquet, DataFusion), else
    against the answer on the data as it is. A wrong one is recorded (and fails the command)."""
    if not ctx.cfg.validate:
        return None
    if ctx.reference is not None and st.query is not None:
        spec = benchmarks.get(ctx.cfg.benchmark)
        try:
            chk = ctx.reference.check_sql(st.sql, spec.catalog.ref_key(st.query), list(r.rows), st.query)
        except validate.NoReference:
            return None
    else:
        if st.key not in ctx.answers:
            ctx.answers[st.key] = (list(r.columns), list(r.rows))
            return True
        cols, rows = ctx.answers[st.key]
        keys = sqlshape.order_columns(sqlshape.analyse(st.sql), cols)
        chk = validate.compare(validate.norm_rows(r.rows), validate.norm_rows(rows), None, keys)
    if not chk.ok:
        ctx.wrong.append(f"{st.key} on {layout}: {chk.detail}")
    return chk.ok
