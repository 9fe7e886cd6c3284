"""The ``layout`` result kind (`tilewise data layout`): candidate layouts of a data set measured for a
workload, an engine and a plan (thesis 004, ch. 5). Per layout and query: times (median, 95 % CI),
bytes read from storage and CPU-seconds; per layout: the workload's total, what making it cost,
its files, break-even in workload runs; the recommendation with its reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise.results import document
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind


@dataclass
class QueryFig(Record):
    times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    ci95: list[float] | None = None
    bytes_read: float | None = None
    bytes_requested: float | None = None
    cpu_s: float | None = None
    valid: bool | None = None
    copy: str | None = None


@dataclass
class WorkloadFig(Record):
    median_s: float | None = None
    runs_s: list[float] = field(default_factory=list)
    ci95: list[float] | None = None
    bytes_read: float | None = None
    cpu_s: float | None = None


@dataclass
class Transform(Record):
    time_s: float | None = None
    cpu_s: float | None = None
    bytes_written: int | None = None


@dataclass
class Layout(Record):
    name: str = ""
    spec: dict = field(default_factory=dict)
    why: str = ""
    queries: dict[str, QueryFig] = field(default_factory=dict)
    workload: WorkloadFig = field(default_factory=WorkloadFig)
    transform: Transform = field(default_factory=Transform)
    files: dict = field(default_factory=dict)
    storage_bytes: int | None = None
    max_file_bytes: int | None = None
    break_even_runs: float | None = None
    break_even_cpu_runs: float | None = None


@dataclass
class Recommendation(Record):
    layout: str = ""
    reasons: list[str] = field(default_factory=list)
    ranking: list[str] = field(default_factory=list)


@dataclass
class LayoutDoc(document.Document):
    source: dict = field(default_factory=dict)
    deployment: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)
    candidates: list = field(default_factory=list)
    layouts: list[Layout] = field(default_factory=list)
    recommendation: Recommendation | None = None
    applied: dict | None = None


def metrics(doc: LayoutDoc) -> list[dict]:
    out = []
    for e in doc.layouts:
        out.append(document.metric(f"{e.name}/workload", e.workload.runs_s, unit="s", layout=e.name))
        for q, v in e.queries.items():
            out.append(document.metric(f"{e.name}/{q}", v.times_s, unit="s", layout=e.name, query=q))
    return out


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def _runs(x) -> str:
    return "never" if x is None else f"{x:.1f}"


def render(doc: LayoutDoc, c) -> None:
    src, dep = doc.source, doc.deployment
    c.print(f"{src.get('label', 'data')} ({src.get('format')}), {len(src.get('tables') or {})} tables; "
            f"{doc.params.get('engine')} on {dep.get('tiles')} tile(s) of {dep.get('threads_per_tile')} thread(s); "
            f"{doc.cache.get('method', '')}", markup=False, highlight=False)
    srt = (doc.workload or {}).get("sort")
    if srt:
        c.print(f"sort column from the workload: {srt['table']}.{srt['column']} ({srt['reason']})", markup=False,
                highlight=False)
    if not doc.layouts:
        c.print("no layout measured", markup=False)
        T.footer(doc, c)
        return
    names = [e.name for e in doc.layouts]
    qs = list(doc.layouts[0].queries)
    t = T.table("time per query: median s (MB read from storage)", ("query", *names), left=["query"])
    for q in qs:
        row = []
        for e in doc.layouts:
            v = e.queries.get(q)
            mark = "" if v is None or v.valid is not False else " WRONG"
            star = "*" if v is not None and v.copy == "sorted" else ""
            row.append("-" if v is None or v.median_s is None else f"{v.median_s:.4f}{star} ({_mb(v.bytes_read)}){mark}")
        t.add_row(q, *row)
    c.print(t)
    s = T.table("per layout: the workload, making the layout, its files",
                ("layout", "workload s", "95 % CI", "MB read", "CPU-s", "make s", "make CPU-s", "MB written",
                 "files (largest)", "break-even runs"), left=["layout"])
    for e in doc.layouts:
        w, tr = e.workload, e.transform
        ci = f"{w.ci95[0]:.3f}-{w.ci95[1]:.3f}" if w.ci95 else "-"
        largest = max(e.files.values(), key=lambda f: f.get("bytes", 0), default=None) if e.files else None
        files = f"{largest['files']} x {largest['max_file_bytes'] / 1e6:.2f} MB" if largest else "-"
        s.add_row(e.name, T.fmt(w.median_s), ci, _mb(w.bytes_read), T.fmt(w.cpu_s, ".2f"), T.fmt(tr.time_s, ".2f"),
                  T.fmt(tr.cpu_s, ".2f"), _mb(tr.bytes_written), files, "-" if e.spec.get("format") != "parquet" or
                  e.spec.get("files") is None else _runs(e.break_even_runs))
    c.print(s)
    tiled = [e for e in doc.layouts if e.get("tiles")]
    if tiled:
        tabs = doc.source.get("tables") or {}
        big = max(tabs, key=lambda t: tabs[t].get("bytes") or 0) if tabs else None
        tt = T.table(f"{big} per tile, by the engine's split rule: tasks / files / row groups / MB",
                     ("layout", *(f"tile {x['tile']}" for x in (tiled[0].get("tiles") or {}).get(big, []))),
                     left=["layout"])
        for e in tiled:
            tt.add_row(e.name, *(f"{x['tasks']} / {x['files']} / {x['row_groups']} / {x['bytes'] / 1e6:.2f}"
                                 for x in e.get("tiles").get(big, [])))
        c.print(tt)
    if any(v.copy for e in doc.layouts for v in e.queries.values()):
        c.print("* read from the sorted copy (two-copy layouts: each query's runs are those of the copy it reads)",
                markup=False)
    r = doc.recommendation
    if r is not None:
        c.print(f"recommendation: {r.layout}", markup=False, highlight=False)
        T.lines(c, "  - ", r.reasons)
    if doc.applied:
        c.print(f"applied: {doc.applied.get('layout')} -> {doc.applied.get('path') or doc.applied.get('note')}",
                markup=False, highlight=False)
    T.footer(doc, c)


def csv(doc: LayoutDoc) -> dict[str, str]:
    rows = []
    for e in doc.layouts:
        for q, v in e.queries.items():
            ci = v.ci95 or [None, None]
            rows.append([e.name, q, v.median_s, ci[0], ci[1], v.bytes_read, v.bytes_requested, v.cpu_s, v.copy or "",
                         v.valid])
    per = [[e.name, e.workload.median_s, e.workload.bytes_read, e.workload.cpu_s, e.transform.time_s,
            e.transform.cpu_s, e.transform.bytes_written, e.storage_bytes, e.max_file_bytes, e.break_even_runs]
           for e in doc.layouts]
    return {
        "layout-queries.csv": T.csv_text(("layout", "query", "median_s", "ci95_low_s", "ci95_high_s", "bytes_read",
                                          "bytes_requested", "cpu_s", "copy", "valid"), rows),
        "layouts.csv": T.csv_text(("layout", "workload_s", "bytes_read", "cpu_s", "make_s", "make_cpu_s",
                                   "bytes_written", "storage_bytes", "max_file_bytes", "break_even_runs"), per),
    }


KIND = Kind(name="layout", document=LayoutDoc, metrics=metrics, render=render, csv=csv,
            files=("layout-queries.csv", "layouts.csv"))
