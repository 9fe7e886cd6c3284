"""The reporting module: dispatch to the result kinds, and the comparison of runs.

A results document is shown, written as CSV and drawn by its kind (``results.kinds``: one module
per kind with its typed body, tables, CSV and plots); a kind without tables of its own gets the
generic view of its metrics here. ``compare`` matches several runs metric by metric (the
kind-independent view) for `tilewise report DIR...`, and a kind may add a comparison of its own
(``Kind.compare``: TPC-H next to JCC-H). Tables go to the rich console passed in (never one of its
own), CSV files come back as text, plots go to a folder. Nothing here measures, and nothing below
the command line imports the command line.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.results import document, kinds, model, stats
from tilewise.results import plots
from tilewise.results import tables as T
from tilewise.results.body import Record


# ---- dispatch -----------------------------------------------------------------------------------

def _kind(doc: dict) -> kinds.Kind | None:
    return kinds.get(doc.get("kind"))


def prepare(doc: dict) -> dict:
    """Before a document is written: its metrics (from the body) and its kind's summary, from one
    typed view of it."""
    k = _kind(doc)
    if k is None:
        return doc
    view = k.view(doc) if (k.metrics is not None or k.summary is not None) else None
    model.with_metrics(doc, view)
    if k.summary is not None:
        doc["summary"] = k.summary(view)
    return doc


def render(doc: dict, out) -> None:
    """The readable view of a results document on the console `out`."""
    k = _kind(doc)
    if k is not None and k.render is not None:
        k.render(k.view(doc), out)
    else:
        render_metrics(document.Document.from_json(doc), out)


def csv_files(doc: dict) -> dict[str, str]:
    k = _kind(doc)
    if k is not None and k.csv is not None:
        return k.csv(k.view(doc))
    return metrics_csv(document.Document.from_json(doc))


def plot_files(doc: dict, out_dir: Path) -> list[Path]:
    k = _kind(doc)
    return k.plots(k.view(doc), Path(out_dir)) if k is not None and k.plots is not None else []


def owned_files(doc: dict) -> tuple[str, ...]:
    """Every file the document's kind may write beside its JSON."""
    k = _kind(doc)
    return k.owned(doc) if k is not None else ("metrics.csv",)


# ---- any kind: the metrics ----------------------------------------------------------------------

def render_metrics(doc: document.Document, out) -> None:
    """The generic view: one row per metric with n, min/median/max, 95 % CI and outliers."""
    if not doc.metrics:
        out.print("no metrics", markup=False)
        return
    t = T.table(f"{doc.kind}: {len(doc.metrics)} metric(s)",
                ("metric", "unit", "n", "min", "median", "max", "95 % CI", "outliers"), left=("metric", "unit"))
    for m in doc.metrics:
        s = stats.summarize(m.values)
        ci = s["ci95"]
        t.add_row(m.name, m.unit, str(s["n"]), T.num(s["min"]), T.num(s["median"]), T.num(s["max"]),
                  f"{T.num(ci[0])}-{T.num(ci[1])}" if ci else "-", str(len(s["outliers"])) if s["outliers"] else "")
    out.print(t)
    T.footer(doc, out)


def metrics_csv(doc: document.Document) -> dict[str, str]:
    rows = [[m.name, m.unit, m.better, i, v] for m in doc.metrics for i, v in enumerate(m.values, 1)]
    return {"metrics.csv": T.csv_text(["metric", "unit", "better", "run", "value"], rows)} if rows else {}


# ---- comparing runs (tilewise report DIR...) ------------------------------------------------------

ENV_KEYS = (("hostname",), ("cpu_model",), ("kernel",), ("topology", "summary"), ("topology", "fingerprint"),
            ("tilewise_version",), ("git_commit",), ("engines",), ("os", "thp_enabled"), ("os", "autonuma"),
            ("system_check", "governor"), ("system_check", "turbo"))
UNCOMPARED_PARAMS = ("dataset", "data_dir", "cpus")  # where the data or CPUs were, not what was measured


@dataclass
class RunInfo(Record):
    label: str = ""
    kind: str | None = None
    command: str | None = None
    hostname: str | None = None
    git_commit: str | None = None
    started: str | None = None
    complete: bool | None = None
    interrupted: bool | None = None

    @property
    def state(self) -> str:
        return "interrupted" if self.interrupted else ("complete" if self.complete else "incomplete")


@dataclass
class RunFigures(Record):
    """One run's figures of a metric."""
    n: int = 0
    median: float | None = None
    min: float | None = None
    max: float | None = None
    ci95: list[float] | None = None


@dataclass
class VsFirst(Record):
    """A later run against the first: ratio of geometric means, its 95 % interval, the verdict."""
    ratio: float = 1.0
    ci95: list[float] | None = None
    verdict: str = "n/a"


@dataclass
class Row(Record):
    name: str = ""
    unit: str = ""
    better: str = "lower"
    runs: list[RunFigures | None] = field(default_factory=list)
    vs_first: list[VsFirst | None] = field(default_factory=list)


@dataclass
class Comparison(Record):
    format: str = "tilewise-report"
    version: int = 1
    runs: list[RunInfo] = field(default_factory=list)
    environment_differences: dict[str, list] = field(default_factory=dict)
    parameter_differences: dict[str, list] = field(default_factory=dict)
    metrics: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _differences(values_per_run: list[dict], keys, *, as_text) -> dict[str, list]:
    out = {}
    for key in keys:
        vals = [_get(v, key) if isinstance(key, tuple) else v.get(key) for v in values_per_run]
        if len({as_text(v) for v in vals}) > 1:
            out[".".join(key) if isinstance(key, tuple) else key] = vals
    return out


def compare(runs: Sequence[tuple[str, dict]], *, select: str | None = None) -> dict:
    """Compare documents metric by metric: each later run against the first (ratio of geometric
    means with a 95 % interval; the verdict says better, worse or within noise)."""
    if not runs:
        raise ValueError("nothing to compare")
    docs = [(label, document.Document.from_json(d)) for label, d in runs]
    out = Comparison(runs=[RunInfo(label=label, kind=d.kind, command=d.meta.command,
                                   hostname=d.environment.get("hostname"), git_commit=d.meta.git_commit,
                                   started=d.meta.started, complete=d.complete, interrupted=d.interrupted)
                           for label, d in docs])
    kind_names = {d.kind for _, d in docs}
    if len(kind_names) > 1:
        out.notes.append(f"the runs are of different kinds ({', '.join(sorted(map(str, kind_names)))}); only metrics "
                         "with the same name are compared")
    out.environment_differences = _differences([d.environment.to_json() for _, d in docs], ENV_KEYS, as_text=repr)
    params = [d.params for _, d in docs]
    keys = [k for k in dict.fromkeys(k for p in params for k in p) if k not in UNCOMPARED_PARAMS]
    out.parameter_differences = _differences(params, keys,
                                             as_text=lambda v: json.dumps(v, sort_keys=True, default=str))
    if "tests" in out.parameter_differences:
        out.notes.append("the runs ran different tests (params.tests): a metric of the same name (e.g. run_wall) "
                         "may measure different work")
    by_run = [{m.name: m for m in d.metrics} for _, d in docs]
    names = [n for n in dict.fromkeys(n for ms in by_run for n in ms) if not select or fnmatch.fnmatch(n, select)]
    for name in names:
        first = next(ms[name] for ms in by_run if name in ms)
        row = Row(name=name, unit=first.unit, better=first.better)
        base = by_run[0].get(name)
        for k, ms in enumerate(by_run):
            m = ms.get(name)
            s = stats.summarize(m.values) if m else None
            row.runs.append(None if s is None else RunFigures(n=s["n"], median=s["median"], min=s["min"], max=s["max"],
                                                              ci95=s["ci95"]))
            if k == 0:
                continue
            r = stats.ratio_ci(base.values, m.values) if m is not None and base is not None else None
            row.vs_first.append(None if r is None else VsFirst(r["ratio"], r["ci95"], _verdict(r["ci95"], row.better)))
        out.metrics.append(row)
    return out.to_json()


def _verdict(ci: list[float] | None, better: str) -> str:
    """better / worse when the 95 % interval of the ratio excludes 1; "same" when it holds 1 (the
    difference is within the noise); "n/a" when a run has a single value (no interval)."""
    if ci is None:
        return "n/a"
    if ci[0] <= 1.0 <= ci[1]:
        return "same"
    up = ci[0] > 1.0
    return "better" if (up == (better == "higher")) else "worse"


def render_comparison(cmp: dict, out) -> None:
    c = Comparison.from_json(cmp, "comparison")
    rt = T.table("runs", ("#", "run", "kind", "host", "commit", "started", "state"),
                 left=("#", "run", "kind", "host", "commit", "started", "state"))
    for i, r in enumerate(c.runs, 1):
        rt.add_row(str(i), r.label, str(r.kind), str(r.hostname or "-"), (r.git_commit or "-")[:12],
                   str(r.started or "-"), r.state)
    out.print(rt)
    for what, first, diffs in (("environment", "field", c.environment_differences),
                               ("parameter", "parameter", c.parameter_differences)):
        if diffs:  # one row per field whose value differs between the runs, one column per run
            dt = T.table(f"{what} differences", [first, *(f"#{i + 1}" for i in range(len(c.runs)))],
                         left=[first, *(f"#{i + 1}" for i in range(len(c.runs)))])
            for k, vals in diffs.items():
                dt.add_row(k, *(_short(v) for v in vals))
            out.print(dt)
    if not c.metrics:
        out.print("no metrics in common", markup=False)
    else:
        n = len(c.runs)
        title = ("metrics: median (n) per run; ratio = run / #1 (geometric means) with its 95 % CI"
                 if n > 1 else "metrics: median (n)")
        mt = T.table(title, ["metric", "unit", *(f"#{i + 1}" for i in range(n))], left=("metric", "unit"))
        for i in range(1, n):
            mt.add_column(f"#{i + 1}/#1", justify="right")
            mt.add_column("verdict")
        for row in c.metrics:
            cells = [row.name, row.unit]
            cells += ["-" if s is None else f"{T.num(s.median)} ({s.n})" for s in row.runs]
            for v in row.vs_first:
                if v is None:
                    cells += ["-", ""]
                    continue
                cells.append(f"{v.ratio:.3f}" + (f" [{v.ci95[0]:.3f}-{v.ci95[1]:.3f}]" if v.ci95 else ""))
                cells.append(v.verdict)
            mt.add_row(*cells)
        out.print(mt)
        out.print("verdict: better/worse = the 95 % interval of the ratio excludes 1; same = within the noise; "
                  "n/a = a single value, no interval", markup=False)
    T.lines(out, "note: ", c.notes)


def _short(v) -> str:
    s = str(v) if not isinstance(v, dict) else ", ".join(f"{k}={x}" for k, x in v.items())
    return s if len(s) <= 40 else s[:37] + "..."


def comparison_plot(cmp: dict, path: Path) -> Path | None:
    """Per metric, each later run's ratio to the first with its 95 % interval as error bars."""
    c = Comparison.from_json(cmp, "comparison")
    rows = [r for r in c.metrics if any(v is not None for v in r.vs_first)]
    if not rows or len(c.runs) < 2:
        return None
    labels = [r.label for r in c.runs]
    series = {f"{labels[j + 1]} / {labels[0]}": [(r.vs_first[j].ratio, r.vs_first[j].ci95) if r.vs_first[j] else None
                                                  for r in rows] for j in range(len(labels) - 1)}
    return plots.ratios(path, [f"{r.name} ({r.better} is better)" for r in rows], series)


def comparison_csv(cmp: dict) -> str:
    c = Comparison.from_json(cmp, "comparison")
    n = len(c.runs)
    header = ["metric", "unit", "better"]
    for i in range(1, n + 1):
        header += [f"run{i}_n", f"run{i}_median", f"run{i}_ci_low", f"run{i}_ci_high"]
    for i in range(2, n + 1):
        header += [f"run{i}_vs_run1", f"run{i}_vs_run1_ci_low", f"run{i}_vs_run1_ci_high", f"run{i}_verdict"]
    rows = []
    for r in c.metrics:
        row = [r.name, r.unit, r.better]
        for s in r.runs:
            row += ["", "", "", ""] if s is None else [s.n, s.median, *(s.ci95 or ["", ""])]
        for v in r.vs_first:
            row += ["", "", "", ""] if v is None else [v.ratio, *(v.ci95 or ["", ""]), v.verdict]
        rows.append(row)
    return T.csv_text(header, rows)


# ---- a kind's own comparison (TPC-H next to JCC-H) ------------------------------------------------

def kind_comparisons(runs: Sequence[tuple[str, dict]]) -> list:
    """The comparisons the runs' kinds make of their own (each with .key, .data, .render(out) and
    .plot(out_dir)); `tilewise report` shows them after the metrics and stores them under .key."""
    out = []
    for name in dict.fromkeys(d.get("kind") for _, d in runs):
        k = kinds.get(name)
        got = k.compare(list(runs)) if k is not None and k.compare is not None else None
        if got is not None:
            out.append(got)
    return out

