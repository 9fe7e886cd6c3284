"""The ``probe.memory`` result kind (`tilewise probe memory`): the initiator x target memory matrix.

Everything about these documents lives here (the typed body, metrics, tables, CSV, heatmaps, the
files it owns). The body::

    "initiators": [{"name", "node", "cpus"}], "targets": [node...], "tests": [...], "size_bytes",
    "emulated": null | "why the times are not the hardware's",
    "cells": [{"initiator", "target", "threads", "size_bytes", "status": "measured" | "not_measured" | "failed",
               "reason", "info": {...}, "placement": {"before"|"after": {"pages", "on_target", "elsewhere",
               "missing", "policy", "numa_maps": {node: pages}}}, "results": {test: {threads: {"median", "best", "p10", "p90", "unit",
               "reps", "passes", "values": [...]}}}}],
    "firmware": topology.firmware.Firmware.to_json(), "references": [...], "notes": [...]
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from tilewise import cpulist
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

TESTS = ("latency", "read_seq", "read_rand", "write", "write_nt")
TITLES = {
    "latency": "idle load latency",
    "read_seq": "read bandwidth, sequential",
    "read_rand": "read bandwidth, random 64 B lines",
    "write": "write bandwidth, plain stores",
    "write_nt": "write bandwidth, non-temporal stores",
}
FILES = ("memory.csv", *(f"memory_{t}.png" for t in TESTS))


@dataclass
class Figure(Record):
    """One test at one thread count: repetitions' median, best, spread (values: every repetition)."""

    median: float | None = None
    best: float | None = None
    p10: float | None = None
    p90: float | None = None
    unit: str | None = None
    reps: int | None = None
    passes: int | None = None
    values: list[float] = field(default_factory=list)


@dataclass
class Pages(Record):
    """Where the buffer's pages were (move_pages), before or after measuring, and the mapping's
    per-node page counts as numa_maps shows them."""

    pages: int | None = None
    on_target: int | None = None
    policy: str | None = None
    numa_maps: dict[str, int] | None = None


@dataclass
class Placement(Record):
    before: Pages | None = None
    after: Pages | None = None


@dataclass
class Initiator(Record):
    name: str = ""
    node: int | None = None
    cpus: list[int] = field(default_factory=list)


@dataclass
class Cell(Record):
    """One (initiator, target node) cell: tw_memory bound to the initiator's CPUs."""

    initiator: str = ""
    target: int = 0
    threads: list[int] = field(default_factory=list)
    status: str | None = None  # measured | not_measured | failed
    reason: str | None = None
    placement: Placement | None = None
    results: dict[str, dict[str, Figure]] = field(default_factory=dict)  # test -> thread count -> figure

    @property
    def label(self) -> str:
        return f"{self.initiator} -> node {self.target}"

    def figure(self, test: str, threads: int | str) -> Figure:
        return (self.results.get(test) or {}).get(str(threads)) or Figure()


@dataclass
class MemoryDoc(document.Document):
    initiators: list[Initiator] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    size_bytes: int = 0
    size_rule: str = ""
    emulated: str | None = None  # why the times are not the hardware's
    cells: list[Cell] = field(default_factory=list)
    firmware: dict | None = None  # topology.firmware.Firmware.to_json()
    references: list[dict] = field(default_factory=list)  # likwid-bench, the reference chase, Intel MLC
    notes: list[str] = field(default_factory=list)

    def measured(self) -> list[Cell]:
        return [c for c in self.cells if c.status == "measured"]


def _table(out, title: str):
    """A table under a title line (a rich table title wraps to the table's width)."""
    out.print(title, markup=False, highlight=False)
    return T.table(None)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _unit(test: str) -> str:
    return "ns" if test == "latency" else "GB/s"


def best(cell: Cell, test: str) -> tuple[float | None, int | None]:
    """The best median of a test over thread counts (lowest latency, highest bandwidth) and its count."""
    rs = {int(k): v for k, v in (cell.results.get(test) or {}).items() if "median" not in v.absent}
    if not rs:
        return None, None
    pick = min if test == "latency" else max
    k = pick(rs, key=lambda n: rs[n].median)
    return rs[k].median, k


def grid(doc: MemoryDoc, test: str) -> tuple[list[str], list[int], list[list[float | None]]]:
    inits = [i.name for i in doc.initiators]
    targets = list(doc.targets)
    vals: list[list[float | None]] = [[None] * len(targets) for _ in inits]
    for c in doc.measured():
        if c.initiator in inits and c.target in targets:
            vals[inits.index(c.initiator)][targets.index(c.target)] = best(c, test)[0]
    return inits, targets, vals


def metrics(doc: MemoryDoc) -> list[dict]:
    out = []
    for c in doc.measured():
        for test, by in c.results.items():
            for k, r in by.items():
                vals = r.values or ([r.median] if "median" not in r.absent else [])
                if vals:
                    out.append(document.metric(f"{c.initiator}->node {c.target}/{test}/{k}", vals,
                                               unit=_get(r, "unit", _unit(test)),
                                               better="lower" if test == "latency" else "higher",
                                               initiator=c.initiator, target=c.target, test=test, threads=int(k)))
    return out


def _fmt(v: float | None, test: str) -> str:
    if v is None:
        return "n/m"
    return f"{v:.1f}" if test == "latency" else f"{v:.2f}"


def render(doc: MemoryDoc, out) -> None:
    emulated = doc.emulated
    out.print(f"[bold]memory matrix[/bold]: {len(doc.initiators)} initiator(s) x "
              f"{len(doc.targets)} target node(s), {_mib(doc.size_bytes)} per cell "
              f"({doc.size_rule}); best median over thread counts"
              + (f"\n[bold]EMULATED[/bold]: {emulated}" if emulated else ""))
    for i in doc.initiators:
        out.print(f"  {i.name}: CPUs {_cpus(i.cpus)}", markup=False)
    if not doc.cells:
        out.print("no cells measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
    for test in doc.tests:
        inits, targets, vals = grid(doc, test)
        if all(v is None for row in vals for v in row):
            continue
        t = _table(out, f"{TITLES.get(test, test)} ({_unit(test)})" + (" [emulated]" if emulated else ""))
        t.add_column("initiator \\ target", justify="left")
        for tg in targets:
            t.add_column(f"node {tg}", justify="right")
        for name, row in zip(inits, vals):
            t.add_row(name, *(_fmt(v, test) for v in row))
        out.print(t)
    scaling = _table(out, "by thread count (median of repetitions)")
    counts = sorted({str(k) for c in doc.cells for k in c.threads}, key=int)
    for col in ("cell", "test"):
        scaling.add_column(col, justify="left")
    for k in counts:
        scaling.add_column(f"{k} thread{'s' if k != '1' else ''}", justify="right")
    rows = 0
    for c in doc.measured():
        for test in doc.tests:
            if test == "latency" or not c.results.get(test):
                continue
            scaling.add_row(c.label, test, *(_fmt(c.figure(test, k).median, test) for k in counts))
            rows += 1
    if rows:
        out.print(scaling)
    place = _table(out, "placement (every page's node, checked before and after measuring)")
    for col in ("cell", "status", "pages on target", "policy", "numa_maps", "reason"):
        place.add_column(col, justify="left")
    for c in doc.cells:
        p = _pages(c, "after") or _pages(c, "before")
        pages = f"{_get(p, 'on_target', 0)}/{_get(p, 'pages', 0)}" if p else "-"
        maps = " ".join(f"N{n}={k}" for n, k in (_get(p, "numa_maps", None) or {}).items()) or "-"
        place.add_row(c.label, _get(c, "status", "?"), pages, _get(p, "policy", "-"), maps, c.reason or "")
    out.print(place)
    _render_firmware(doc.firmware or {}, out)
    _render_references(doc, out)
    T.lines(out, "note: ", doc.notes)
    T.lines(out, "warning: ", doc.warnings)
    T.lines(out, "system: ", doc.system_warnings)


def _pages(c: Cell, when: str) -> Pages | None:
    """The cell's page census `when` (before/after measuring); None where it has none."""
    p = getattr(c.placement, when) if c.placement else None
    return p if p is not None and (p.extra or len(p.absent) < len(fields(Pages))) else None


def _get(r: Record | None, name: str, default):
    """A field as the document has it, `default` where it is not there (dict.get)."""
    return default if r is None or name in r.absent else getattr(r, name)


def _cpus(cpus) -> str:
    return cpulist.format(cpus)


def _render_firmware(fw: dict, out) -> None:
    rows = [a for a in fw.get("hmat", []) if a.get("access") == "access1"]
    if rows and any(a.get(f) for a in rows for f in ("read_latency", "read_bandwidth")):
        t = _table(out, "firmware figures (ACPI HMAT, access1: best CPU initiators)")
        for col in ("target", "initiators", "read ns", "write ns", "read MB/s", "write MB/s"):
            t.add_column(col, justify="right")
        for a in rows:
            t.add_row(f"node {a['target']}", _cpus(a["initiators"]) or "-",
                      *(str(a.get(f) or "-") for f in ("read_latency", "write_latency", "read_bandwidth", "write_bandwidth")))
        out.print(t)
    elif fw:
        out.print("firmware figures: none (no ACPI HMAT figures in sysfs)", markup=False)
    if fw.get("tiers"):
        out.print("kernel memory tiers: " + "; ".join(f"tier {x['id']}: node(s) {_cpus(x['nodes'])}" for x in fw["tiers"]),
                  markup=False)


def _render_references(doc: MemoryDoc, out) -> None:
    refs = doc.references
    if not refs:
        return
    cells = {(c.initiator, c.target): c for c in doc.cells}
    t = _table(out, "references (same initiator CPUs and target node)")
    for col in ("cell", "figure", "tilewise", "reference", "tilewise/reference", "reference tool"):
        t.add_column(col, justify="left" if col in ("cell", "figure", "reference tool") else "right")
    for r in refs:
        c = cells.get((r["initiator"], r["target"])) or Cell()
        label = f"{r['initiator']} -> node {r['target']}"
        for test, lk in (r.get("likwid") or {}).items():
            ours = c.figure(test, r["threads"]).median
            if "gbs" in lk:
                t.add_row(label, f"{test} @{r['threads']}", _fmt(ours, test), f"{lk['gbs']:.2f}",
                          f"{ours / lk['gbs']:.3f}" if ours else "-", f"likwid-bench {lk['kernel']}")
            else:
                t.add_row(label, f"{test} @{r['threads']}", _fmt(ours, test), "not measured", "-",
                          f"likwid-bench: {lk.get('error')}")
        ours = c.figure("latency", 1).median
        for key, name in (("chase", "reference chase (numactl --membind)"), ("mlc", "Intel MLC --idle_latency")):
            ref = r.get(key)
            if ref is None:
                continue
            if "ns" in ref:
                t.add_row(label, "latency", _fmt(ours, "latency"), f"{ref['ns']:.1f}",
                          f"{ours / ref['ns']:.3f}" if ours else "-", name)
            else:
                t.add_row(label, "latency", _fmt(ours, "latency"), "not measured", "-", f"{name}: {ref.get('error')}")
    out.print(t)
    for r in refs:
        for lk in (r.get("likwid") or {}).values():
            if lk.get("command"):
                out.print(f"  likwid: {lk['command']}", markup=False)


def csv_files(doc: MemoryDoc) -> dict[str, str]:
    rows = []
    for c in doc.cells:
        p = _pages(c, "before")
        base = [c.initiator, c.target, c.status, *(_get(p, k, "") for k in ("pages", "on_target", "policy"))]
        if c.status != "measured" or not c.results:
            rows.append(base + ["", "", "", "", "", "", "", c.reason or ""])
            continue
        for test, by in c.results.items():
            for k, r in sorted(by.items(), key=lambda kv: int(kv[0])):
                if "median" in r.absent:
                    rows.append(base + [test, k, "", "", "", "", _get(r, "unit", ""), "not supported by this build"])
                    continue
                rows.append(base + [test, k, r.median, r.best, r.p10, r.p90, r.unit, ""])
    if not rows:
        return {}
    header = ["initiator", "target", "status", "pages", "pages_on_target", "policy", "test", "threads", "median",
              "best", "p10", "p90", "unit", "reason"]
    return {"memory.csv": T.csv_text(header, rows)}


def plots(doc: MemoryDoc, out_dir: Path) -> list[Path]:
    if not doc.complete:
        return []
    paths = []
    for test in doc.tests:
        inits, targets, vals = grid(doc, test)
        if all(v is None for row in vals for v in row):
            continue
        title = f"{TITLES.get(test, test)} ({_unit(test)})" + (" - EMULATED, not the memory's" if doc.emulated else "")
        paths.append(heatmap(Path(out_dir) / f"memory_{test}.png", inits, [f"node {t}" for t in targets], vals, title,
                             _unit(test)))
    return paths


def heatmap(path: Path, rows: list[str], cols: list[str], vals: list[list[float | None]], title: str, unit: str) -> Path:
    """Initiator x target heatmap, cells not measured left blank and marked n/m."""
    import numpy as np

    plt = P.pyplot()
    m = np.array([[np.nan if v is None else v for v in row] for row in vals], dtype=float)
    fig, ax = plt.subplots(figsize=(2.2 + 1.1 * len(cols), 1.6 + 0.6 * len(rows)))
    try:
        im = ax.imshow(np.ma.masked_invalid(m), cmap="viridis", interpolation="nearest", aspect="auto")
        fig.colorbar(im, ax=ax, label=unit)
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("target memory node")
        ax.set_ylabel("initiator")
        ax.set_title(title, fontsize=9)
        for i in range(len(rows)):
            for j in range(len(cols)):
                ax.text(j, i, "n/m" if np.isnan(m[i, j]) else (f"{m[i, j]:.0f}" if unit == "ns" else f"{m[i, j]:.2f}"),
                        ha="center", va="center", color="w" if not np.isnan(m[i, j]) else "black", fontsize=8)
        return P.save(fig, path)
    finally:
        plt.close(fig)


KIND = Kind(name="probe.memory", document=MemoryDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=FILES)
