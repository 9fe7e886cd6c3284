"""The results kind `probe.gpu` (`tilewise probe gpu`): its typed body, metrics (one per GPU, node and
copy: the timed copies in GB/s), table, CSV and plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.document import metric
from tilewise.results.kinds import Kind
from tilewise.results.tables import csv_text

DIRECTIONS = ("h2d", "d2h")  # as tilewise.probes.gpu writes them: "<direction>_<memory>"
MEMORY = ("pinned", "pageable")
FILES = ("gpu.csv", "gpu.png")


@dataclass
class Copy(Record):
    """One kind of copy (e.g. h2d_pinned): GB/s of each timed copy, their median and best."""

    median: float | None = None
    best: float | None = None
    reps: list[float] = field(default_factory=list)


@dataclass
class Case(Record):
    """One GPU from one node's memory (a process bound to that node)."""

    gpu: int = 0
    uuid: str | None = None
    gpu_node: int | None = None
    node: int = 0
    local: bool = False
    gbs: dict[str, Copy] | None = None  # absent: not measured (error says why)
    error: str | None = None
    pages_on_node: dict[str, float] | None = None


@dataclass
class Ratio(Record):
    remote_to_local: float | None = None


@dataclass
class GpuSummary(Record):
    gpu: int = 0
    figures: dict[str, Ratio] = field(default_factory=dict)
    pinned_to_pageable: dict[str, float | None] = field(default_factory=dict)


@dataclass
class GpuDoc(document.Document):
    size_bytes: int = 0
    reps: int | None = None
    cases: list[Case] = field(default_factory=list)
    summary: list[GpuSummary] = field(default_factory=list)


def metrics(doc: GpuDoc) -> list[dict]:
    """One metric per (GPU, node, copy): its timed copies in GB/s."""
    return [metric(f"gpu{c.gpu}/node{c.node}/{key}", v.reps, unit="GB/s", better="higher", gpu=c.gpu, node=c.node,
                   local=c.local, copy=key)
            for c in doc.cases for key, v in (c.gbs or {}).items()]


def render(doc: GpuDoc, out) -> None:
    from rich.table import Table

    out.print(f"[bold]probe gpu[/bold]: {doc.size_bytes / 2**20:.0f} MiB per copy, {doc.reps} copies per figure, "
              "median GB/s (best)")
    t = Table()
    for col in ("GPU", "node", "", "H2D pinned", "H2D pageable", "D2H pinned", "D2H pageable", "pages on node"):
        t.add_column(col)
    for c in doc.cases:
        if c.gbs is None:
            t.add_row(str(c.gpu), str(c.node), "local" if c.local else "", c.error or "-", "", "", "", "")
            continue
        cells = [f"{c.gbs[f'{d}_{m}'].median:.1f} ({c.gbs[f'{d}_{m}'].best:.1f})" for d in DIRECTIONS for m in MEMORY]
        t.add_row(str(c.gpu), str(c.node), "local" if c.local else "", *cells,
                  ", ".join(f"{k} {v:.0%}" for k, v in (c.pages_on_node or {}).items()))
    out.print(t)
    for s in doc.summary:
        f = s.figures
        if f["h2d_pinned"].remote_to_local is not None:
            out.print(f"  GPU {s.gpu}: pinned H2D from the slowest remote node is {f['h2d_pinned'].remote_to_local:.2f}x "
                      f"of the local node's; D2H {f['d2h_pinned'].remote_to_local:.2f}x", markup=False)
        if s.pinned_to_pageable.get("h2d") is not None:
            out.print(f"  GPU {s.gpu}: pinned / pageable on the local node: H2D {s.pinned_to_pageable['h2d']:.2f}x, "
                      f"D2H {s.pinned_to_pageable['d2h']:.2f}x", markup=False)
    T.footer(doc, out)


def csv_files(doc: GpuDoc) -> dict[str, str]:
    rows = [[c.gpu, c.uuid, c.gpu_node, c.node, c.local, key, v.median, v.best, " ".join(f"{x:.3f}" for x in v.reps)]
            for c in doc.cases for key, v in (c.gbs or {}).items()]
    return {"gpu.csv": csv_text(["gpu", "uuid", "gpu_node", "node", "local", "copy", "median_gbs", "best_gbs",
                                 "reps_gbs"], rows)}


def plots(doc: GpuDoc, out_dir: Path) -> list[Path]:
    done = [c for c in doc.cases if c.gbs is not None]
    if not done:
        return []

    plt = P.pyplot()

    keys = [f"{d}_{m}" for d in DIRECTIONS for m in MEMORY]
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(done)), 3.5))
    width = 0.8 / len(keys)
    for i, k in enumerate(keys):
        ax.bar([j + i * width for j in range(len(done))], [c.gbs[k].median for c in done], width, label=k)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(done))])
    ax.set_xticklabels([f"GPU {c.gpu}\nnode {c.node}{' (local)' if c.local else ''}" for c in done])
    ax.set_ylabel("GB/s (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [P.save(fig, Path(out_dir) / "gpu.png", dpi=110)]


KIND = Kind(name="probe.gpu", document=GpuDoc, metrics=metrics, render=render, csv=csv_files, plots=plots, files=FILES)
