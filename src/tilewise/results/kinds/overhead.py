"""The ``overhead`` result kind (`bench overhead`): rounds of a plain DuckDB pass and a tilewise pass
over the same TPC-H queries; the ratio tilewise / plain with its interval, per-query differences
and the time outside the queries (the figures are bench.overhead's summary; this module shows them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise.results import document
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind


@dataclass
class Pass(Record):
    total_s: float | None = None


@dataclass
class Round(Record):
    round: int = 0
    order: list[str] = field(default_factory=list)
    plain: Pass | None = None
    tilewise: Pass | None = None

    @property
    def full(self) -> bool:
        return bool(self.plain and self.tilewise)


@dataclass
class MeanCI(Record):
    mean: float | None = None
    ci95: list[float] | None = None


@dataclass
class Ratio(Record):
    n: int = 0
    ratios: list[float] = field(default_factory=list)
    ratio: float | None = None
    ci95: list[float] | None = None
    method: str = ""


@dataclass
class Goal(Record):
    max_ratio: float | None = None
    verdict: str = ""


@dataclass
class QueryDiff(Record):
    plain_ms: float | None = None
    tilewise_ms: float | None = None
    diff_ms: MeanCI = field(default_factory=MeanCI)


@dataclass
class Outside(Record):
    plain: float | None = None
    tilewise: float | None = None
    diff: MeanCI = field(default_factory=MeanCI)


@dataclass
class Summary(Record):
    rounds: int = 0
    ratio: Ratio = field(default_factory=Ratio)
    goal: Goal = field(default_factory=Goal)
    stretch: Goal = field(default_factory=Goal)
    queries: dict[str, QueryDiff] = field(default_factory=dict)
    outside_queries_ms: Outside = field(default_factory=Outside)


@dataclass
class OverheadDoc(document.Document):
    rounds: list[Round] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)


def metrics(doc: OverheadDoc) -> list[dict]:
    out = [document.metric(f"{side}/total", [getattr(r, side).total_s for r in doc.rounds if getattr(r, side)], unit="s",
                        side=side) for side in ("plain", "tilewise")]
    out.append(document.metric("tilewise/plain", doc.summary.ratio.ratios, unit="ratio"))
    return out


def render(doc: OverheadDoc, c) -> None:
    """Per round, per query, the ratio with its interval and the verdicts."""
    s = doc.summary
    if not s.rounds:
        c.print("no complete round", markup=False)
        return
    rt = s.ratio
    tab = T.table("per round (total = median of the runs' wall time)",
                  ("round", "order", "plain s", "tilewise s", "ratio"), left=["order"])
    for r, ratio in zip([r for r in doc.rounds if r.full], rt.ratios):
        tab.add_row(str(r.round), " ".join(r.order), f"{r.plain.total_s:.3f}", f"{r.tilewise.total_s:.3f}",
                    f"{ratio:.4f}")
    c.print(tab)
    q = T.table("per query (median over rounds of each pass's median; difference: mean over rounds, 95 % CI)",
                ("query", "plain ms", "tilewise ms", "diff ms", "95 % CI ms"))
    for name, v in s.queries.items():
        d = v.diff_ms
        ci = f"[{d.ci95[0]:+.2f}, {d.ci95[1]:+.2f}]" if d.ci95 else "-"
        q.add_row(name, f"{v.plain_ms:.1f}", f"{v.tilewise_ms:.1f}", f"{d.mean:+.2f}", ci)
    c.print(q)
    o = s.outside_queries_ms
    oci = o.diff.ci95
    c.print(f"time outside the queries per run: plain {o.plain:.1f} ms, tilewise {o.tilewise:.1f} ms "
            f"(difference {o.diff.mean:+.1f} ms" + (f", 95 % CI [{oci[0]:+.1f}, {oci[1]:+.1f}])" if oci else ")"),
            markup=False)
    ci = rt.ci95
    c.print(f"tilewise / plain = {rt.ratio:.4f}" + (f", 95 % CI [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")
            + f" over {rt.n} rounds ({rt.method})", markup=False)
    c.print(f"goal <= {s.goal.max_ratio:.2f}: {s.goal.verdict}; "
            f"stretch <= {s.stretch.max_ratio:.2f}: {s.stretch.verdict}", markup=False)
    T.lines(c, "warning: ", doc.warnings)


KIND = Kind(name="overhead", document=OverheadDoc, metrics=metrics, render=render)
