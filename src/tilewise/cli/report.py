"""`tilewise report DIR...`: show one results folder again, or compare several (before/after,
machine A against machine B) metric by metric, as a table and a plot."""

from __future__ import annotations

from pathlib import Path

import click

from tilewise.cli import modes
from tilewise.cli.common import OUTPUT_FILE, console, emit_json, json_option
from tilewise.errors import UsageError


_COMPARE = modes.Mode("a comparison of two or more results", lambda a: len(a["paths"]) >= 2, ("plot_path", "select"),
                      hint="name two or more results folders, or drop it")


@modes.declare(_COMPARE, modes.Mode("--out", lambda a: a["out_dir"] is not None, ("select",)))
@click.command("report")
@click.argument("paths", nargs=-1, metavar="DIR|FILE...")
@click.option("--metrics", "select", default=None, metavar="GLOB",
              help="Compare only the metrics whose name matches, e.g. 'wim/*' or '*/qphh@size'.")
@click.option("--label", "labels", multiple=True, metavar="NAME",
              help="Name of a run in the table (once per DIR, in order; default: the folder name).")
@click.option("--plot", "plot_path", default=None, type=OUTPUT_FILE, metavar="FILE.png", help="Write the comparison plot here.")
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="Write report.json, report.csv and report.png (the comparison) into DIR.")
@json_option
def report_cmd(paths, select, labels, plot_path, out_dir, as_json):
    """Read results written by bench tpch, bench elastic, bench elastic-tick, bench overhead, probe,
    workload --out, tune or elastic --log (any version tilewise wrote: older files are upgraded on
    load). With one DIR, show its tables again;
    with several, compare each against the first: medians with n, the ratio of geometric means
    with its 95 % confidence interval, and whether the change is beyond the noise.

    A TPC-H run and a JCC-H run of the same engine (bench tpch, bench jcch) are also shown
    side by side: per-query speedup over the first policy on each (with --out, tpch_vs_jcch.png).

    \b
    tilewise report results/before results/after
    tilewise report hostA/tpch hostB/tpch --metrics '*/qphh@size' --plot cmp.png
    tilewise report results/tpch-sf1 results/jcch-sf1 --out results/tpch-vs-jcch
    """
    from tilewise import fsutil
    from tilewise.results import model, report

    if not paths:
        raise UsageError("no results given", "name one or more results folders, e.g. tilewise report results/tpch")
    if labels and len(labels) != len(paths):
        raise UsageError(f"{len(labels)} --label for {len(paths)} results", "give one --label per results folder")
    docs = [model.load(p) for p in paths]
    names = list(labels) if labels else _labels(paths)
    if len(docs) == 1 and not out_dir:
        if as_json:
            emit_json(docs[0])
        else:
            report.render(docs[0], console(wide=True))
        return
    runs = list(zip(names, docs))
    cmp = report.compare(runs, select=select)
    extra = report.kind_comparisons(runs)  # e.g. TPC-H next to JCC-H
    for x in extra:
        cmp[x.key] = x.data
    if select and not cmp["metrics"]:
        raise UsageError(f"no metric matches {select!r}", "see the metric names with tilewise report DIR --json")
    written = []
    if out_dir:
        d = fsutil.ensure_writable_dir(out_dir)
        written.append(str(fsutil.atomic_write_json(d / "report.json", cmp)))
        written.append(str(fsutil.atomic_write(d / "report.csv", report.comparison_csv(cmp))))
        plot_path = plot_path or str(d / "report.png")
        written += [str(x.plot(d)) for x in extra]
    if plot_path:
        p = report.comparison_plot(cmp, Path(plot_path))
        if p:
            written.append(str(p))
    cmp["written"] = written
    if as_json:
        emit_json(cmp)
        return
    report.render_comparison(cmp, console(wide=True))
    for x in extra:
        x.render(console(wide=True))
    for w in written:
        console().print(f"wrote {w}", markup=False)


def _labels(paths) -> list[str]:
    out = []
    for p in paths:
        q = Path(p)
        name = q.name if q.is_dir() else f"{q.parent.name}/{q.name}"
        while name in out:
            name += "'"
        out.append(name)
    return out
