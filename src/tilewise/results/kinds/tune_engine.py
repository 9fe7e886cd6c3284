"""The ``tune.engine`` result kind (`tilewise tune --engine E`): paper 003's study on a running
engine. Every configuration's per-query latencies (raw), the engine starts and what was read back
from every process of the instance's tree, and the recommendation; derived: each configuration's
per-query latency change against the default with 95 % intervals and their mean. The table (one
row per query, one column per configuration), CSV files, and Fig. 8 of the paper: latency change
per query per configuration, with the intervals as error bars."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise.results import document, stats
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind


@dataclass
class Run(Record):
    repeat: int | None = None
    query: str = ""
    status: str = ""
    elapsed_s: float | None = None
    error: str | None = None


@dataclass
class Answers(Record):
    checked: int = 0
    wrong: list[str] = field(default_factory=list)
    not_comparable: list[str] = field(default_factory=list)


@dataclass
class Case(Record):
    case: int = 0
    label: str = ""
    config: dict = field(default_factory=dict)
    start: int | None = None
    runs: list[Run] = field(default_factory=list)
    answers: Answers = field(default_factory=Answers)
    failures: list[str] = field(default_factory=list)

    def times(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for r in self.runs:
            out.setdefault(r.query, [])
            if r.status == "ok" and r.elapsed_s is not None:
                out[r.query].append(r.elapsed_s)
        return out


@dataclass
class Start(Record):
    allocator: str = ""
    mem: str = ""
    placement: str = ""
    cases: list[int] = field(default_factory=list)
    start_s: float | None = None
    verification: list[dict] = field(default_factory=list)
    verification_after: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class Verdict(Record):
    label: str = ""
    verdict: str = ""
    reason: str = ""
    gain: float | None = None


@dataclass
class Recommendation(Record):
    label: str = ""
    changed: bool = False
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)


@dataclass
class TuneEngineDoc(document.Document):
    cases: list[Case] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    recommendation: Recommendation | None = None
    reproduce: dict | None = None

    @property
    def queries(self) -> list[str]:
        return list(self.params.get("queries") or [])

    @property
    def title(self) -> str:
        p = self.params
        sf = p.get("sf")
        sf = f"{sf:g}" if isinstance(sf, (int, float)) else sf
        return f"{p.get('engine', '?')}, {p.get('benchmark_title') or p.get('benchmark', '')} SF {sf}"

    def changes(self) -> list[tuple[Case, dict]]:
        """Every configuration but the default, against the default (stats.compare_set)."""
        if not self.cases:
            return []
        base = self.cases[0].times()
        base = {q: base.get(q, []) for q in self.queries} if self.queries else base
        return [(c, stats.compare_set(base, c.times())) for c in self.cases[1:]]


def metrics(doc: TuneEngineDoc) -> list[dict]:
    out = []
    for c in doc.cases:
        for q, ts in c.times().items():
            out.append(document.metric(f"{c.label}/{q}", ts, unit="s", config=c.label, query=q))
    return out


def _change(r: dict | None) -> str:
    if r is None:
        return "-"
    s = f"{(r['ratio'] - 1) * 100:+.1f}"
    ci = r.get("ci95")
    return s + (f" [{(ci[0] - 1) * 100:+.1f},{(ci[1] - 1) * 100:+.1f}]" if ci else "")


def render(doc: TuneEngineDoc, out) -> None:
    p = doc.params
    out.print(f"tune {doc.title}: {len(doc.queries)} queries, {p.get('warmup', 0)} warm-up + {p.get('repeat')} "
              f"runs each, {len(doc.cases)} configurations in {len(doc.starts)} engine start(s)", markup=False)
    if not doc.cases:
        out.print("no configuration measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
        T.footer(doc, out)
        return
    base = doc.cases[0]
    changes = doc.changes()
    cols = ["query", "default ms"] + [c.label for c, _ in changes]
    tab = T.table(f"latency change against the default ({base.label}: median ms), % [95 % CI] (negative: faster)",
                  cols, left=("query",))
    base_t = base.times()
    for q in doc.queries:
        med = stats.summarize(base_t.get(q, []))["median"]
        tab.add_row(q, T.fmt(None if med is None else med * 1e3, ".1f"),
                    *[_change(ch["per_query"].get(q)) for _, ch in changes])
    tab.add_row("mean", "", *[_change(ch["mean"]) for _, ch in changes])
    tab.add_row("faster/slower", "", *[f"{len(ch['faster'])}/{len(ch['slower'])}" for _, ch in changes])
    out.print(tab)
    for c in doc.cases:
        if c.failures:
            out.print(f"{c.label}: failed: {c.failures[0]}" + (f" (+{len(c.failures) - 1} more)" if len(c.failures) > 1 else ""),
                      markup=False)
    for s in doc.starts:
        for v in s.verification_after or s.verification:
            mapped = v.get("allocator_mapped")
            if v.get("processes"):
                unchecked = (f" ({v['not_checkable']} not checkable" + (f": {v['unchecked'][0]}" if v.get("unchecked") else "")
                             + ")") if v.get("not_checkable") else ""
                out.print(f"start {s.allocator}/{s.mem}/{s.placement}: instance {v.get('instance')}: "
                          f"{v.get('verified')} of {v['processes']} process(es) verified{unchecked}"
                          + (f", {s.allocator} mapped in {mapped}" if mapped is not None else "")
                          + (f"; {v['problems'][0]}" if v.get("problems") else ""), markup=False)
    rec = doc.recommendation
    if rec is not None:
        out.print(f"recommendation: {rec.label if rec.changed else 'keep the default (' + rec.label + ')'}", markup=False)
        for r in rec.reasons:
            out.print(f"  - {r}", markup=False)
        others = [v for v in rec.verdicts if v.verdict != "recommended"]
        if others:
            out.print("every configuration:", markup=False)
        for v in others:
            out.print(f"  {v.label}: {v.verdict}: {v.reason}", markup=False)
    repro = doc.reproduce or {}
    for k, v in repro.items():
        out.print(f"{'reproduce' if k == 'tilewise' else k}: {v}", markup=False)
    T.footer(doc, out)


RUN_COLUMNS = ["case", "label", "allocator", "mem", "placement", "thp", "autonuma", "query", "repeat", "status",
               "elapsed_s", "error"]
CHANGE_COLUMNS = ["label", "query", "ratio", "change_pct", "ci_low_pct", "ci_high_pct"]


def csv_files(doc: TuneEngineDoc) -> dict[str, str]:
    runs = []
    for c in doc.cases:
        cfg = c.config
        for r in c.runs:
            runs.append([c.case, c.label, cfg.get("allocator"), cfg.get("mem"), cfg.get("placement"), cfg.get("thp") or "",
                         cfg.get("autonuma") or "", r.query, r.repeat, r.status, "" if r.elapsed_s is None else r.elapsed_s,
                         r.error or ""])
    if not runs:
        return {}
    rows = []
    for c, ch in doc.changes():
        for q, r in [*ch["per_query"].items(), ("mean", ch["mean"])]:
            ci = (r or {}).get("ci95")
            rows.append([c.label, q, "" if r is None else round(r["ratio"], 6),
                         "" if r is None else round((r["ratio"] - 1) * 100, 3),
                         round((ci[0] - 1) * 100, 3) if ci else "", round((ci[1] - 1) * 100, 3) if ci else ""])
    out = {"results.csv": T.csv_text(RUN_COLUMNS, runs)}
    if rows:
        out["change.csv"] = T.csv_text(CHANGE_COLUMNS, rows)
    return out


def plots(doc: TuneEngineDoc, out_dir: Path) -> list[Path]:
    p = fig8(doc, out_dir / "fig8.png")
    return [p] if p else []


def fig8(doc: TuneEngineDoc, path: Path) -> Path | None:
    """Latency change per query (and their mean) per configuration against the default, bars with
    their 95 % intervals, like Fig. 8 of paper 003 (which plots the improvement: the same bars
    with the sign flipped). None when nothing was compared."""
    changes = [(c, ch) for c, ch in doc.changes() if ch["mean"] is not None]
    if not changes:
        return None
    cats = [*doc.queries, "mean"]

    def pct(r):
        return None if r is None else (r["ratio"] - 1) * 100

    def ci(r):
        return None if r is None or not r.get("ci95") else [(x - 1) * 100 for x in r["ci95"]]

    series, intervals = {}, {}
    for c, ch in changes:
        rs = [ch["per_query"].get(q) for q in doc.queries] + [ch["mean"]]
        series[c.label] = [pct(r) for r in rs]
        intervals[c.label] = [ci(r) for r in rs]
    what = f"{changes[0][0].label} against the default" if len(changes) == 1 else "per configuration against the default"
    return P.bar_chart(path, cats, series, intervals=intervals, reference_line=0.0,
                       ylabel="latency change (%)\nnegative: faster; 95 % CI",
                       title=f"{doc.title}: per-query latency change, {what} (cf. paper 003, Fig. 8)")


KIND = Kind(name="tune.engine", document=TuneEngineDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=("results.csv", "change.csv", "fig8.png"))
