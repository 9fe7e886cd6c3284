"""The ``benchmark`` result kind (`bench <benchmark>`: TPC-H, JCC-H, TPC-DS, any benchmark of the
registry tilewise.benchmarks): per policy, per query, every run's time; the benchmark's own
metrics per run (TPC-H's Power@Size, Throughput@Size, QphH@Size) in `runs` (and the warm-up's in
`warmup`); the summary per policy; the tables, CSV files (`<benchmark>_metrics.csv`) and plots; the
older formats it upgrades on load (the ``tpch`` kind, whose runs were `tpch_runs`/`tpch_warmup`,
and ``tilewise-tpch-results/1``); and, in `tilewise report`, two benchmarks side by side (TPC-H
next to JCC-H, the NUMA study's comparison).

The harness (bench.harness) builds the document as JSON and stores per query the statistics of
``stats.query_stats``; this module reads it through the dataclasses below. What a benchmark is
called and which figures it has come from its spec (tilewise.benchmarks), not from its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tilewise import benchmarks
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import document, stats
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

SPREAD_WARN = 0.10  # relative spread (max-min)/median above which a measurement is called unstable
# the figures of a benchmark this tilewise does not have (a plug-in's results read elsewhere): TPC-H's
FIGURES = (("power_at_size", "Power@Size"), ("throughput_at_size", "Throughput@Size"), ("qphh_at_size", "QphH@Size"))


def benchmark_spec(name: str):
    """The benchmark's spec from the registry; None when this tilewise does not have it."""
    try:
        return benchmarks.get(name)
    except TilewiseError:
        return None


# ---- the typed document --------------------------------------------------------------------------

@dataclass
class Query(Record):
    times_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    rows: int | None = None
    valid: bool | None = None
    # the statistics of the timed runs (results.stats.query_stats)
    n: int | None = None
    median_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    mean_s: float | None = None
    stdev_s: float | None = None
    ci95_s: list[float] | None = None
    rel_spread: float | None = None
    outliers: list[int] = field(default_factory=list)
    error: str | None = None  # why its answer is wrong, or the engine's error
    failed: str | None = None  # the engine could not run it: its error
    not_comparable: str | None = None  # the reference engine has no answer for it (valid is None)
    rewritten: bool = False  # the engine ran its dialect hook's rewrite of the text (EngineSpec.dialect)

    @property
    def unstable(self) -> bool:
        return bool(self.rel_spread and self.rel_spread > SPREAD_WARN and len(self.times_s) > 1)


@dataclass
class PowerTest(Record):
    """One stream of every query, the refresh functions around it (their seconds, keyed by the
    benchmark's function names, "rf1_s", are extra)."""
    order: list = field(default_factory=list)
    queries: dict[str, float] = field(default_factory=dict)
    refresh: str | None = None
    wall_s: float | None = None


@dataclass
class Stream(Record):
    stream: int | None = None
    order: list = field(default_factory=list)
    queries: dict[str, float] = field(default_factory=dict)


@dataclass
class ThroughputTest(Record):
    streams: list[Stream] = field(default_factory=list)
    refresh_stream: list[dict] | None = None  # per update set: {"set", "rf1_s", "rf2_s"} (the benchmark's names)
    interval_s: float | None = None


@dataclass
class Run(Record):
    """One run's tests (TPC-H 5.3: power and throughput) and the benchmark's figures (TPC-H's
    below; another benchmark's, named by its metrics, are extra)."""
    run: int | None = None
    power: PowerTest | None = None
    throughput: ThroughputTest | None = None
    failed: list[str] = field(default_factory=list)  # queries the engine could not run in it
    wall_s: float | None = None
    power_at_size: float | None = None
    throughput_at_size: float | None = None
    qphh_at_size: float | None = None

    def figure(self, key: str) -> float | None:
        return getattr(self, key) if key in self.__dataclass_fields__ else self.get(key)


@dataclass
class Instance(Record):
    """One plan instance as planned, its binding as read back, and its settings as the engine
    reports them."""
    id: int | None = None
    cpus: list[int] = field(default_factory=list)
    mem_nodes: list[int] = field(default_factory=list)
    mem_policy: str | None = None
    numa_nodes: list[int] = field(default_factory=list)
    l3_domains: list[int] = field(default_factory=list)
    pid: int | None = None
    binding_verified: bool | None = None
    healthy: bool | None = None
    verification: str | None = None  # verified | mismatch | not checkable (verification.VERDICT_TEXT)
    checks: dict | None = None  # per item, what /proc read back (verification.Check)
    detail: str | None = None
    load_s: float | None = None
    threads: int | None = None
    memory_mb: int | None = None
    settings: dict | None = None
    load: dict | None = None
    rss_loaded_mb: float | None = None
    rss_anon_loaded_mb: float | None = None
    rss_peak_mb: float | None = None


@dataclass
class Policy(Record):
    policy: str | None = None
    requested: str | None = None  # the policy as asked (auto resolves to another)
    reasons: list[str] = field(default_factory=list)
    same_as: str | None = None  # the same deployment as an earlier policy: not run again
    instances: list[Instance] = field(default_factory=list)
    start_s: float | None = None
    idle_instances: int | None = None
    tiles: dict | None = None
    queries: dict[str, Query] = field(default_factory=dict)
    run_wall_s: list[float] = field(default_factory=list)
    warmup_wall_s: list[float] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    warmup: list[Run] = field(default_factory=list)
    complete: bool = False
    error: str | None = None

    @property
    def measured(self) -> bool:
        return not self.same_as and any(q.times_s for q in self.queries.values())

    def median(self, q: str) -> float | None:
        rec = self.queries.get(q)
        return rec.median_s if rec else None


@dataclass
class Dataset(Record):
    benchmark: str | None = None


@dataclass
class Params(Record):
    engine: str | None = None
    sf: float | str | None = None
    policies: list[str] = field(default_factory=list)
    queries: list = field(default_factory=list)
    streams: int | None = None
    streams_requested: int | None = None
    runs: int | None = None
    warmup: bool | None = None
    tests: list[str] | None = None
    refresh: bool | None = None  # --refresh/--no-refresh as given (None: where it applies)
    allocator: str | None = None
    exchange: str | None = None  # the transport between cooperating tiles, where the engine offers a choice
    mem: str | None = None
    smt: bool | None = None
    dataset: Dataset | None = None
    benchmark: str | None = None
    query_params: str | None = None
    query_seed: int | None = None
    mem_variants: list[str] = field(default_factory=list)
    query_timeout_s: float | None = None
    layout: str | None = None


@dataclass
class PolicyList(Record):
    policies: list[str] = field(default_factory=list)
    queries: list | dict = field(default_factory=list)  # requested: ["q1", ...]; completed: {policy: [...]}


@dataclass
class Refresh(Record):
    """Whether the refresh functions ran, and the benchmark's description of them (extra)."""
    applied: bool = False
    supported: bool | None = None
    reason: str | None = None  # why they did not run
    sets: list[dict] = field(default_factory=list)
    restore: str | None = None


@dataclass
class Validation(Record):
    reference: str | None = None  # the reference engine and its version
    float_rel_tol: float | None = None
    rules: dict | None = None
    enabled: bool | None = None
    wrong_answers: list[str] = field(default_factory=list)
    failed_queries: list[str] = field(default_factory=list)
    not_comparable: list[str] = field(default_factory=list)
    references: dict | None = None  # how many answers were computed and cached


@dataclass
class BenchmarkDoc(document.Document):
    params: Params = field(default_factory=Params)
    policies: dict[str, Policy] = field(default_factory=dict)
    requested: PolicyList | None = None
    completed: PolicyList | None = None
    validation: Validation | None = None
    refresh: Refresh | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def benchmark(self) -> str:
        """The benchmark's name in the registry ("tpch", "jcch", ...)."""
        p = self.params
        return p.benchmark or (p.dataset.benchmark if p.dataset else None) or "tpch"

    @cached_property
    def spec(self):
        return benchmark_spec(self.benchmark)

    @property
    def bench_name(self) -> str:
        """What the benchmark is called: "TPC-H", "JCC-H"."""
        return self.spec.title if self.spec else self.benchmark

    @property
    def heading(self) -> str:
        """The benchmark in titles, with its query parameter set: "TPC-H", "JCC-H (skewed)"."""
        qp = self.params.query_params
        if self.spec:
            return self.spec.heading(qp)
        return f"{self.benchmark} ({qp})" if qp else self.benchmark

    @property
    def figures(self) -> tuple[tuple[str, str], ...]:
        """The benchmark's figures per run: (key in a run's record, title)."""
        return tuple(self.spec.metrics.names) if self.spec else FIGURES

    @property
    def title(self) -> str:
        sf = self.params.sf
        sf_s = f"{sf:g}" if isinstance(sf, (int, float)) else str(sf)
        return f"{self.heading} {self.params.engine} SF {sf_s}"

    def ran(self) -> list[str]:
        """Policies with figures of their own (not the same deployment as an earlier one)."""
        return [n for n, p in self.policies.items() if not p.same_as]

    def measured(self) -> list[str]:
        """Policies with at least one timed query (the first is the baseline)."""
        return [n for n, p in self.policies.items() if p.measured]

    def baseline(self) -> Policy:
        ran = self.ran()
        return self.policies[ran[0]] if ran else Policy()


# ---- metrics and the summary ---------------------------------------------------------------------

def metrics(doc: BenchmarkDoc) -> list[dict]:
    out = []
    for pol, rec in doc.policies.items():
        if rec.same_as:
            continue  # not run: it is the same deployment as an earlier policy
        for q, r in rec.queries.items():
            if r.times_s:
                out.append(document.metric(f"{pol}/{q}", r.times_s, unit="s", warmups=r.warmup_s, policy=pol, query=q))
        if rec.run_wall_s:
            out.append(document.metric(f"{pol}/run_wall", rec.run_wall_s, unit="s", warmups=rec.warmup_wall_s,
                                    policy=pol))
        for key, _ in doc.figures:
            vals = [r.figure(key) for r in rec.runs]
            if any(v is not None for v in vals):
                out.append(document.metric(f"{pol}/{key.replace('_at_size', '@size')}", vals, unit="queries/h",
                                        better="higher", policy=pol))
    return out


@dataclass
class PolicySummary:
    """The figures of one policy over its runs; the first policy that ran is the baseline."""
    same_as: str | None = None
    complete: bool = False
    runs: int = 0
    total: dict = field(default_factory=dict)  # stats.summarize of the runs' wall times
    sum_of_query_medians_s: float | None = None
    geomean_speedup_vs_baseline: float | None = None
    throughput_speedup_vs_baseline: float | None = None
    valid: bool | None = None
    not_comparable: int = 0  # queries without a reference answer (not validated, never called valid)
    tpch: dict[str, dict] = field(default_factory=dict)  # the benchmark's figures (power_at_size ...) -> stats.summarize

    def to_json(self) -> dict:
        if self.same_as:
            return {"same_as": self.same_as, "complete": self.complete}
        t = self.total
        return {"same_as": None, "runs": self.runs, "total_s": t.get("median"), "total_min_s": t.get("min"),
                "total_max_s": t.get("max"), "total_ci95_s": t.get("ci95"), "total_outliers": t.get("outliers", []),
                "sum_of_query_medians_s": self.sum_of_query_medians_s,
                "geomean_speedup_vs_baseline": self.geomean_speedup_vs_baseline,
                "throughput_speedup_vs_baseline": self.throughput_speedup_vs_baseline,
                "valid": self.valid, "not_comparable": self.not_comparable, "complete": self.complete, **self.tpch}


def summarize(doc: BenchmarkDoc) -> dict[str, PolicySummary]:
    base = doc.baseline()
    base_total = stats.summarize(base.run_wall_s)["median"]
    out: dict[str, PolicySummary] = {}
    for name, p in doc.policies.items():
        if p.same_as:
            out[name] = PolicySummary(same_as=p.same_as, complete=p.complete)
            continue
        speedups = []
        for q, rec in p.queries.items():
            b, m = base.median(q), rec.median_s
            if b and m:
                speedups.append(b / m)
        total = stats.summarize(p.run_wall_s)
        s = PolicySummary(
            complete=p.complete, runs=total["n"], total=total,
            sum_of_query_medians_s=sum(r.median_s for r in p.queries.values() if r.median_s) or None,
            geomean_speedup_vs_baseline=stats.geomean(speedups),
            throughput_speedup_vs_baseline=(base_total / total["median"]) if base_total and total["median"] else None,
            valid=all_valid([r.valid for r in p.queries.values()]),
            not_comparable=sum(1 for r in p.queries.values() if r.not_comparable))
        for key, _ in doc.figures:
            vals = [r.figure(key) for r in p.runs if r.figure(key) is not None]
            if vals:
                s.tpch[key] = stats.summarize(vals)
        out[name] = s
    return out


def all_valid(verdicts: list[bool | None]) -> bool | None:
    """False when an answer was wrong (or a query failed), True when every one was valid, else None
    (not validated, or without a reference answer)."""
    if not verdicts:
        return None
    if any(v is False for v in verdicts):
        return False
    return True if all(v is True for v in verdicts) else None


def answers_cell(s: PolicySummary) -> str:
    if s.valid is False:
        return "WRONG"
    if s.not_comparable:
        return f"valid, {s.not_comparable} not comparable" if s.valid is None else "valid"
    return "valid" if s.valid else "-"


def summary_json(doc: BenchmarkDoc) -> dict:
    """doc["summary"], stored beside the raw values when the document is written."""
    return {n: s.to_json() for n, s in summarize(doc).items()}


# ---- tables -------------------------------------------------------------------------------------

def render(doc: BenchmarkDoc, out) -> None:
    pols = doc.policies
    p = doc.params
    measured = doc.measured()
    if doc.interrupted:
        done = doc.completed.policies if doc.completed else []
        asked = doc.requested.policies if doc.requested else []
        out.print(f"INTERRUPTED: {len(done)} of {len(asked)} policies completed ({', '.join(done) or 'none'}); "
                  "the tables show only what was measured", markup=False)
    if not measured:
        out.print("no measurements to show" + (" (interrupted before the first timed run)" if doc.interrupted else ""),
                  markup=False)
        T.footer(doc, out, notes=doc.notes)
        return
    summ = summarize(doc)
    source = "power test, one stream" if "power" in (p.tests or []) else f"{p.streams} stream(s)"
    qt = T.table(f"{doc.title}: median seconds per query ±95 % CI ({p.runs} timed run(s), {source})",
                 ["query", *measured], left=["query"])
    for q in _queries(doc, measured):
        cells = []
        for n in measured:
            rec = pols[n].queries.get(q)
            if rec and rec.failed:
                cells.append("FAILED")  # the engine could not run it (its error is in results.json)
                continue
            if not rec or not rec.times_s:
                cells.append("-")
                continue
            c = T.fmt(rec.median_s)
            half = T.ci_half(rec.ci95_s)
            if half is not None:
                c += f" ±{half:.3f}"
            if rec.valid is False:
                c += " WRONG"
            elif rec.not_comparable:
                c += " n/c"
            elif rec.unstable:
                c += " ~"
            if rec.outliers:
                c += " !"
            cells.append(c)
        qt.add_row(q, *cells)
    out.print(qt)
    st = T.table("summary: total s = median wall time of a run (throughput test when it ran); "
                 "x = speedup over the first policy",
                 ("policy", "inst", "n", "total s", "min-max", "95 % CI", "geomean x", "thrpt x", "answers"),
                 left=["policy"])
    for n, rec in pols.items():
        s = summ[n]
        label = n if rec.policy in (None, n) else f"{n} ({rec.policy})"
        inst = str(len(rec.instances))
        if rec.same_as:
            same = f"= {rec.same_as}"
            st.add_row(label, inst, "", same, "", "", same, same, "")
            continue
        if n not in measured:
            st.add_row(label, inst, "0", "not measured" if not rec.error else "failed", "", "", "", "", "")
            continue
        ci = s.total.get("ci95")
        st.add_row(label, inst, str(s.runs or 0), T.fmt(s.total.get("median")),
                   f"{T.fmt(s.total.get('min'))}-{T.fmt(s.total.get('max'))}",
                   f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-",
                   T.fmt(s.geomean_speedup_vs_baseline, ".2f"), T.fmt(s.throughput_speedup_vs_baseline, ".2f"),
                   answers_cell(s))
    out.print(st)
    if any(summ[n].tpch for n in measured):
        how = "with refresh functions RF1/RF2" if doc.refresh and doc.refresh.applied else "without refresh functions"
        mt = T.table(f"{doc.heading} metrics at SF {p.sf} ({how}; median over runs, 95 % CI)",
                     ("policy", *(title for _, title in doc.figures), "streams"), left=["policy"])
        # the throughput test's streams; a run without it has none to show
        streams = str(p.streams) if "throughput" in (p.tests or ["throughput"]) else "-"
        for n, rec in pols.items():
            if rec.same_as:
                mt.add_row(n, *[f"= {rec.same_as}"] * len(doc.figures), "")
                continue
            mt.add_row(n, *(_metric_cell(summ[n].tpch.get(k)) for k, _ in doc.figures), streams)
        out.print(mt)
    marks = []
    if any(r.not_comparable for n in measured for r in pols[n].queries.values()):
        marks.append("n/c = not comparable: the reference engine has no answer for it (see results.json)")
    if any(r.failed for n in measured for r in pols[n].queries.values()):
        marks.append("FAILED = the engine could not run it (its error is in results.json)")
    if any(r.unstable for n in measured for r in pols[n].queries.values()):
        marks.append(f"~ = varies by more than {SPREAD_WARN:.0%} between runs (use more --runs and a quiet machine)")
    if any(r.outliers for n in measured for r in pols[n].queries.values()):
        marks.append("! = a run is an outlier (modified z-score > 3.5; see results.json)")
    T.far_memory(doc.get("far_memory") or {}, out)
    render_layout(doc, out)
    render_tiles(doc, out)
    T.footer(doc, out, notes=marks + doc.notes)


def render_layout(doc: BenchmarkDoc, out) -> None:
    """`bench --layout`: the layout the engine read, and per tile how each table's scan split
    (predicted from the engine's split rule) beside what each tile read per query (measured)."""
    lay = doc.get("layout")
    if not lay:
        return
    tabs = lay.get("tables") or {}
    big = max(tabs, key=lambda t: tabs[t].get("bytes") or 0) if tabs else None
    shown = f"; largest table {big}: {tabs[big]['files']} file(s), {tabs[big].get('row_groups') or '-'} row group(s), " \
            f"{(tabs[big].get('bytes') or 0) / 1e6:.2f} MB" if big else ""
    out.print(f"layout {lay.get('name')} read in place from {lay.get('dir')}{shown}", markup=False, highlight=False)
    for n, rec in doc.policies.items():
        tiles = rec.tiles
        if not tiles:
            continue
        pred = (tiles.get("predicted") or {}).get(big) or []
        t = T.table(f"{n}: {big} per tile, predicted by the engine's split rule (tasks, files, row groups, MB) and "
                    f"measured per query in the {tiles.get('measured_in')} run (tasks, MB read)",
                    ("tile", "predicted", *tiles.get("queries", {})), left=["tile"])
        ids = sorted({p["tile"] for p in pred} | {x["tile"] for q in tiles.get("queries", {}).values() for x in q})
        for i in ids:
            p = next((x for x in pred if x["tile"] == i), None)
            cells = [f"{p['tasks']} / {p['files']} / {p['row_groups']} / {p['bytes'] / 1e6:.2f}" if p else "-"]
            for q in tiles.get("queries", {}).values():
                m = next((x for x in q if x["tile"] == i), None)
                cells.append(f"{m['tasks']} / {m['input_bytes'] / 1e6:.2f}" if m else "-")
            t.add_row(str(i), *cells)
        out.print(t)


TILE_SUMS = ("tasks", "rows_scanned", "bytes_in", "messages_in", "latency_ns", "decode_ns")


def tile_balance(queries: dict[str, list[dict]], key: str = "rows_scanned"
                 ) -> tuple[dict[int, dict], str | None, float | None]:
    """Per tile, the sums over the measured run's queries; and the query whose `key` (rows scanned,
    bytes received) was spread most unevenly over the tiles, with its max/mean (1.0 = even). A query
    whose figures the engine could not collect (`unmeasured`: unmeasured_queries) is left out."""
    sums: dict[int, dict] = {}
    worst, worst_ratio = None, None
    for q, rows in queries.items():
        if q in unmeasured_queries(queries):
            continue
        for x in rows:
            acc = sums.setdefault(x["tile"], dict.fromkeys(TILE_SUMS, 0))
            for k in TILE_SUMS:
                acc[k] += x.get(k, 0)
        values = [x.get(key, 0) for x in rows]
        if len(values) > 1 and sum(values) > 0:
            ratio = max(values) / (sum(values) / len(values))
            if worst_ratio is None or ratio > worst_ratio:
                worst, worst_ratio = q, ratio
    return sums, worst, worst_ratio


def unmeasured_queries(queries: dict[str, list[dict]]) -> list[str]:
    """The queries whose per-tile figures the engine could not collect (a task's metrics never came)."""
    return [q for q, rows in queries.items() if any(x.get("unmeasured", 0) for x in rows)]


def render_tiles(doc: BenchmarkDoc, out) -> None:
    """Cooperating tiles that say what each did per query (rows scanned, what their exchange received):
    per tile, the sums over the measured run, and how evenly the scans were spread."""
    for n, rec in doc.policies.items():
        queries = (rec.tiles or {}).get("queries") or {}
        if not any("rows_scanned" in x for rows in queries.values() for x in rows):
            continue
        sums, _, _ = tile_balance(queries)
        missing = unmeasured_queries(queries)
        t = T.table(f"{n}: per tile over the {rec.tiles.get('measured_in')} run's {len(queries) - len(missing)} queries "
                    "(the engine's own metrics): tasks, rows its scans produced, and what its exchange received -- MB, "
                    "messages, the messages' summed latency (send to receipt) and the time spent decoding them"
                    + (f"; without figures (a task's metrics never came), not counted: {', '.join(missing)}"
                       if missing else ""),
                    ("tile", "tasks", "rows scanned", "MB in", "messages", "latency s", "decode s"), left=["tile"])
        for i in sorted(sums):
            x = sums[i]
            t.add_row(str(i), str(x["tasks"]), f"{x['rows_scanned']:,}", f"{x['bytes_in'] / 1e6:.2f}",
                      str(x["messages_in"]), f"{x['latency_ns'] / 1e9:.3f}", f"{x['decode_ns'] / 1e9:.3f}")
        out.print(t)
        for key, what in (("rows_scanned", "rows scanned"), ("bytes_in", "bytes received")):
            total = [sums[i][key] for i in sorted(sums)]
            if len(total) > 1 and sum(total):
                _, worst, ratio = tile_balance(queries, key)
                out.print(f"{n}: {what} per tile, max/mean {max(total) / (sum(total) / len(total)):.2f} over the run"
                          + (f"; most uneven query {worst} ({ratio:.2f})" if worst else "") + " (1.00 = even)",
                          markup=False, highlight=False)


def _metric_cell(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    ci = s.get("ci95")
    return f"{s['median']:.1f}" + (f" ({ci[0]:.1f}-{ci[1]:.1f})" if ci else "")


def _qnum(q: str) -> tuple[int, str]:
    """Sort key of a query name: "q2" < "q10" < "q14a" < "q14b" < "q15"."""
    import re

    m = re.fullmatch(r"q?(\d+)(.*)", q)
    return (int(m.group(1)), m.group(2)) if m else (0, q)


def _queries(doc: BenchmarkDoc, policies: Sequence[str]) -> list[str]:
    """The timed (or failed) queries of these policies, in query-number order."""
    qs: list[str] = []
    for n in policies:
        for q, rec in doc.policies[n].queries.items():
            if q not in qs and (rec.times_s or rec.failed):
                qs.append(q)
    return sorted(qs, key=_qnum)


# ---- CSV ----------------------------------------------------------------------------------------

def csv_files(doc: BenchmarkDoc) -> dict[str, str]:
    base = doc.baseline()
    rows = []
    for name, p in doc.policies.items():
        if p.same_as:
            continue
        for q, rec in p.queries.items():
            b = base.median(q)
            sp = (b / rec.median_s) if b and rec.median_s else None
            for i, t in enumerate(rec.times_s, 1):
                rows.append([name, q, i, f"{t:.6f}", T.fmt(rec.median_s, ".6f", ""), T.fmt(rec.rel_spread, ".4f", ""),
                             rec.rows, rec.valid, T.fmt(sp, ".4f", ""), len(p.instances),
                             "yes" if (i - 1) in rec.outliers else ""])
    files = {}
    if rows:
        files["results.csv"] = T.csv_text(["policy", "query", "run", "time_s", "median_s", "rel_spread", "rows", "valid",
                                           "speedup_vs_baseline", "instances", "outlier"], rows)
    mrows = []
    for name, p in doc.policies.items():
        for r in p.runs:
            mrows.append([name, r.run, *(T.fmt(r.figure(k), ".3f", "") for k, _ in doc.figures),
                          T.fmt(r.throughput.interval_s if r.throughput else None, ".6f", ""),
                          (r.power.refresh if r.power else None) or ""])
    if mrows:
        files[f"{doc.benchmark}_metrics.csv"] = T.csv_text(["policy", "run", *(k for k, _ in doc.figures), "throughput_interval_s",
                                                "refresh"], mrows)
    return files


# ---- plots (bars with their 95 % confidence intervals) ----------------------------------------------

def speedup(base: Sequence[float], other: Sequence[float]) -> dict | None:
    """How much faster `other` is than `base`: the ratio of the geometric means of the runs with
    its 95 % interval (Welch's t on the logarithms, as `tilewise report` compares runs)."""
    return stats.ratio_ci(other, base)


def plots(doc: BenchmarkDoc, out_dir: Path) -> list[Path]:
    ran = _ran(doc)
    if not ran:
        return []
    base_name = ran[0]
    base = doc.policies[base_name]
    qs = [q for q, r in base.queries.items() if r.median_s]
    p = doc.params
    tag = f"{p.engine} SF {p.sf}, {p.streams or 1} stream(s)"
    bench = doc.heading
    paths = []
    if qs and len(ran) > 1:
        series, intervals = {}, {}
        for name in ran:
            vals, cis = [], []
            for q in qs:
                mine = doc.policies[name].queries.get(q)
                r = speedup(base.queries[q].times_s, mine.times_s) if mine else None
                vals.append(r["ratio"] if r else None)
                cis.append(r["ci95"] if r and name != base_name else None)
            series[name], intervals[name] = vals, cis
        paths.append(P.bar_chart(out_dir / "speedup_per_query.png", qs, series, intervals=intervals,
                                 ylabel=f"speedup over {base_name}\n(geometric means, 95 % CI)",
                                 title=f"{bench} per-query speedup over {base_name} ({tag})"))
    summ = summarize(doc)
    geo = [summ[n].geomean_speedup_vs_baseline for n in ran]
    thr, thr_ci = [], []
    for n in ran:
        r = speedup(base.run_wall_s, doc.policies[n].run_wall_s)
        thr.append(r["ratio"] if r else None)
        thr_ci.append(r["ci95"] if r and n != base_name else None)
    if len(ran) > 1 and any(v is not None for v in geo + thr):
        thr_label = "throughput (total time) speedup"
        paths.append(P.bar_chart(out_dir / "geomean_speedup.png", ran,
                                 {"geomean per-query speedup": geo, thr_label: thr}, intervals={thr_label: thr_ci},
                                 ylabel=f"speedup over {base_name}\n(whiskers: 95 % CI)",
                                 title=f"{bench} geomean per policy ({tag})"))
    figs = {title: [summ[n].tpch.get(k) or {} for n in ran] for k, title in doc.figures}
    if any(s.get("median") is not None for ss in figs.values() for s in ss):
        paths.append(P.bar_chart(out_dir / f"{doc.benchmark}_metrics.png", ran,
                                 {title: [s.get("median") for s in ss] for title, ss in figs.items()},
                                 intervals={title: [s.get("ci95") for s in ss] for title, ss in figs.items()},
                                 ylabel=f"queries per hour{' x SF' if doc.figures == FIGURES else ''}\n"
                                        "(median, whiskers: 95 % CI)",
                                 title=f"{bench} metrics per policy ({tag})", reference_line=None))
    return paths


# ---- two benchmarks side by side (TPC-H next to JCC-H: the NUMA study's comparison) -----------------

def _speedups(doc: BenchmarkDoc, base: str, pol: str, queries: list[str]) -> list[float | None]:
    out = []
    for q in queries:
        b, m = doc.policies[base].median(q), doc.policies[pol].median(q)
        out.append(b / m if b and m else None)
    return out


def _ran(doc: BenchmarkDoc) -> list[str]:
    return [n for n, p in doc.policies.items() if not p.same_as and any(q.median_s for q in p.queries.values())]


def _order(name: str) -> tuple[int, str]:
    known = benchmarks.names()
    return (known.index(name) if name in known else len(known), name)


def benchmark_pair(runs: Sequence[tuple[str, dict]]) -> tuple[tuple[str, dict], tuple[str, dict]] | None:
    """Two runs of two different benchmarks, one run each (in the registry's order: TPC-H before
    JCC-H), among the runs of this kind; None otherwise."""
    by: dict[str, list[tuple[str, dict]]] = {}
    for lbl, d in runs:
        if d.get("kind") == KIND.name:
            by.setdefault(KIND.view(d).benchmark, []).append((lbl, d))
    if len(by) != 2 or any(len(v) != 1 for v in by.values()):
        return None
    first, second = sorted(by, key=_order)
    return by[first][0], by[second][0]


def benchmark_comparison(a_doc: dict, b_doc: dict) -> dict:
    """Per-query speedup of each policy over the baseline on one benchmark next to another, same
    engine and policies: the study's comparison (one instance per NUMA node gained less on JCC-H,
    2.17x/2.25x geomean against 2.65x/3.33x on TPC-H). The baseline is the first policy measured in
    both. Keyed by the benchmarks' names ("tpch", "jcch")."""
    a, b = KIND.view(a_doc), KIND.view(b_doc)
    e1, e2 = a.params.engine, b.params.engine
    if e1 != e2:
        raise UsageError(f"the {a.bench_name} run used {e1} and the {b.bench_name} run {e2}",
                         "compare runs of the same engine")
    common = [n for n in _ran(a) if n in _ran(b)]
    if len(common) < 2:
        raise UsageError(f"the {a.bench_name} and {b.bench_name} runs share fewer than 2 measured policies",
                         "run both with the same --policies, e.g. wim,wic,auto")
    base = common[0]
    queries = sorted((q for q in a.policies[base].queries if q in b.policies[base].queries), key=_qnum)
    out = {"engine": e1, "baseline": base, "queries": queries, "policies": {}}
    for v in (a, b):
        out[v.benchmark] = {"sf": v.params.sf, "title": v.title}
        if v.spec is not None and v.spec.params is not None:  # a benchmark with query parameter sets
            out[v.benchmark] |= {"params": v.params.query_params, "seed": v.params.query_seed}
    for pol in common[1:]:
        x, y = _speedups(a, base, pol, queries), _speedups(b, base, pol, queries)
        out["policies"][pol] = {a.benchmark: x, b.benchmark: y,
                                f"{a.benchmark}_geomean": stats.geomean([v for v in x if v]),
                                f"{b.benchmark}_geomean": stats.geomean([v for v in y if v])}
    return out


@dataclass
class BenchmarkComparison:
    """`tilewise report` of runs of two benchmarks: shown, plotted and stored as "<a>_vs_<b>"."""
    data: dict
    names: tuple[str, str]  # the benchmarks' registry names, in order
    titles: tuple[str, str]  # what they are called ("TPC-H", "JCC-H")

    @property
    def key(self) -> str:
        return f"{self.names[0]}_vs_{self.names[1]}"

    def render(self, out) -> None:
        cmp, (a, b) = self.data, self.names
        t = T.table(f"per-query speedup over {cmp['baseline']}: {cmp[a]['title']} next to {cmp[b]['title']}",
                    ["query"], left=["query"])
        for pol in cmp["policies"]:
            for title in self.titles:
                t.add_column(f"{pol} {title}", justify="right")
        for i, q in enumerate(cmp["queries"]):
            t.add_row(q, *(T.fmt(v[k][i], ".2f") for v in cmp["policies"].values() for k in self.names))
        t.add_row("geomean", *(T.fmt(v[f"{k}_geomean"], ".2f") for v in cmp["policies"].values() for k in self.names))
        out.print(t)

    def plot(self, out_dir: Path) -> Path:
        cmp = self.data
        series = {f"{pol} {title}": v[k] + [v[f"{k}_geomean"]] for pol, v in cmp["policies"].items()
                  for k, title in zip(self.names, self.titles)}
        sides = [f"{title} SF {cmp[k]['sf']}" + (f" ({cmp[k]['params']})" if "params" in cmp[k] else "")
                 for k, title in zip(self.names, self.titles)]
        return P.bar_chart(Path(out_dir) / f"{self.key}.png", cmp["queries"] + ["geomean"], series,
                           ylabel=f"speedup over {cmp['baseline']}",
                           title=f"per-query speedup over {cmp['baseline']}, {cmp['engine']}: {sides[0]} next to "
                                 f"{sides[1]}")


def compare(runs: list[tuple[str, dict]]) -> BenchmarkComparison | None:
    pair = benchmark_pair(runs)
    if pair is None:
        return None
    a, b = (KIND.view(d) for _, d in pair)
    return BenchmarkComparison(benchmark_comparison(pair[0][1], pair[1][1]), (a.benchmark, b.benchmark),
                               (a.bench_name, b.bench_name))


# ---- the older formats --------------------------------------------------------------------------

def from_tpch(doc: dict) -> dict:
    """A document of the ``tpch`` kind (every benchmark's, before the kind was named for what it is):
    the same body, its runs under `runs` and `warmup` (were `tpch_runs`, `tpch_warmup`)."""
    doc = dict(doc, kind="benchmark")
    for pol in (doc.get("policies") or {}).values():
        if isinstance(pol, dict):
            for old, new in (("tpch_runs", "runs"), ("tpch_warmup", "warmup")):
                if old in pol:
                    pol[new] = pol.pop(old)
    return doc


def upgrade_1(doc: dict) -> dict:
    """tilewise-tpch-results/1: the body as it is, the parameters gathered from the top level."""
    keys = ("engine", "sf", "streams", "runs", "warmup", "data_dir", "dataset")
    params = {k: doc.get(k) for k in keys}
    params["queries"] = [int(q[1:]) for q in doc.get("queries_run", [])]
    params["policies"] = list(doc.get("policies", {}))
    params["tests"] = ["legacy"]
    env = doc.setdefault("environment", {})
    env.setdefault("engines", {doc.get("engine"): doc.get("engine_version")})
    pols = doc.get("policies", {})
    complete = bool(pols) and all(p.get("complete") for p in pols.values())
    body = {"validation": doc.get("validation"), "policies": pols, "plots": doc.get("plots", [])}
    return document.legacy_envelope(doc, "benchmark", params, body, complete=complete,
                                    interrupted=any(p.get("error") == "interrupted" for p in pols.values()),
                                    started=doc.get("started"), finished=doc.get("finished"),
                                    warnings=doc.get("warnings"))


def owned_files(doc: BenchmarkDoc) -> tuple[str, ...]:
    """What a run may leave in its folder: the tables and plots, and each benchmark's metrics files
    (a folder that held another benchmark's run keeps none of that run's)."""
    names = dict.fromkeys([doc.benchmark, *benchmarks.names()])
    return ("results.csv", "speedup_per_query.png", "geomean_speedup.png",
            *(f"{b}_metrics.{ext}" for b in names for ext in ("csv", "png")))


KIND = Kind(
    name="benchmark", document=BenchmarkDoc, metrics=metrics, summary=summary_json, render=render, csv=csv_files,
    plots=plots, files=owned_files, legacy={("tilewise-tpch-results/1", None): upgrade_1}, compare=compare,
    renamed={"tpch": from_tpch},
)
