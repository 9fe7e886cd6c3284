"""The core-to-core probes' result kinds, ``probe.latency`` and ``probe.bandwidth`` (`probe latency`,
`probe bandwidth`): per measured CPU pair and mode, the median (with p10/p90 and the raw per-pair
statistics); per topology class (same L3, same node, other node, ...) a summary; tables, CSV
matrices and heatmaps; and the older ``tilewise.probe/1`` format of every probe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise.errors import UsageError
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

MODE_TITLES = {"cas": "compare-and-swap on one line", "rw": "one writer / one reader on two lines",
               "bw": "one writes a buffer, the other reads it"}
# the pair classes of probes.pairs (CLASSES), nearest first
CLASS_TITLES = {
    "smt": "same core (SMT siblings)",
    "l3": "within a chiplet (same L3)",
    "node": "across chiplets, same NUMA node",
    "package": "across NUMA nodes, same package",
    "remote": "across packages",
}


@dataclass
class ClassSummary(Record):
    mean: float | None = None
    median: float | None = None
    min: float | None = None
    max: float | None = None
    pairs: int = 0
    values: list[float] = field(default_factory=list)


@dataclass
class PairsDoc(document.Document):
    probe: str = ""  # latency | bandwidth
    unit: str = ""
    cpus: list[int] = field(default_factory=list)
    pairs: str | None = None  # which pairs were measured, in words
    matrices: dict[str, list[list[float | None]]] = field(default_factory=dict)  # mode -> CPU x CPU medians
    summary: dict[str, dict[str, ClassSummary]] = field(default_factory=dict)  # mode -> class -> summary

    @property
    def number(self) -> str:
        return "{:.3f}" if self.probe == "bandwidth" else "{:.2f}"

    def file_stem(self, mode: str) -> str:
        return self.probe if mode == "bw" else f"{self.probe}_{mode}"


def metrics(doc: PairsDoc) -> list[dict]:
    better = "higher" if doc.probe == "bandwidth" else "lower"
    out = []
    for mode, classes in doc.summary.items():
        for cls, s in classes.items():
            vals = s.values or ([s.median] if s.median is not None else [])
            out.append(document.metric(f"{mode}/{cls}", vals, unit=doc.unit, better=better, mode=mode, pair_class=cls))
    return out


def render(doc: PairsDoc, out) -> None:
    f = doc.number
    for m in doc.matrices:
        out.print(f"[bold]{doc.probe} ({m}: {MODE_TITLES.get(m, m)})[/bold], median per pair in {doc.unit}")
        table = T.table(None, ("pair class", "mean", "median", "min", "max", "pairs"), left=["pair class"])
        for cls, s in doc.summary[m].items():
            table.add_row(CLASS_TITLES.get(cls, cls), f.format(s.mean), f.format(s.median), f.format(s.min),
                          f.format(s.max), str(s.pairs))
        out.print(table)
        if len(doc.cpus) <= 16:
            mt = T.table(None, ["cpu", *map(str, doc.cpus)])
            for i, (c, row) in enumerate(zip(doc.cpus, doc.matrices[m])):
                mt.add_row(str(c), *("-" if i == j else ("n/m" if v is None else f.format(v)) for j, v in enumerate(row)))
            out.print(mt)
    if not doc.matrices:
        out.print("no pairs measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
    out.print(f"pairs: {doc.pairs}", markup=False)
    T.footer(doc, out)


def csv_files(doc: PairsDoc) -> dict[str, str]:
    if not doc.complete:
        return {}
    f = doc.number
    return {f"{doc.file_stem(m)}.csv": T.csv_text(["cpu", *doc.cpus],
                                                  [[a] + ["" if v is None else f.format(v) for v in row]
                                                   for a, row in zip(doc.cpus, matrix)])
            for m, matrix in doc.matrices.items()}


def plots(doc: PairsDoc, out_dir: Path) -> list[Path]:
    if not doc.complete:
        return []
    paths = []
    for m, matrix in doc.matrices.items():
        title = (f"core-to-core {doc.probe} ({m}, median {doc.unit})" if m != "bw"
                 else f"core-to-core bandwidth (median {doc.unit})")
        paths.append(P.heatmap(out_dir / f"{doc.file_stem(m)}.png", doc.cpus, matrix, title, doc.unit))
    return paths


def files(doc: PairsDoc) -> tuple[str, ...]:
    probe = doc.kind.split(".", 1)[1]
    stems = [probe] if probe == "bandwidth" else [f"{probe}_{m}" for m in ("cas", "rw")]
    return tuple(f"{n}.{ext}" for n in stems for ext in ("csv", "png"))


def upgrade_probe_1(doc: dict) -> dict:
    """tilewise.probe/1, of any probe (latency, bandwidth, stream): the body as it was."""
    kind = f"probe.{doc.get('probe')}"
    if kind not in ("probe.latency", "probe.bandwidth", "probe.stream"):
        raise UsageError(f"unknown probe {doc.get('probe')!r} in a tilewise.probe/1 document")
    params = doc.get("params") or {k: doc.get(k) for k in ("ntimes", "runs", "size_rule")}
    body = {k: v for k, v in doc.items() if k not in ("format", "environment", "params", "complete")}
    return document.legacy_envelope(doc, kind, params, body, complete=bool(doc.get("complete")),
                                 warnings=doc.get("warnings"))


def _kind(name: str, legacy: dict) -> Kind:
    return Kind(name=name, document=PairsDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
                files=files, legacy=legacy)


LATENCY = _kind("probe.latency", {("tilewise.probe/1", None): upgrade_probe_1})
BANDWIDTH = _kind("probe.bandwidth", {})
