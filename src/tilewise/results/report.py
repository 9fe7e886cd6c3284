"""The one reporting module: tables, CSV files and plots of every results document, and the
comparison of several runs (`tilewise report`).

Everything here reads a results document (results.model) and writes to what it is given: tables
go to the rich console passed in (never one of its own), CSV files come back as text, plots go to
a folder. Nothing here measures, and nothing below the command line imports the command line.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from collections.abc import Sequence
from pathlib import Path

from tilewise.results import model, stats

SPREAD_WARN = 0.10  # relative spread (max-min)/median above which a measurement is called unstable


# ---- formatting -------------------------------------------------------------------------------

def fmt(x, spec: str = ".3f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _table(title: str | None = None):
    from rich.table import Table

    return Table(title=title, show_edge=False, pad_edge=False)


def _ci_half(s: dict) -> float | None:
    ci = s.get("ci95")
    return None if not ci else (ci[1] - ci[0]) / 2


def human_bytes(n: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n} B"


def _print_lines(out, prefix: str, lines: Sequence[str]) -> None:
    for line in lines:
        out.print(f"{prefix}{line}", markup=False, highlight=False)


def render_environment_warnings(doc: dict, out) -> None:
    check = (doc.get("environment") or {}).get("system_check") or {}
    _print_lines(out, "system: ", check.get("warnings") or [])


# ---- TPC-H ------------------------------------------------------------------------------------

def query_stats(times: Sequence[float]) -> dict:
    """The per-query statistics stored beside the raw times (stdev None with one run)."""
    s = stats.summarize(times)
    return {"n": s["n"], "median_s": s["median"], "min_s": s["min"], "max_s": s["max"], "mean_s": s["mean"],
            "stdev_s": s["stdev"], "ci95_s": s["ci95"], "rel_spread": s["rel_spread"], "outliers": s["outliers"]}


def _unstable(rec: dict) -> bool:
    return bool(rec.get("rel_spread") and rec["rel_spread"] > SPREAD_WARN and len(rec.get("times_s", [])) > 1)


def tpch_summary(doc: dict) -> dict:
    """summary {policy: {...}}; the first policy that ran is the baseline. A policy that is the
    same deployment as an earlier one (same_as) gets no figures of its own."""
    pols = doc.get("policies", {})
    summary: dict = {}
    ran = [n for n, p in pols.items() if not p.get("same_as")]
    base = pols[ran[0]] if ran else {}
    base_total = _median(base.get("run_wall_s"))
    for name, p in pols.items():
        if p.get("same_as"):
            summary[name] = {"same_as": p["same_as"], "complete": p.get("complete", False)}
            continue
        speedups = []
        for q, rec in p.get("queries", {}).items():
            b = base.get("queries", {}).get(q, {}).get("median_s")
            m = rec.get("median_s")
            if b and m:
                speedups.append(b / m)
        total = stats.summarize(p.get("run_wall_s") or [])
        s = {
            "same_as": None,
            "runs": total["n"],
            "total_s": total["median"], "total_min_s": total["min"], "total_max_s": total["max"],
            "total_ci95_s": total["ci95"], "total_outliers": total["outliers"],
            "sum_of_query_medians_s": sum(r["median_s"] for r in p.get("queries", {}).values() if r.get("median_s")) or None,
            "geomean_speedup_vs_baseline": stats.geomean(speedups),
            "throughput_speedup_vs_baseline": (base_total / total["median"]) if base_total and total["median"] else None,
            "valid": _all_valid([r.get("valid") for r in p.get("queries", {}).values()]),
            "not_comparable": sum(1 for r in p.get("queries", {}).values() if r.get("not_comparable")),
            "complete": p.get("complete", False),
        }
        for key, _ in model.metric_names(doc):
            vals = [r.get(key) for r in p.get("tpch_runs", []) if r.get(key) is not None]
            if vals:
                s[key] = stats.summarize(vals)
        summary[name] = s
    return summary


def _all_valid(verdicts: list) -> bool | None:
    """False when an answer was wrong (or a query failed), True when every one was valid, else None
    (not validated, or without a reference answer)."""
    if not verdicts or any(v is False for v in verdicts):
        return False if verdicts else None
    return True if all(v is True for v in verdicts) else None


def _median(xs) -> float | None:
    return model.median_or_none(xs or [])


def benchmark_of(doc: dict) -> str:
    """"tpch" or "jcch": which benchmark a tpch-kind document measured."""
    p = doc.get("params", {})
    return p.get("benchmark") or (p.get("dataset") or {}).get("benchmark") or "tpch"


def _bench(doc: dict) -> str:
    """The benchmark's name for titles, as the harness recorded it (TPC-DS); else TPC-H, or JCC-H
    with its parameter set."""
    if doc.get("params", {}).get("benchmark_title"):
        return doc["params"]["benchmark_title"]
    if benchmark_of(doc) == "jcch":
        mode = doc.get("params", {}).get("query_params")
        return f"JCC-H ({mode})" if mode else "JCC-H"
    return "TPC-H"


def query_order(q: str):
    """Sort key of a query name: "q2" < "q10" < "q14a" < "q14b" < "q15"."""
    import re

    m = re.fullmatch(r"q?(\d+)(.*)", q)
    return (int(m.group(1)), m.group(2)) if m else (10**9, q)


def _tpch_title(doc: dict) -> str:
    p = doc.get("params", {})
    sf = f"{p.get('sf'):g}" if isinstance(p.get("sf"), (int, float)) else str(p.get("sf"))
    return f"{_bench(doc)} {p.get('engine')} SF {sf}"


def render_tpch(doc: dict, out) -> None:
    pols = doc.get("policies", {})
    p = doc.get("params", {})
    measured = [n for n, r in pols.items() if not r.get("same_as") and any(q.get("times_s") for q in r.get("queries", {}).values())]
    if doc.get("interrupted"):
        done = doc.get("completed", {}).get("policies", [])
        out.print(f"INTERRUPTED: {len(done)} of {len(doc.get('requested', {}).get('policies', []))} policies "
                  f"completed ({', '.join(done) or 'none'}); the tables show only what was measured", markup=False)
    if not measured:
        out.print("no measurements to show" + (" (interrupted before the first timed run)" if doc.get("interrupted") else ""),
                  markup=False)
        _tpch_notes(doc, out)
        return
    summ = doc.get("summary") or tpch_summary(doc)
    source = "power test, one stream" if "power" in (p.get("tests") or []) else f"{p.get('streams')} stream(s)"
    qt = _table(f"{_tpch_title(doc)}: median seconds per query ±95 % CI ({p.get('runs')} timed run(s), {source})")
    qt.add_column("query")
    for n in measured:
        qt.add_column(n, justify="right")
    qs: list[str] = []
    for n in measured:
        for q in pols[n].get("queries", {}):
            r = pols[n]["queries"][q]
            if q not in qs and (r.get("times_s") or r.get("failed")):
                qs.append(q)
    qs.sort(key=query_order)
    for q in qs:
        cells = []
        for n in measured:
            rec = pols[n].get("queries", {}).get(q)
            if rec and rec.get("failed"):
                cells.append("FAILED")  # the engine could not run it (its error is in results.json)
                continue
            if not rec or not rec.get("times_s"):
                cells.append("-")
                continue
            c = fmt(rec.get("median_s"))
            half = _ci_half({"ci95": rec.get("ci95_s")})
            if half is not None:
                c += f" ±{half:.3f}"
            if rec.get("valid") is False:
                c += " WRONG"
            elif rec.get("not_comparable"):
                c += " n/c"
            elif _unstable(rec):
                c += " ~"
            if rec.get("outliers"):
                c += " !"
            cells.append(c)
        qt.add_row(q, *cells)
    out.print(qt)
    st = _table("summary: total s = median wall time of a run (throughput test when it ran); "
                "x = speedup over the first policy")
    for col in ("policy", "inst", "n", "total s", "min-max", "95 % CI", "geomean x", "thrpt x", "answers"):
        st.add_column(col, justify="left" if col == "policy" else "right")
    for n, rec in pols.items():
        s = summ.get(n, {})
        label = n if rec.get("policy") in (None, n) else f"{n} ({rec['policy']})"
        if rec.get("same_as"):
            st.add_row(label, str(len(rec.get("instances", []))), "", f"= {rec['same_as']}", "", "",
                       f"= {rec['same_as']}", f"= {rec['same_as']}", "")
            continue
        if n not in measured:
            st.add_row(label, str(len(rec.get("instances", []))), "0", "not measured" if not rec.get("error") else "failed",
                       "", "", "", "", "")
            continue
        ci = s.get("total_ci95_s")
        valid = s.get("valid")
        st.add_row(label, str(len(rec.get("instances", []))), str(s.get("runs") or 0), fmt(s.get("total_s")),
                   f"{fmt(s.get('total_min_s'))}-{fmt(s.get('total_max_s'))}",
                   f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-",
                   fmt(s.get("geomean_speedup_vs_baseline"), ".2f"), fmt(s.get("throughput_speedup_vs_baseline"), ".2f"),
                   _answers_cell(valid, s.get("not_comparable")))
    out.print(st)
    names = model.metric_names(doc)
    if any(summ.get(n, {}).get(key) for n in measured for key, _ in names):
        refresh = doc.get("refresh") or {}
        how = "with refresh functions RF1/RF2" if refresh.get("applied") else "without refresh functions"
        tpch_figures = names == model.TPCH_METRICS
        prefix = "" if benchmark_of(doc) == "tpch" or not tpch_figures else f"{_bench(doc)}: "
        which = "TPC-H" if tpch_figures else _bench(doc)
        mt = _table(f"{prefix}{which} metrics at SF {p.get('sf')} ({how}; median over runs, 95 % CI)")
        for col in ("policy", *(title for _, title in names), "streams"):
            mt.add_column(col, justify="left" if col == "policy" else "right")
        # the throughput test's streams; a run without it has none to show
        streams = str(p.get("streams")) if "throughput" in (p.get("tests") or ["throughput"]) else "-"
        for n, rec in pols.items():
            if rec.get("same_as"):
                mt.add_row(n, *(f"= {rec['same_as']}" for _ in names), "")
                continue
            s = summ.get(n, {})

            def cell(key):
                v = s.get(key)
                if not v or v.get("median") is None:
                    return "-"
                ci = v.get("ci95")
                return f"{v['median']:.1f}" + (f" ({ci[0]:.1f}-{ci[1]:.1f})" if ci else "")
            mt.add_row(n, *(cell(key) for key, _ in names), streams)
        out.print(mt)
    marks = []
    if any(r.get("not_comparable") for n in measured for r in pols[n].get("queries", {}).values()):
        marks.append("n/c = not comparable: the reference engine has no answer for it (see results.json)")
    if any(r.get("failed") for n in measured for r in pols[n].get("queries", {}).values()):
        marks.append("FAILED = the engine could not run it (its error is in results.json)")
    if any(_unstable(r) for n in measured for r in pols[n].get("queries", {}).values()):
        marks.append(f"~ = varies by more than {SPREAD_WARN:.0%} between runs (use more --runs and a quiet machine)")
    if any(r.get("outliers") for n in measured for r in pols[n].get("queries", {}).values()):
        marks.append("! = a run is an outlier (modified z-score > 3.5; see results.json)")
    _print_lines(out, "note: ", marks)
    _tpch_notes(doc, out)


def _answers_cell(valid: bool | None, not_comparable: int | None) -> str:
    if valid is False:
        return "WRONG"
    if not_comparable:
        return f"valid, {not_comparable} not comparable" if valid is None else "valid"
    return "valid" if valid else "-"


def _tpch_notes(doc: dict, out) -> None:
    _print_lines(out, "note: ", doc.get("notes") or [])
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


def tpch_csv(doc: dict) -> dict[str, str]:
    pols = doc.get("policies", {})
    ran = [n for n, p in pols.items() if not p.get("same_as")]
    base = pols[ran[0]] if ran else {}
    rows = []
    for name, p in pols.items():
        if p.get("same_as"):
            continue
        for q, rec in p.get("queries", {}).items():
            b = base.get("queries", {}).get(q, {}).get("median_s")
            sp = (b / rec["median_s"]) if b and rec.get("median_s") else None
            for i, t in enumerate(rec.get("times_s", []), 1):
                rows.append([name, q, i, f"{t:.6f}", fmt(rec.get("median_s"), ".6f", ""), fmt(rec.get("rel_spread"), ".4f", ""),
                             rec.get("rows"), rec.get("valid"), fmt(sp, ".4f", ""), len(p.get("instances", [])),
                             "yes" if (i - 1) in (rec.get("outliers") or []) else ""])
    files = {}
    if rows:
        files["results.csv"] = _csv(["policy", "query", "run", "time_s", "median_s", "rel_spread", "rows", "valid",
                                     "speedup_vs_baseline", "instances", "outlier"], rows)
    mrows = []
    keys = [key for key, _ in model.metric_names(doc)]
    for name, p in pols.items():
        for r in p.get("tpch_runs", []):
            mrows.append([name, r.get("run"), *(fmt(r.get(k), ".3f", "") for k in keys),
                          fmt((r.get("throughput") or {}).get("interval_s"), ".6f", ""),
                          (r.get("power") or {}).get("refresh", "")])
    if mrows:
        files["tpch_metrics.csv"] = _csv(["policy", "run", *keys, "throughput_interval_s", "refresh"], mrows)
    return files


def tpch_plots(doc: dict, out_dir: Path) -> list[Path]:
    from tilewise.results import plots

    pols = doc.get("policies", {})
    ran = [n for n, p in pols.items() if not p.get("same_as") and any(q.get("median_s") for q in p.get("queries", {}).values())]
    if not ran:
        return []
    base_name = ran[0]
    base = pols[base_name]
    qs = [q for q, r in base.get("queries", {}).items() if r.get("median_s")]
    p = doc.get("params", {})
    tag = f"{p.get('engine')} SF {p.get('sf')}, {p.get('streams', 1)} stream(s)"
    bench = _bench(doc)
    paths = []
    if qs and len(ran) > 1:
        series = {}
        for name in ran:
            vals = []
            for q in qs:
                b = base["queries"][q].get("median_s")
                m = pols[name].get("queries", {}).get(q, {}).get("median_s")
                vals.append(b / m if b and m else None)
            series[name] = vals
        paths.append(plots.bar_chart(out_dir / "speedup_per_query.png", qs, series, ylabel=f"speedup over {base_name}",
                                     title=f"{bench} per-query speedup over {base_name} ({tag})"))
    summ = tpch_summary(doc)
    geo = [summ[n].get("geomean_speedup_vs_baseline") for n in ran]
    thr = [summ[n].get("throughput_speedup_vs_baseline") for n in ran]
    if len(ran) > 1 and any(v is not None for v in geo + thr):
        paths.append(plots.bar_chart(out_dir / "geomean_speedup.png", ran,
                                     {"geomean per-query speedup": geo, "throughput (total time) speedup": thr},
                                     ylabel=f"speedup over {base_name}", title=f"{bench} geomean per policy ({tag})"))
    names = model.metric_names(doc)
    figures = {title: [(summ[n].get(k) or {}).get("median") for n in ran] for k, title in names}
    if any(v is not None for vals in figures.values() for v in vals):
        tpch_figures = names == model.TPCH_METRICS
        paths.append(plots.bar_chart(out_dir / "tpch_metrics.png", ran, figures,
                                     ylabel="queries per hour" + (" x SF" if tpch_figures else ""),
                                     title=f"{bench}: {'TPC-H ' if tpch_figures else ''}metrics per policy ({tag})",
                                     reference_line=None))
    return paths


# ---- bench elastic ----------------------------------------------------------------------------

def render_elastic(doc: dict, out) -> None:
    tab = _table()
    for col in ("workload", "config", "queries", "q/s", "p50 ms", "p95 ms", "CPU s", "CPU s/q", "cores mean",
                "core-s", "tick ms", "daemon %"):
        tab.add_column(col, justify="right" if col not in ("workload", "config") else "left")
    for r in doc.get("cases", []):
        dm = r.get("daemon") or {}
        tab.add_row(r["workload"], r["config"], str(r["queries_done"]), fmt(r.get("throughput_qps"), ".1f"),
                    fmt(r["latency_ms"]["p50"], ".1f"), fmt(r["latency_ms"]["p95"], ".1f"), f"{r['cpu_s']:.2f}",
                    fmt(r["cpu_s_per_query"], ".4f"), f"{r['cores_mean']:.2f}/{r['cores_total']}",
                    f"{r['core_seconds_allocated']:.1f}",
                    str((dm.get("tick_cpu_ms") or {}).get("mean", "-")), str(dm.get("daemon_cpu_pct_of_core", "-")))
    if doc.get("cases"):
        out.print(tab)
    else:
        out.print("no cases measured" + (" (interrupted)" if doc.get("interrupted") else ""), markup=False)
    _print_lines(out, "note: ", doc.get("notes") or [])
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


def elastic_plots(doc: dict, out_dir: Path) -> list[Path]:
    from tilewise.results import plots

    if not doc.get("cases") or not doc.get("complete"):
        return []
    return [plots.elastic(doc, out_dir / "elastic.png")]


def elastic_csv(doc: dict) -> dict[str, str]:
    rows = []
    for c in doc.get("cases", []):
        dm = c.get("daemon") or {}
        rows.append([c["workload"], c["config"], c["queries_done"], c.get("wall_s"), c.get("throughput_qps"),
                     c["latency_ms"].get("p50"), c["latency_ms"].get("p95"), c.get("cpu_s"), c.get("cpu_s_per_query"),
                     c.get("cores_mean"), c.get("cores_total"), (dm.get("tick_cpu_ms") or {}).get("mean"),
                     dm.get("daemon_cpu_pct_of_core")])
    if not rows:
        return {}
    return {"results.csv": _csv(["workload", "config", "queries", "wall_s", "throughput_qps", "p50_ms", "p95_ms", "cpu_s",
                                 "cpu_s_per_query", "cores_mean", "cores_total", "tick_cpu_ms", "daemon_cpu_pct"], rows)}


# ---- probes -----------------------------------------------------------------------------------

PAIR_MODE_TITLES = {"cas": "compare-and-swap on one line", "rw": "one writer / one reader on two lines",
                    "bw": "one writes a buffer, the other reads it"}


def _pair_fmt(doc: dict) -> str:
    return "{:.3f}" if doc.get("probe") == "bandwidth" else "{:.2f}"


def render_pairs(doc: dict, out) -> None:
    from tilewise.probes.pairs import CLASS_TITLES

    f = _pair_fmt(doc)
    unit = doc.get("unit", "")
    cpus = doc.get("cpus", [])
    for m in doc.get("matrices", {}):
        out.print(f"[bold]{doc['probe']} ({m}: {PAIR_MODE_TITLES.get(m, m)})[/bold], median per pair in {unit}")
        table = _table()
        for col in ("pair class", "mean", "median", "min", "max", "pairs"):
            table.add_column(col, justify="left" if col == "pair class" else "right")
        for cls, s in doc["summary"][m].items():
            table.add_row(CLASS_TITLES.get(cls, cls), f.format(s["mean"]), f.format(s["median"]), f.format(s["min"]),
                          f.format(s["max"]), str(s["pairs"]))
        out.print(table)
        if len(cpus) <= 16:
            mt = _table()
            mt.add_column("cpu", justify="right")
            for c in cpus:
                mt.add_column(str(c), justify="right")
            for i, (c, row) in enumerate(zip(cpus, doc["matrices"][m])):
                mt.add_row(str(c), *("-" if i == j else ("n/m" if v is None else f.format(v)) for j, v in enumerate(row)))
            out.print(mt)
    if not doc.get("matrices"):
        out.print("no pairs measured" + (" (interrupted)" if doc.get("interrupted") else ""), markup=False)
    out.print(f"pairs: {doc.get('pairs')}", markup=False)
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


def pairs_csv(doc: dict) -> dict[str, str]:
    if not doc.get("complete"):
        return {}
    f = _pair_fmt(doc)
    cpus = doc.get("cpus", [])
    files = {}
    for m, matrix in doc.get("matrices", {}).items():
        name = doc["probe"] if m == "bw" else f"{doc['probe']}_{m}"
        rows = [[a] + ["" if v is None else f.format(v) for v in row] for a, row in zip(cpus, matrix)]
        files[f"{name}.csv"] = _csv(["cpu"] + list(cpus), rows)
    return files


def pairs_plots(doc: dict, out_dir: Path) -> list[Path]:
    from tilewise.results import plots

    if not doc.get("complete"):
        return []
    paths = []
    unit = doc.get("unit", "")
    for m, matrix in doc.get("matrices", {}).items():
        name = doc["probe"] if m == "bw" else f"{doc['probe']}_{m}"
        title = (f"core-to-core {doc['probe']} ({m}, median {unit})" if m != "bw"
                 else f"core-to-core bandwidth (median {unit})")
        paths.append(plots.heatmap(out_dir / f"{name}.png", doc["cpus"], matrix, title, unit))
    return paths


STREAM_KERNELS = ("copy", "scale", "add", "triad")


def render_stream(doc: dict, out) -> None:
    from tilewise import cpulist

    runs = doc.get("runs", 1)
    out.print(f"[bold]STREAM[/bold] aggregate GB/s (best of {doc['ntimes'] - 1} repetitions after a warm-up"
              + (f", median over {runs} runs" if runs > 1 else "") + f"; CPUs {cpulist.format(doc['cpus'])})")
    if not doc.get("cases"):
        out.print("no cases measured" + (" (interrupted)" if doc.get("interrupted") else ""), markup=False)
    else:
        table = _table()
        for col in ("policy", "processes", "array size", *STREAM_KERNELS):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for c in doc["cases"]:
            table.add_row(c["policy"], str(c["instances"]), human_bytes(c["size_bytes"]),
                          *(f"{c['kernels'][k]['best_gbs']:.2f}" for k in STREAM_KERNELS))
        out.print(table)
    if doc.get("likwid"):
        out.print("[bold]reference: likwid-bench[/bold] (same number of threads, node domain; likwid reports the "
                  "mean over its run, tilewise the best and median repetition)")
        lt = _table()
        for col in ("array size", "tilewise wim copy best", "median", "likwid-bench", "best/likwid"):
            lt.add_column(col, justify="right")
        for lk in doc["likwid"]:
            ours = next((c["kernels"]["copy"] for c in doc["cases"]
                         if c["policy"] == "wim" and c["size_bytes"] == lk["size_bytes"]), None)
            best = f"{ours['best_gbs']:.2f}" if ours else "(wim not run)"
            med = f"{ours['median_gbs']:.2f}" if ours else "-"
            if "gbs" in lk:
                ratio = f"{ours['best_gbs'] / lk['gbs']:.3f}" if ours else "-"
                lt.add_row(human_bytes(lk["size_bytes"]), best, med, f"{lk['gbs']:.2f}", ratio)
            else:
                lt.add_row(human_bytes(lk["size_bytes"]), best, med, "not measured", "-")
        out.print(lt)
        for lk in doc["likwid"]:
            if "command" in lk:
                out.print(f"  likwid: {lk['command']}", markup=False)
            if "error" in lk:
                out.print(f"  likwid-bench failed: {lk['error']}", markup=False)
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


def stream_csv(doc: dict) -> dict[str, str]:
    if not doc.get("cases"):
        return {}
    header = ["policy", "instances", "size_bytes", *(f"{k}_best_gbs" for k in STREAM_KERNELS),
              *(f"{k}_median_gbs" for k in STREAM_KERNELS)]
    rows = [[c["policy"], c["instances"], c["size_bytes"], *(f"{c['kernels'][k]['best_gbs']:.3f}" for k in STREAM_KERNELS),
             *(f"{c['kernels'][k]['median_gbs']:.3f}" for k in STREAM_KERNELS)] for c in doc["cases"]]
    return {"stream.csv": _csv(header, rows)}


def stream_plots(doc: dict, out_dir: Path) -> list[Path]:
    from tilewise.results import plots

    if not doc.get("complete") or not doc.get("cases"):
        return []
    return [plots.stream(doc, out_dir / "stream.png")]


# ---- workload ---------------------------------------------------------------------------------

def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_workload(doc: dict, out) -> None:
    from tilewise.tune import workloads as wl

    r = doc["result"]
    w = doc["workload"]
    out.print(f"[bold]{w}[/bold] {wl.DESCRIPTIONS[w]}: dataset {r.get('dataset')}, {r.get('threads')} thread(s)")
    out.print(f"  config     {doc['label']}" + (f" (pinned to CPUs {r['pinned_cpus']})" if r.get("pinned_cpus") else ""),
              markup=False)
    out.print(f"  time       {r['time_s']:.3f} s" + (f"  (index build {r['build_s']:.3f} s, reported apart)" if w == "W4" else "")
              + (f"  (build {r['build_s']:.3f} s, probe {r['probe_s']:.3f} s)" if w == "W3" else ""), markup=False)
    out.print(f"  max RSS    {fmt_bytes(r['max_rss_bytes'])}", markup=False)
    if w == "alloc":
        out.print(f"  overhead   {r['memory_overhead']:.2f} x (max RSS / {fmt_bytes(r['requested_peak_bytes'])} requested at peak)",
                  markup=False)
    else:
        out.print(f"  result     {r.get('result_rows')} rows, checksum {r['checksum']}", markup=False)
    alloc = {True: "verified in /proc/PID/maps", False: "NOT in use", None: "not checked"}[doc["allocator_verified"]]
    out.print(f"  allocator  {doc['config']['allocator']}: {alloc}", markup=False)
    os_line = ", ".join(f"{k} {v.get('shown')}" for k, v in (doc.get("os_switches") or {}).items())
    out.print(f"  OS         {os_line}" + (" (changed for this run, restored)" if doc.get("os_restored") else ""), markup=False)
    render_environment_warnings(doc, out)


# ---- tune -------------------------------------------------------------------------------------

def render_tune(doc: dict, out) -> None:
    cases = doc.get("cases", [])
    d = (doc.get("default") or {}).get("median_s")
    best = doc.get("best") or {}
    width = max([len(c["label"]) for c in cases] + [13]) + 2
    out.print(f"{'configuration':<{width}} {'runs':>4} {'median s':>9} {'min s':>8} {'max s':>8} {'95% CI':>15} "
              f"{'spread':>6} {'vs default':>10}", markup=False)
    for c in sorted(cases, key=lambda c: (c["median_s"] is None, c["median_s"] or 0)):
        mark = "* " if best and c["case"] == best.get("case") else "  "
        if c["median_s"] is None:
            out.print(f"{mark + c['label']:<{width}} {0:>4} {'failed':>9}", markup=False)
            continue
        times = [r["time_s"] for r in c.get("raw", []) if r.get("status") == "ok"]
        ci = stats.mean_ci(times)
        ci_s = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
        vs = f"{d / c['median_s']:.2f}x" if d else ""
        flag = " !" if c.get("outliers") else ""
        out.print(f"{mark + c['label']:<{width}} {c['runs']:>4} {c['median_s']:>9.3f} {c['min_s']:>8.3f} "
                  f"{c['max_s']:>8.3f} {ci_s:>15} {(c['spread'] or 0):>6.0%} {vs:>10}{flag}", markup=False)
    if any(c.get("outliers") for c in cases):
        out.print("! = a run is an outlier (modified z-score > 3.5; its time is in results.json)", markup=False)
    if best:
        sp = doc.get("speedup_over_default")
        out.print(f"best: {best['label']}  median {best['median_s']:.3f} s, spread {(best['spread'] or 0):.0%}; "
                  f"{sp:.2f}x over the default ({d:.3f} s)" if sp else f"best: {best['label']}", markup=False)
        repro = doc.get("reproduce") or {}
        if repro:
            out.print(f"reproduce: {repro['tilewise']}", markup=False)
            out.print(f"       or: {repro['environment']}", markup=False)
            out.print(f"feed back: {repro['exec']}", markup=False)
            if "os" in repro:
                out.print(f"       os: {repro['os']}", markup=False)
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


CSV_TUNE = ["case", "label", "allocator", "mem", "mem_nodes", "placement", "thp", "autonuma", "repeat",
            "status", "time_s", "max_rss_bytes", "memory_overhead", "checksum", "error"]


def tune_csv(doc: dict) -> dict[str, str]:
    rows = []
    for c in doc.get("cases", []):
        cfg = c["config"]
        for r in c["raw"]:
            res = r.get("result", {}) if isinstance(r.get("result"), dict) else {}
            rows.append([c["case"], c["label"], cfg["allocator"], cfg["mem"], ",".join(map(str, cfg["mem_nodes"])),
                         cfg["placement"], cfg["thp"] or "", cfg["autonuma"] or "", r["repeat"], r["status"],
                         r.get("time_s", ""), res.get("max_rss_bytes", r.get("max_rss_bytes", "")),
                         r.get("memory_overhead") or "", r.get("checksum", ""), r.get("error", "")])
    return {"results.csv": _csv(CSV_TUNE, rows)} if rows else {}


def tune_plots(doc: dict, out_dir: Path) -> list[Path]:
    from tilewise.results import plots

    p = plots.tune(doc, out_dir / "fig6.png")
    return [p] if p else []


# ---- overhead (bench overhead) ----------------------------------------------------------------

def render_overhead(doc: dict, c) -> None:
    """`bench overhead`: per round, per query, the ratio with its interval and the verdicts."""
    s = doc.get("summary") or {}
    if not s.get("rounds"):
        c.print("no complete round", markup=False)
        return
    rt = s["ratio"]
    tab = _table("per round (total = median of the runs' wall time)")
    for col in ("round", "order", "plain s", "tilewise s", "ratio"):
        tab.add_column(col, justify="left" if col == "order" else "right")
    full = [r for r in doc["rounds"] if r.get("plain") and r.get("tilewise")]
    for r, ratio in zip(full, rt["ratios"]):
        tab.add_row(str(r["round"]), " ".join(r["order"]), f"{r['plain']['total_s']:.3f}",
                    f"{r['tilewise']['total_s']:.3f}", f"{ratio:.4f}")
    c.print(tab)
    q = _table("per query (median over rounds of each pass's median; difference: mean over rounds, 95 % CI)")
    for col in ("query", "plain ms", "tilewise ms", "diff ms", "95 % CI ms"):
        q.add_column(col, justify="right")
    for name, v in s["queries"].items():
        d = v["diff_ms"]
        ci = f"[{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]" if d["ci95"] else "-"
        q.add_row(name, f"{v['plain_ms']:.1f}", f"{v['tilewise_ms']:.1f}", f"{d['mean']:+.2f}", ci)
    c.print(q)
    o = s["outside_queries_ms"]
    oci = o["diff"]["ci95"]
    c.print(f"time outside the queries per run: plain {o['plain']:.1f} ms, tilewise {o['tilewise']:.1f} ms "
            f"(difference {o['diff']['mean']:+.1f} ms" + (f", 95 % CI [{oci[0]:+.1f}, {oci[1]:+.1f}])" if oci else ")"),
            markup=False)
    ci = rt["ci95"]
    c.print(f"tilewise / plain = {rt['ratio']:.4f}" + (f", 95 % CI [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")
            + f" over {rt['n']} rounds ({rt['method']})", markup=False)
    c.print(f"goal <= {s['goal']['max_ratio']:.2f}: {s['goal']['verdict']}; "
            f"stretch <= {s['stretch']['max_ratio']:.2f}: {s['stretch']['verdict']}", markup=False)
    for w in doc.get("warnings", []):
        c.print(f"warning: {w}", markup=False)


# ---- any kind: the metrics ----------------------------------------------------------------------

def render_metrics(doc: dict, out) -> None:
    """The generic view: one row per metric with n, min/median/max, 95 % CI and outliers."""
    ms = doc.get("metrics") or []
    if not ms:
        out.print("no metrics", markup=False)
        return
    t = _table(f"{doc.get('kind')}: {len(ms)} metric(s)")
    for col in ("metric", "unit", "n", "min", "median", "max", "95 % CI", "outliers"):
        t.add_column(col, justify="left" if col in ("metric", "unit") else "right")
    for m in ms:
        s = stats.summarize(m["values"])
        ci = s["ci95"]
        t.add_row(m["name"], m.get("unit", ""), str(s["n"]), _num(s["min"]), _num(s["median"]), _num(s["max"]),
                  f"{_num(ci[0])}-{_num(ci[1])}" if ci else "-", str(len(s["outliers"])) if s["outliers"] else "")
    out.print(t)
    _print_lines(out, "warning: ", doc.get("warnings") or [])
    render_environment_warnings(doc, out)


def metrics_csv(doc: dict) -> dict[str, str]:
    rows = [[m["name"], m.get("unit", ""), m.get("better", ""), i, v] for m in doc.get("metrics", [])
            for i, v in enumerate(m["values"], 1)]
    return {"metrics.csv": _csv(["metric", "unit", "better", "run", "value"], rows)} if rows else {}


def _num(x) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    a = abs(x)
    return f"{x:.4g}" if a < 1e-3 or a >= 1e5 else (f"{x:.4f}" if a < 1 else f"{x:.3f}" if a < 100 else f"{x:.1f}")


# ---- dispatch ---------------------------------------------------------------------------------

RENDER = {"tpch": render_tpch, "elastic": render_elastic, "probe.latency": render_pairs,
          "probe.bandwidth": render_pairs, "probe.stream": render_stream, "workload": render_workload,
          "tune": render_tune, "overhead": render_overhead}
CSV = {"tpch": tpch_csv, "elastic": elastic_csv, "probe.latency": pairs_csv, "probe.bandwidth": pairs_csv,
       "probe.stream": stream_csv, "tune": tune_csv}
PLOTS = {"tpch": tpch_plots, "elastic": elastic_plots, "probe.latency": pairs_plots, "probe.bandwidth": pairs_plots,
         "probe.stream": stream_plots, "tune": tune_plots}
# every file a kind may write: one that the current document does not produce is removed, so an
# interrupted run never leaves an older run's table or plot beside its own results
OWNED = {"tpch": ("results.csv", "tpch_metrics.csv", "speedup_per_query.png", "geomean_speedup.png", "tpch_metrics.png"),
         "elastic": ("results.csv", "elastic.png"), "probe.stream": ("stream.csv", "stream.png"),
         "tune": ("results.csv", "fig6.png")}


SUMMARY = {"tpch": tpch_summary}


def prepare(doc: dict) -> dict:
    """Before a document is written: its metrics (from the body) and its kind's summary."""
    model.with_metrics(doc)
    fn = SUMMARY.get(doc.get("kind"))
    if fn is not None:
        doc["summary"] = fn(doc)
    return doc


def render(doc: dict, out) -> None:
    """The readable view of a results document on the console `out`."""
    RENDER.get(doc.get("kind"), render_metrics)(doc, out)


def csv_files(doc: dict) -> dict[str, str]:
    return CSV.get(doc.get("kind"), metrics_csv)(doc)


def plot_files(doc: dict, out_dir: Path) -> list[Path]:
    fn = PLOTS.get(doc.get("kind"))
    return fn(doc, Path(out_dir)) if fn else []


def owned_files(doc: dict) -> tuple[str, ...]:
    kind = doc.get("kind", "")
    if kind in OWNED:
        return OWNED[kind]
    if kind in ("probe.latency", "probe.bandwidth"):
        probe = kind.split(".", 1)[1]
        names = [probe] if probe == "bandwidth" else [f"{probe}_{m}" for m in ("cas", "rw")]
        return tuple(f"{n}.{ext}" for n in names for ext in ("csv", "png"))
    return ("metrics.csv",)


def _csv(header: list, rows: list) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


# ---- comparing runs (tilewise report DIR...) ------------------------------------------------------

ENV_KEYS = (("hostname",), ("cpu_model",), ("kernel",), ("topology", "summary"), ("topology", "fingerprint"),
            ("tilewise_version",), ("git_commit",), ("engines",), ("os", "thp_enabled"), ("os", "autonuma"),
            ("system_check", "governor"), ("system_check", "turbo"))


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def compare(runs: Sequence[tuple[str, dict]], *, select: str | None = None) -> dict:
    """Compare documents metric by metric: each later run against the first (ratio of geometric
    means with a 95 % interval; the verdict says better, worse or within noise)."""
    if not runs:
        raise ValueError("nothing to compare")
    out = {"format": "tilewise-report", "version": 1,
           "runs": [{"label": label, "kind": d.get("kind"), "command": d["meta"].get("command"),
                     "hostname": (d.get("environment") or {}).get("hostname"),
                     "git_commit": d["meta"].get("git_commit"), "started": d["meta"].get("started"),
                     "complete": d.get("complete"), "interrupted": d.get("interrupted")} for label, d in runs],
           "environment_differences": {}, "parameter_differences": {}, "metrics": [], "notes": []}
    kinds = {d.get("kind") for _, d in runs}
    if len(kinds) > 1:
        out["notes"].append(f"the runs are of different kinds ({', '.join(sorted(map(str, kinds)))}); only metrics "
                            "with the same name are compared")
    for path in ENV_KEYS:
        vals = [_get(d.get("environment") or {}, path) for _, d in runs]
        if len({repr(v) for v in vals}) > 1:
            out["environment_differences"][".".join(path)] = vals
    keys = list(dict.fromkeys(k for _, d in runs for k in (d.get("params") or {})))
    for k in keys:
        if k in ("dataset", "data_dir", "cpus"):
            continue
        vals = [(d.get("params") or {}).get(k) for _, d in runs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in vals}) > 1:
            out["parameter_differences"][k] = vals
    if "tests" in out["parameter_differences"]:
        out["notes"].append("the runs ran different tests (params.tests): a metric of the same name (e.g. run_wall) "
                            "may measure different work")
    names: list[str] = []
    for _, d in runs:
        for m in d.get("metrics", []):
            if m["name"] not in names and (not select or fnmatch.fnmatch(m["name"], select)):
                names.append(m["name"])
    by_run = [model.metrics_by_name(d) for _, d in runs]
    for name in names:
        first = next(m[name] for m in by_run if name in m)
        row = {"name": name, "unit": first.get("unit", ""), "better": first.get("better", "lower"), "runs": [],
               "vs_first": []}
        base = by_run[0].get(name)
        for k, ms in enumerate(by_run):
            m = ms.get(name)
            s = stats.summarize(m["values"]) if m else None
            row["runs"].append(None if s is None else {"n": s["n"], "median": s["median"], "min": s["min"],
                                                       "max": s["max"], "ci95": s["ci95"]})
            if k == 0:
                continue
            if m is None or base is None:
                row["vs_first"].append(None)
                continue
            r = stats.ratio_ci(base["values"], m["values"])
            row["vs_first"].append(None if r is None else {**r, "verdict": _verdict(r, row["better"])})
        out["metrics"].append(row)
    return out


def _verdict(r: dict, better: str) -> str:
    """better / worse when the 95 % interval of the ratio excludes 1; "same" when it holds 1 (the
    difference is within the noise); "n/a" when a run has a single value (no interval)."""
    ci = r.get("ci95")
    if ci is None:
        return "n/a"
    if ci[0] <= 1.0 <= ci[1]:
        return "same"
    up = ci[0] > 1.0
    return "better" if (up == (better == "higher")) else "worse"


def render_comparison(cmp: dict, out) -> None:
    runs = cmp["runs"]
    rt = _table("runs")
    for col in ("#", "run", "kind", "host", "commit", "started", "state"):
        rt.add_column(col)
    for i, r in enumerate(runs, 1):
        state = "interrupted" if r.get("interrupted") else ("complete" if r.get("complete") else "incomplete")
        rt.add_row(str(i), r["label"], str(r["kind"]), str(r.get("hostname") or "-"), (r.get("git_commit") or "-")[:12],
                   str(r.get("started") or "-"), state)
    out.print(rt)
    for what, first in (("environment", "field"), ("parameter", "parameter")):
        diffs = cmp.get(f"{what}_differences")
        if diffs:  # one row per field whose value differs between the runs, one column per run
            dt = _table(f"{what} differences")
            dt.add_column(first)
            for i in range(len(runs)):
                dt.add_column(f"#{i + 1}")
            for k, vals in diffs.items():
                dt.add_row(k, *(_short(v) for v in vals))
            out.print(dt)
    if not cmp["metrics"]:
        out.print("no metrics in common", markup=False)
    else:
        title = ("metrics: median (n) per run; ratio = run / #1 (geometric means) with its 95 % CI"
                 if len(runs) > 1 else "metrics: median (n)")
        mt = _table(title)
        mt.add_column("metric")
        mt.add_column("unit")
        for i in range(len(runs)):
            mt.add_column(f"#{i + 1}", justify="right")
        for i in range(1, len(runs)):
            mt.add_column(f"#{i + 1}/#1", justify="right")
            mt.add_column("verdict")
        for row in cmp["metrics"]:
            cells = [row["name"], row["unit"]]
            for s in row["runs"]:
                cells.append("-" if s is None else f"{_num(s['median'])} ({s['n']})")
            for v in row["vs_first"]:
                if v is None:
                    cells += ["-", ""]
                    continue
                ci = v.get("ci95")
                cells.append(f"{v['ratio']:.3f}" + (f" [{ci[0]:.3f}-{ci[1]:.3f}]" if ci else ""))
                cells.append(v["verdict"])
            mt.add_row(*cells)
        out.print(mt)
        out.print("verdict: better/worse = the 95 % interval of the ratio excludes 1; same = within the noise; "
                  "n/a = a single value, no interval", markup=False)
    _print_lines(out, "note: ", cmp.get("notes") or [])


def _short(v) -> str:
    s = str(v) if not isinstance(v, dict) else ", ".join(f"{k}={x}" for k, x in v.items())
    return s if len(s) <= 40 else s[:37] + "..."


def comparison_plot(cmp: dict, path: Path) -> Path | None:
    from tilewise.results import plots

    rows = [r for r in cmp["metrics"] if any(v is not None for v in r["vs_first"])]
    if not rows or len(cmp["runs"]) < 2:
        return None
    return plots.ratios(path, rows, [r["label"] for r in cmp["runs"]])


def comparison_csv(cmp: dict) -> str:
    header = ["metric", "unit", "better"]
    for i in range(len(cmp["runs"])):
        header += [f"run{i + 1}_n", f"run{i + 1}_median", f"run{i + 1}_ci_low", f"run{i + 1}_ci_high"]
    for i in range(1, len(cmp["runs"])):
        header += [f"run{i + 1}_vs_run1", f"run{i + 1}_vs_run1_ci_low", f"run{i + 1}_vs_run1_ci_high", f"run{i + 1}_verdict"]
    rows = []
    for r in cmp["metrics"]:
        row = [r["name"], r["unit"], r["better"]]
        for s in r["runs"]:
            ci = (s or {}).get("ci95") or ["", ""]
            row += ["", "", "", ""] if s is None else [s["n"], s["median"], ci[0], ci[1]]
        for v in r["vs_first"]:
            ci = (v or {}).get("ci95") or ["", ""]
            row += ["", "", "", ""] if v is None else [v["ratio"], ci[0], ci[1], v["verdict"]]
        rows.append(row)
    return _csv(header, rows)


# ---- TPC-H next to JCC-H (the NUMA study's comparison) -------------------------------------------

def _ran(doc: dict) -> list[str]:
    return [n for n, p in doc.get("policies", {}).items()
            if not p.get("same_as") and any(q.get("median_s") for q in p.get("queries", {}).values())]


def _speedups(doc: dict, base: str, pol: str, queries: list[str]) -> list[float | None]:
    pols = doc["policies"]
    out = []
    for q in queries:
        b = pols[base]["queries"].get(q, {}).get("median_s")
        m = pols[pol]["queries"].get(q, {}).get("median_s")
        out.append(b / m if b and m else None)
    return out


def benchmark_pair(runs: Sequence[tuple[str, dict]]) -> tuple[tuple[str, dict], tuple[str, dict]] | None:
    """The (TPC-H, JCC-H) runs among runs when there is exactly one tpch-kind run of each."""
    tp = [(lbl, d) for lbl, d in runs if d.get("kind") == "tpch" and benchmark_of(d) == "tpch"]
    jc = [(lbl, d) for lbl, d in runs if d.get("kind") == "tpch" and benchmark_of(d) == "jcch"]
    return (tp[0], jc[0]) if len(tp) == 1 and len(jc) == 1 else None


def benchmark_comparison(tpch: dict, jcch: dict) -> dict:
    """Per-query speedup of each policy over the baseline on TPC-H next to JCC-H, same engine and
    policies: the study's comparison (one instance per NUMA node gained less on JCC-H, 2.17x/2.25x
    geomean against 2.65x/3.33x on TPC-H). The baseline is the first policy measured in both."""
    from tilewise.errors import UsageError

    e1, e2 = tpch.get("params", {}).get("engine"), jcch.get("params", {}).get("engine")
    if e1 != e2:
        raise UsageError(f"the TPC-H run used {e1} and the JCC-H run {e2}", "compare runs of the same engine")
    common = [n for n in _ran(tpch) if n in _ran(jcch)]
    if len(common) < 2:
        raise UsageError("the TPC-H and JCC-H runs share fewer than 2 measured policies",
                         "run both with the same --policies, e.g. wim,wic,auto")
    base = common[0]
    queries = [q for q in tpch["policies"][base]["queries"] if q in jcch["policies"][base]["queries"]]
    queries.sort(key=lambda q: int(q[1:]) if q[1:].isdigit() else 0)
    out = {"engine": e1, "baseline": base, "queries": queries, "policies": {},
           "tpch": {"sf": tpch["params"].get("sf"), "title": _tpch_title(tpch)},
           "jcch": {"sf": jcch["params"].get("sf"), "title": _tpch_title(jcch),
                    "params": jcch["params"].get("query_params"), "seed": jcch["params"].get("query_seed")}}
    for pol in common[1:]:
        a, b = _speedups(tpch, base, pol, queries), _speedups(jcch, base, pol, queries)
        out["policies"][pol] = {"tpch": a, "jcch": b,
                                "tpch_geomean": stats.geomean([x for x in a if x]),
                                "jcch_geomean": stats.geomean([x for x in b if x])}
    return out


def render_benchmark_comparison(cmp: dict, out) -> None:
    t = _table(f"per-query speedup over {cmp['baseline']}: {cmp['tpch']['title']} next to {cmp['jcch']['title']}")
    t.add_column("query")
    for pol in cmp["policies"]:
        t.add_column(f"{pol} TPC-H", justify="right")
        t.add_column(f"{pol} JCC-H", justify="right")
    for i, q in enumerate(cmp["queries"]):
        t.add_row(q, *(fmt(v[k][i], ".2f") for v in cmp["policies"].values() for k in ("tpch", "jcch")))
    t.add_row("geomean", *(fmt(v[k], ".2f") for v in cmp["policies"].values() for k in ("tpch_geomean", "jcch_geomean")))
    out.print(t)


def benchmark_comparison_plot(cmp: dict, path: Path) -> Path:
    from tilewise.results import plots

    cats = cmp["queries"] + ["geomean"]
    series = {}
    for pol, v in cmp["policies"].items():
        series[f"{pol} TPC-H"] = v["tpch"] + [v["tpch_geomean"]]
        series[f"{pol} JCC-H"] = v["jcch"] + [v["jcch_geomean"]]
    return plots.bar_chart(path, cats, series, ylabel=f"speedup over {cmp['baseline']}",
                           title=f"per-query speedup over {cmp['baseline']}, {cmp['engine']}: TPC-H SF "
                                 f"{cmp['tpch']['sf']} next to JCC-H SF {cmp['jcch']['sf']} ({cmp['jcch']['params']})")
