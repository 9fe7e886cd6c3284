"""The ``probe.memory`` result kind (`tilewise probe memory`): the initiator x target memory matrix.

Everything about these documents lives here (metrics, tables, CSV, heatmaps, the files it owns);
the functions read the document as JSON (``MemoryDoc.to_json()``). The body::

    "initiators": [{"name", "node", "cpus"}], "targets": [node...], "tests": [...], "size_bytes",
    "emulated": null | "why the times are not the hardware's",
    "cells": [{"initiator", "target", "threads", "size_bytes", "status": "measured" | "not_measured" | "failed",
               "reason", "info": {...}, "placement": {"before"|"after": {"pages", "on_target", "elsewhere",
               "missing", "policy"}}, "results": {test: {threads: {"median", "best", "p10", "p90", "unit",
               "reps", "passes", "values": [...]}}}}],
    "firmware": topology.firmware.Firmware.to_json(), "references": [...], "notes": [...]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
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


def _table(out, title: str):
    """A table under a title line (a rich table title wraps to the table's width)."""
    out.print(title, markup=False, highlight=False)
    return T.table(None)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _unit(test: str) -> str:
    return "ns" if test == "latency" else "GB/s"


def best(cell: dict, test: str) -> tuple[float | None, int | None]:
    """The best median of a test over thread counts (lowest latency, highest bandwidth) and its count."""
    rs = {int(k): v for k, v in ((cell.get("results") or {}).get(test) or {}).items() if "median" in v}
    if not rs:
        return None, None
    pick = min if test == "latency" else max
    k = pick(rs, key=lambda n: rs[n]["median"])
    return rs[k]["median"], k


def grid(doc: dict, test: str) -> tuple[list[str], list[int], list[list[float | None]]]:
    inits = [i["name"] for i in doc.get("initiators", [])]
    targets = list(doc.get("targets", []))
    vals: list[list[float | None]] = [[None] * len(targets) for _ in inits]
    for c in doc.get("cells", []):
        if c.get("status") == "measured" and c["initiator"] in inits and c["target"] in targets:
            vals[inits.index(c["initiator"])][targets.index(c["target"])] = best(c, test)[0]
    return inits, targets, vals


def metrics(doc: dict) -> list[dict]:
    out = []
    for c in doc.get("cells", []):
        if c.get("status") != "measured":
            continue
        for test, by in (c.get("results") or {}).items():
            for k, r in by.items():
                vals = r.get("values") or ([r["median"]] if "median" in r else [])
                if vals:
                    out.append(document.metric(f"{c['initiator']}->node {c['target']}/{test}/{k}", vals, unit=r.get("unit", _unit(test)),
                                            better="lower" if test == "latency" else "higher",
                                            initiator=c["initiator"], target=c["target"], test=test, threads=int(k)))
    return out


def _fmt(v: float | None, test: str) -> str:
    if v is None:
        return "n/m"
    return f"{v:.1f}" if test == "latency" else f"{v:.2f}"


def render(doc: dict, out) -> None:
    emulated = doc.get("emulated")
    out.print(f"[bold]memory matrix[/bold]: {len(doc.get('initiators', []))} initiator(s) x "
              f"{len(doc.get('targets', []))} target node(s), {_mib(doc.get('size_bytes', 0))} per cell "
              f"({doc.get('size_rule', '')}); best median over thread counts"
              + (f"\n[bold]EMULATED[/bold]: {emulated}" if emulated else ""))
    for i in doc.get("initiators", []):
        out.print(f"  {i['name']}: CPUs {_cpus(i['cpus'])}", markup=False)
    if not doc.get("cells"):
        out.print("no cells measured" + (" (interrupted)" if doc.get("interrupted") else ""), markup=False)
    for test in doc.get("tests", []):
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
    counts = sorted({str(k) for c in doc.get("cells", []) for k in c.get("threads", [])}, key=int)
    for col in ("cell", "test"):
        scaling.add_column(col, justify="left")
    for k in counts:
        scaling.add_column(f"{k} thread{'s' if k != '1' else ''}", justify="right")
    rows = 0
    for c in doc.get("cells", []):
        if c.get("status") != "measured":
            continue
        for test in doc.get("tests", []):
            by = (c.get("results") or {}).get(test) or {}
            if test == "latency" or not by:
                continue
            scaling.add_row(f"{c['initiator']} -> node {c['target']}", test,
                            *(_fmt(by.get(k, {}).get("median"), test) for k in counts))
            rows += 1
    if rows:
        out.print(scaling)
    place = _table(out, "placement (every page's node, checked before and after measuring)")
    for col in ("cell", "status", "pages on target", "policy", "reason"):
        place.add_column(col, justify="left")
    for c in doc.get("cells", []):
        p = (c.get("placement") or {}).get("after") or (c.get("placement") or {}).get("before") or {}
        pages = f"{p.get('on_target', 0)}/{p.get('pages', 0)}" if p else "-"
        place.add_row(f"{c['initiator']} -> node {c['target']}", c.get("status", "?"), pages, p.get("policy", "-"),
                      c.get("reason") or "")
    out.print(place)
    _render_firmware(doc, out)
    _render_references(doc, out)
    T.lines(out, "note: ", doc.get("notes") or [])
    T.lines(out, "warning: ", doc.get("warnings") or [])
    T.lines(out, "system: ", ((doc.get("environment") or {}).get("system_check") or {}).get("warnings") or [])


def _cpus(cpus) -> str:
    return cpulist.format(cpus)


def _render_firmware(doc: dict, out) -> None:
    fw = doc.get("firmware") or {}
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


def _render_references(doc: dict, out) -> None:
    refs = doc.get("references") or []
    if not refs:
        return
    cells = {(c["initiator"], c["target"]): c for c in doc.get("cells", [])}
    t = _table(out, "references (same initiator CPUs and target node)")
    for col in ("cell", "figure", "tilewise", "reference", "tilewise/reference", "reference tool"):
        t.add_column(col, justify="left" if col in ("cell", "figure", "reference tool") else "right")
    for r in refs:
        c = cells.get((r["initiator"], r["target"]), {})
        label = f"{r['initiator']} -> node {r['target']}"
        res = c.get("results") or {}
        for test, lk in (r.get("likwid") or {}).items():
            ours = (res.get(test) or {}).get(str(r["threads"]), {}).get("median")
            if "gbs" in lk:
                t.add_row(label, f"{test} @{r['threads']}", _fmt(ours, test), f"{lk['gbs']:.2f}",
                          f"{ours / lk['gbs']:.3f}" if ours else "-", f"likwid-bench {lk['kernel']}")
            else:
                t.add_row(label, f"{test} @{r['threads']}", _fmt(ours, test), "not measured", "-",
                          f"likwid-bench: {lk.get('error')}")
        ours = ((res.get("latency") or {}).get("1") or {}).get("median")
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


def csv_files(doc: dict) -> dict[str, str]:
    rows = []
    for c in doc.get("cells", []):
        p = (c.get("placement") or {}).get("before") or {}
        base = [c["initiator"], c["target"], c.get("status"), p.get("pages", ""), p.get("on_target", ""), p.get("policy", "")]
        res = c.get("results") or {}
        if c.get("status") != "measured" or not res:
            rows.append(base + ["", "", "", "", "", "", "", c.get("reason") or ""])
            continue
        for test, by in res.items():
            for k, r in sorted(by.items(), key=lambda kv: int(kv[0])):
                if "median" not in r:
                    rows.append(base + [test, k, "", "", "", "", r.get("unit", ""), "not supported by this build"])
                    continue
                rows.append(base + [test, k, r["median"], r["best"], r["p10"], r["p90"], r["unit"], ""])
    if not rows:
        return {}
    header = ["initiator", "target", "status", "pages", "pages_on_target", "policy", "test", "threads", "median",
              "best", "p10", "p90", "unit", "reason"]
    return {"memory.csv": T.csv_text(header, rows)}


def plots(doc: dict, out_dir: Path) -> list[Path]:
    if not doc.get("complete"):
        return []
    paths = []
    for test in doc.get("tests", []):
        inits, targets, vals = grid(doc, test)
        if all(v is None for row in vals for v in row):
            continue
        title = f"{TITLES.get(test, test)} ({_unit(test)})" + (" - EMULATED, not the memory's" if doc.get("emulated") else "")
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


@dataclass
class MemoryDoc(document.Document):
    """The typed view: the envelope, and the body as JSON (the functions above read it so)."""

    initiators: list[dict] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    cells: list[dict] = field(default_factory=list)


def _json(fn):
    return lambda doc, *a: fn(doc.to_json(), *a)


KIND = Kind(name="probe.memory", document=MemoryDoc, metrics=_json(metrics), render=_json(render), csv=_json(csv_files),
            plots=_json(plots), files=FILES)
