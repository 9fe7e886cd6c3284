"""Benchmark results: environment capture, results.json / results.csv, plots, tables.

results.json carries a format version, the environment it was measured in and the raw times, not
only summaries. Output files are checked before the first case and rewritten (atomically) after each
one, so a late failure loses nothing. The plotting helpers (bar_chart, save_figure) are shared with
the other benchmark commands.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from tilewise import fsutil
from tilewise.fsutil import atomic_write, atomic_write_json
from tilewise.environment import capture
from tilewise.errors import TilewiseError, UsageError

FORMAT = "tilewise-tpch-results/1"
SPREAD_WARN = 0.10  # relative spread (max-min)/median above which a query is called unstable


# ---- environment ------------------------------------------------------------------------------

def environment(topo, *, engine: str, engine_version: str, allocator: str, extra: dict | None = None) -> dict:
    return capture(topo, engine=engine, engine_version=engine_version, allocator=allocator, **(extra or {}))


# ---- statistics -------------------------------------------------------------------------------

def query_stats(times: list[float]) -> dict:
    if not times:
        return {"median_s": None, "min_s": None, "max_s": None, "stdev_s": None, "rel_spread": None}
    med = statistics.median(times)
    return {
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "stdev_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "rel_spread": (max(times) - min(times)) / med if med > 0 else 0.0,
    }


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarise(doc: dict) -> dict:
    """summary {policy: {total_s, geomean_speedup_vs_baseline, ...}}; the first policy is the baseline."""
    pols = doc.get("policies", {})
    names = list(pols)
    summary: dict = {}
    if not names:
        return summary
    base = pols[names[0]]
    base_total = _total(base)
    for name in names:
        p = pols[name]
        speedups = []
        for q, rec in p.get("queries", {}).items():
            b = base.get("queries", {}).get(q, {}).get("median_s")
            m = rec.get("median_s")
            if b and m:
                speedups.append(b / m)
        total = _total(p)
        summary[name] = {
            "total_s": total,
            "sum_of_query_medians_s": sum(r["median_s"] for r in p.get("queries", {}).values() if r.get("median_s")) or None,
            "geomean_speedup_vs_baseline": geomean(speedups),
            "throughput_speedup_vs_baseline": (base_total / total) if base_total and total else None,
            "valid": all(r.get("valid") for r in p.get("queries", {}).values()) if p.get("queries") else None,
            "complete": p.get("complete", False),
        }
    return summary


def _total(p: dict) -> float | None:
    runs = p.get("run_wall_s") or []
    return statistics.median(runs) if runs else None


# ---- files ------------------------------------------------------------------------------------

class ResultsWriter:
    """Owns DIR: checks it before the first case, rewrites results.json/csv and plots after each."""

    def __init__(self, out_dir: str | Path, *, plots: bool = True) -> None:
        self.dir = fsutil.ensure_writable_dir(out_dir)
        self.plots = plots
        self.json_path = self.dir / "results.json"
        self.csv_path = self.dir / "results.csv"
        self.plot_paths: list[Path] = []

    def write(self, doc: dict) -> None:
        doc["summary"] = summarise(doc)
        try:
            atomic_write_json(self.json_path, doc, default=str)
            atomic_write(self.csv_path, to_csv(doc))
        except OSError as e:
            raise TilewiseError(f"cannot write results to {self.dir}: {e.strerror}") from None
        if self.plots:
            try:
                self.plot_paths = plot_tpch(doc, self.dir)
            except Exception as e:  # a plot is a report, never a reason to lose a run
                doc.setdefault("warnings", []).append(f"plots not written: {e}")


def load(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {p}: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(f"{p} is not valid JSON: {e}") from None
    if doc.get("format") != FORMAT:
        raise UsageError(f"{p} has result format {doc.get('format')!r}; this tilewise reads {FORMAT!r}")
    return doc


def to_csv(doc: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["policy", "query", "run", "time_s", "median_s", "rel_spread", "rows", "valid",
                "speedup_vs_baseline", "instances"])
    pols = doc.get("policies", {})
    names = list(pols)
    base = pols[names[0]] if names else {}
    for name in names:
        p = pols[name]
        for q, rec in p.get("queries", {}).items():
            b = base.get("queries", {}).get(q, {}).get("median_s")
            sp = (b / rec["median_s"]) if b and rec.get("median_s") else ""
            for i, t in enumerate(rec.get("times_s", []), 1):
                w.writerow([name, q, i, f"{t:.6f}", f"{rec['median_s']:.6f}", f"{rec.get('rel_spread') or 0:.4f}",
                            rec.get("rows"), rec.get("valid"), f"{sp:.4f}" if sp != "" else "",
                            len(p.get("instances", []))])
    return buf.getvalue()


# ---- plots ------------------------------------------------------------------------------------

def save_figure(fig, path: Path) -> Path:
    return fsutil.save_figure(fig, path, bbox_inches="tight")


def bar_chart(path: Path, categories: list[str], series: dict[str, list[float | None]], *,
              ylabel: str, title: str, reference_line: float | None = 1.0) -> Path:
    """Grouped bars: one group per category, one bar per series (None -> no bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(series))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(categories) * max(1, n) ** 0.5 + 2), 3.6))
    try:
        for k, (label, vals) in enumerate(series.items()):
            xs = [i + (k - (n - 1) / 2) * width for i in range(len(categories))]
            ys = [v if v is not None else 0.0 for v in vals]
            ax.bar(xs, ys, width=width, label=label)
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels(categories, rotation=0 if len(categories) <= 8 else 60, fontsize=8)
        if reference_line is not None:
            ax.axhline(reference_line, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if n > 1:
            ax.legend(fontsize=8)
        return save_figure(fig, path)
    finally:
        plt.close(fig)


def plot_tpch(doc: dict, out_dir: Path) -> list[Path]:
    pols = doc.get("policies", {})
    names = list(pols)
    if not names:
        return []
    base_name = names[0]
    base = pols[base_name]
    qs = [q for q in base.get("queries", {})]
    series = {}
    for name in names:
        vals = []
        for q in qs:
            b = base["queries"][q].get("median_s")
            m = pols[name].get("queries", {}).get(q, {}).get("median_s")
            vals.append(b / m if b and m else None)
        series[name] = vals
    tag = f"{doc.get('engine')} SF {doc.get('sf')}, {doc.get('streams', 1)} stream(s)"
    paths = [bar_chart(out_dir / "speedup_per_query.png", qs, series, ylabel=f"speedup over {base_name}",
                       title=f"TPC-H per-query speedup over {base_name} ({tag})")]
    summ = summarise(doc)
    paths.append(bar_chart(out_dir / "geomean_speedup.png", names,
                           {"geomean per-query speedup": [summ[n]["geomean_speedup_vs_baseline"] for n in names],
                            "throughput (total time) speedup": [summ[n]["throughput_speedup_vs_baseline"] for n in names]},
                           ylabel=f"speedup over {base_name}", title=f"TPC-H geomean per policy ({tag})"))
    return paths


# ---- tables -----------------------------------------------------------------------------------

def _fmt(x, spec=".3f", none="-"):
    return none if x is None else format(x, spec)


def render(doc: dict, out=None) -> None:
    """Readable tables: per-query medians per policy, then the summary per policy."""
    from rich.table import Table

    from tilewise.cli.common import console

    out = out or console()
    pols = doc.get("policies", {})
    names = list(pols)
    if not names:
        out.print("no results")
        return
    summ = doc.get("summary") or summarise(doc)
    qt = Table(title=f"TPC-H {doc.get('engine')} SF {doc.get('sf')}: median seconds per query "
                     f"({doc.get('runs')} run(s), {doc.get('streams')} stream(s))", show_edge=False, pad_edge=False)
    qt.add_column("query")
    for n in names:
        qt.add_column(n, justify="right")
    qs = []
    for n in names:
        for q in pols[n].get("queries", {}):
            if q not in qs:
                qs.append(q)
    for q in qs:
        cells = []
        for n in names:
            rec = pols[n].get("queries", {}).get(q)
            if not rec:
                cells.append("-")
                continue
            c = _fmt(rec.get("median_s"))
            if rec.get("valid") is False:
                c += " WRONG"
            elif rec.get("rel_spread") and rec["rel_spread"] > SPREAD_WARN and len(rec.get("times_s", [])) > 1:
                c += " ~"
            cells.append(c)
        qt.add_row(q, *cells)
    out.print(qt)
    st = Table(title="summary: total s = median wall time of a run; x = speedup over the first policy", show_edge=False, pad_edge=False)
    for col in ("policy", "inst", "total s", "geomean x", "throughput x", "answers"):
        st.add_column(col, justify="right" if col != "policy" else "left")
    for n in names:
        s = summ.get(n, {})
        valid = s.get("valid")
        label = n if pols[n].get("policy") in (None, n) else f"{n} ({pols[n]['policy']})"
        st.add_row(label, str(len(pols[n].get("instances", []))), _fmt(s.get("total_s")),
                   _fmt(s.get("geomean_speedup_vs_baseline"), ".2f"), _fmt(s.get("throughput_speedup_vs_baseline"), ".2f"),
                   "valid" if valid else ("WRONG" if valid is False else "-"))
    out.print(st)
    unstable = [f"{n}/{q}" for n in names for q, r in pols[n].get("queries", {}).items()
                if r.get("rel_spread") and r["rel_spread"] > SPREAD_WARN and len(r.get("times_s", [])) > 1]
    if unstable:
        out.print(f"note: {len(unstable)} measurement(s) marked ~ vary by more than {SPREAD_WARN:.0%} between runs "
                  f"(e.g. {', '.join(unstable[:4])}); use more --runs and a quiet machine", markup=False)
