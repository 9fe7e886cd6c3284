"""The ``tune`` result kind (`tilewise tune`): every configuration of the grid with its runs, the
default and the winner; the table, CSV, Fig. 6 of paper 003, and the older ``tilewise-tune-results``
version 1 format."""

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
    status: str | None = None
    time_s: float | None = None
    checksum: int | str | None = None
    max_rss_bytes: int | None = None
    memory_overhead: float | None = None
    result: dict | None = None
    error: str | None = None


@dataclass
class Config(Record):
    allocator: str = "system"
    mem: str = "first-touch"
    mem_nodes: list[int] = field(default_factory=list)
    placement: str = "none"
    thp: str | None = None
    autonuma: str | None = None


@dataclass
class Case(Record):
    case: int = 0
    label: str = ""
    config: Config = field(default_factory=Config)
    runs: int = 0
    median_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    spread: float | None = None
    ci95_s: list[float] | None = None  # absent in the older format: computed from the runs
    outliers: list[int] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    raw: list[Run] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [r.time_s for r in self.raw if r.status == "ok"]

    @property
    def ci95(self) -> list[float] | None:
        return self.ci95_s if "ci95_s" not in self.absent else stats.summarize(self.times)["ci95"]

    @property
    def mem_label(self) -> str:
        return self.label.split("/")[1]


@dataclass
class Reproduce(Record):
    tilewise: str = ""
    environment: str = ""
    exec: str = ""
    os: str | None = None


@dataclass
class TuneDoc(document.Document):
    target: dict | None = None
    cases: list[Case] = field(default_factory=list)
    default: Case | None = None
    best: Case | None = None
    speedup_over_default: float | None = None
    reproduce: Reproduce | None = None

    @property
    def title(self) -> str:
        target = self.target or self.params.get("target") or {}
        return target.get("workload") or " ".join(target.get("command", []))[:60] or "command"


def metrics(doc: TuneDoc) -> list[dict]:
    return [document.metric(c.label, c.times, unit="s", warmups=c.warmup_s, config=c.label) for c in doc.cases]


def render(doc: TuneDoc, out) -> None:
    d = doc.default.median_s if doc.default else None
    best = doc.best
    width = max([len(c.label) for c in doc.cases] + [13]) + 2
    out.print(f"{'configuration':<{width}} {'runs':>4} {'median s':>9} {'min s':>8} {'max s':>8} {'95% CI':>15} "
              f"{'spread':>6} {'vs default':>10}", markup=False)
    for c in sorted(doc.cases, key=lambda c: (c.median_s is None, c.median_s or 0)):
        mark = "* " if best and c.case == best.case else "  "
        if c.median_s is None:
            out.print(f"{mark + c.label:<{width}} {0:>4} {'failed':>9}", markup=False)
            continue
        ci = c.ci95
        ci_s = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
        vs = f"{d / c.median_s:.2f}x" if d else ""
        flag = " !" if c.outliers else ""
        out.print(f"{mark + c.label:<{width}} {c.runs:>4} {c.median_s:>9.3f} {c.min_s:>8.3f} "
                  f"{c.max_s:>8.3f} {ci_s:>15} {(c.spread or 0):>6.0%} {vs:>10}{flag}", markup=False)
    if any(c.outliers for c in doc.cases):
        out.print("! = a run is an outlier (modified z-score > 3.5; its time is in results.json)", markup=False)
    if best:
        sp = doc.speedup_over_default
        out.print(f"best: {best.label}  median {best.median_s:.3f} s, spread {(best.spread or 0):.0%}; "
                  f"{sp:.2f}x over the default ({d:.3f} s)" if sp else f"best: {best.label}", markup=False)
        repro = doc.reproduce
        if repro:
            out.print(f"reproduce: {repro.tilewise}", markup=False)
            out.print(f"       or: {repro.environment}", markup=False)
            out.print(f"feed back: {repro.exec}", markup=False)
            if repro.os is not None:
                out.print(f"       os: {repro.os}", markup=False)
    T.footer(doc, out)


CSV_COLUMNS = ["case", "label", "allocator", "mem", "mem_nodes", "placement", "thp", "autonuma", "repeat",
               "status", "time_s", "max_rss_bytes", "memory_overhead", "checksum", "error"]


def csv_files(doc: TuneDoc) -> dict[str, str]:
    rows = []
    for c in doc.cases:
        cfg = c.config
        for r in c.raw:
            res = r.result if isinstance(r.result, dict) else {}
            rows.append([c.case, c.label, cfg.allocator, cfg.mem, ",".join(map(str, cfg.mem_nodes)), cfg.placement,
                         cfg.thp or "", cfg.autonuma or "", r.repeat, r.status, _blank(r.time_s),
                         res.get("max_rss_bytes", _blank(r.max_rss_bytes)), r.memory_overhead or "",
                         _blank(r.checksum), _blank(r.error)])
    return {"results.csv": T.csv_text(CSV_COLUMNS, rows)} if rows else {}


def _blank(x) -> object:
    return "" if x is None else x


def plots(doc: TuneDoc, out_dir: Path) -> list[Path]:
    p = fig6(doc, out_dir / "fig6.png")
    return [p] if p else []


def fig6(doc: TuneDoc, path: Path) -> Path | None:
    """Runtime per allocator x memory policy (bars: median, whiskers: the 95 % confidence interval
    of the table), like Fig. 6 of paper 003; one panel per placement/OS state. None when nothing
    was measured."""
    cases = [c for c in doc.cases if c.median_s is not None]
    if not cases:
        return None
    plt = P.pyplot()
    panels: dict[str, list[Case]] = {}
    for c in cases:
        cfg = c.config
        os_part = ",".join(x for x in (f"thp={cfg.thp}" if cfg.thp else "",
                                       f"autonuma={cfg.autonuma}" if cfg.autonuma else "") if x)
        panels.setdefault(f"placement {cfg.placement}" + (f", {os_part}" if os_part else ""), []).append(c)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), squeeze=False)
    for ax, (name, cs) in zip(axes[:, 0], panels.items()):
        allocs = list(dict.fromkeys(c.config.allocator for c in cs))
        mems = list(dict.fromkeys(c.mem_label for c in cs))
        width = 0.8 / max(1, len(mems))
        for j, m in enumerate(mems):
            xs, ys, cis = [], [], []
            for i, a in enumerate(allocs):
                hit = [c for c in cs if c.config.allocator == a and c.mem_label == m]
                if hit:
                    xs.append(i + (j - (len(mems) - 1) / 2) * width)
                    ys.append(hit[0].median_s)
                    cis.append(hit[0].ci95)
            bars = ax.bar(xs, ys, width, label=m)
            P.whiskers(ax, xs, cis, color=P.darker(bars.patches[0].get_facecolor()))
        ax.set_xticks(range(len(allocs)))
        ax.set_xticklabels(allocs)
        ax.set_ylabel("runtime (s): median,\nwhiskers 95 % CI")
        ax.set_title(f"{doc.title}: {name}", fontsize=10)
        ax.legend(title="memory policy", fontsize=8)
    fig.tight_layout()
    return P.save(fig, path)


def upgrade_1(doc: dict) -> dict:
    body = {k: v for k, v in doc.items() if k not in ("format", "version", "environment", "interrupted")}
    return document.legacy_envelope(doc, "tune", {"target": doc.get("target"), "grid": doc.get("grid"),
                                               "repeat": doc.get("repeat"), "warmup": doc.get("warmup")}, body,
                                 complete=not doc.get("interrupted"), interrupted=bool(doc.get("interrupted")),
                                 started=doc.get("created"), warnings=doc.get("warnings"))


KIND = Kind(name="tune", document=TuneDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=("results.csv", "fig6.png"), legacy={("tilewise-tune-results", 1): upgrade_1})
