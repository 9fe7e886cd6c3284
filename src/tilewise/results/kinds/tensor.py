"""The results kind `workload.tensor` (`tilewise workload T1|T2|T3`): its table, CSV and plot.

Every variant's median time, its ratio to the tensor program run eagerly (and with the host-device
transfer on a GPU), whether its answer was checked against the exact reference, and the thesis's
figure beside it; the metrics: one per variant, its timed runs.
"""

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

FILES = ("tensor.csv", "tensor.png")


@dataclass
class Variant(Record):
    """One variant's runs (the worker's record of it)."""

    name: str = ""
    engine: str | None = None
    device: str | None = None
    times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    checked: bool | None = None
    check: str | None = None
    compile_s: float | None = None
    transfer_s: float | None = None


@dataclass
class Thesis(Record):
    ratio_to_eager: list[float] | None = None  # the thesis's range, [low, high]
    text: str = ""


@dataclass
class Row(Record):
    """A variant in the summary: its median and ratios to the tensor program run eagerly."""

    name: str = ""
    engine: str | None = None
    device: str | None = None
    median_s: float | None = None
    checked: bool | None = None
    skipped: str | None = None
    ratio_to_eager: float | None = None
    ratio_to_eager_with_transfer: float | None = None
    thesis: Thesis | None = None


@dataclass
class Summary(Record):
    rows: list[Row] = field(default_factory=list)


@dataclass
class Rename(Record):
    method: str = ""
    reason: str = ""


@dataclass
class TensorDoc(document.Document):
    workload: str = "T"
    description: str = ""
    device: str | None = None
    threads: int | None = None
    omp_places: str | None = None
    gpu: dict | None = None
    gen_s: float | None = None
    nodes: int | None = None  # T3: the graph
    edges: int | None = None
    rename: Rename | None = None
    variants: list[Variant] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)
    checked: bool | None = None
    check: str | None = None
    verification: dict | None = None

    def variant(self, name: str) -> Variant:
        return next((v for v in self.variants if v.name == name), Variant())


def metrics(doc: TensorDoc) -> list[dict]:
    """One metric per variant: its timed runs (`tilewise report` compares them across runs)."""
    w = doc.workload
    return [metric(f"{w}/{v.name}", v.times_s, unit="s", workload=w, variant=v.name, device=v.device)
            for v in doc.variants if v.times_s]


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _thesis(row: Row) -> str:
    t = row.thesis
    if not t:
        return ""
    r = t.ratio_to_eager
    rng = "" if not r else (f"{r[0]:.2f}" if r[0] == r[1] else f"{r[0]:g}-{r[1]:g}") + ": "
    return rng + t.text


def render(doc: TensorDoc, out) -> None:
    from rich.table import Table

    out.print(f"[bold]{doc.workload}[/bold] {doc.description}")
    p = doc.params.get("resolved") or doc.params
    if doc.workload == "T3":
        shape = (f"R-MAT graph, {doc.nodes or 0:,} nodes, {doc.edges or 0:,} edges (LiveJournal x {p.get('scale')}), "
                 f"{p.get('iterations')} iterations max, tolerance {p.get('tolerance')}, {p.get('dtype')}")
    elif doc.workload == "T1":
        shape = f"{p.get('records', 0):,} keys, dataset {p.get('dataset')}"
    else:
        shape = f"|R| {p.get('records', 0):,}, |S| {p.get('records', 0) * p.get('ratio', 1):,}, dataset {p.get('dataset')}"
    out.print(f"  data       {shape} (generated in {doc.gen_s or 0:.2f} s, not timed)", markup=False)
    out.print(f"  device     {doc.device}, {doc.threads} thread(s)"
              + (f", OMP_PLACES {doc.omp_places}" if doc.omp_places else "")
              + (f", GPU {doc.gpu.get('name')} {doc.gpu.get('uuid') or ''}" if doc.gpu else ""), markup=False)
    if doc.rename:
        out.print(f"  renaming   {doc.rename.method}: {doc.rename.reason}", markup=False)
    t = Table(title=None, show_lines=False)
    for col in ("variant", "engine", "device", "median s", "x eager", "x eager +transfer", "answer", "thesis (x eager)"):
        t.add_column(col, overflow="fold")
    for row in doc.summary.rows:
        v = doc.variant(row.name)
        if row.skipped:
            t.add_row(row.name, "-", "-", "-", "-", "-", f"skipped: {row.skipped}", _thesis(row))
            continue
        answer = "checked" if row.checked else f"WRONG: {v.check}"
        extra = f" (+{v.compile_s:.2f} s compile)" if v.compile_s is not None else ""
        t.add_row(row.name, str(row.engine or ""), str(row.device or ""),
                  f"{row.median_s:.4f}{extra}" if row.median_s is not None else "-",
                  _ratio(row.ratio_to_eager), _ratio(row.ratio_to_eager_with_transfer), answer, _thesis(row))
    out.print(t)
    out.print(f"  checked    {'yes' if doc.checked else 'NO'}: against {doc.check}", markup=False)
    v = doc.verification or {}
    if v:
        out.print(f"  binding    {v.get('summary') or v.get('state') or ''}".rstrip(), markup=False)
    T.footer(doc, out)


def tensor_csv(doc: TensorDoc) -> dict[str, str]:
    rows = []
    for row in doc.summary.rows:
        v = doc.variant(row.name)
        rows.append([doc.workload, row.name, row.engine, row.device, row.median_s, row.ratio_to_eager,
                     row.ratio_to_eager_with_transfer, row.checked, " ".join(f"{x:.6f}" for x in v.times_s),
                     v.compile_s, v.transfer_s, _thesis(row)])
    return {"tensor.csv": csv_text(["workload", "variant", "engine", "device", "median_s", "ratio_to_eager",
                                    "ratio_to_eager_with_transfer", "checked", "times_s", "compile_s", "transfer_s",
                                    "thesis"], rows)}


def tensor_plots(doc: TensorDoc, out_dir: Path) -> list[Path]:
    rows = [r for r in doc.summary.rows if r.median_s is not None]
    if not rows:
        return []

    plt = P.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r.name for r in rows], [r.median_s for r in rows], color=["#4c72b0" if r.checked else "#c44e52" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("median time (s, log)")
    ax.set_title(f"{doc.workload} on {doc.device}: tensor program vs baselines")
    fig.tight_layout()
    return [P.save(fig, Path(out_dir) / "tensor.png", dpi=110)]


KIND = Kind(name="workload.tensor", document=TensorDoc, metrics=metrics, render=render, csv=tensor_csv,
            plots=tensor_plots, files=FILES)
