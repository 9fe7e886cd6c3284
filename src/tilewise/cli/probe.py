"""`tilewise probe latency|bandwidth|stream`: measure this machine (paper 001, section 2)."""

from __future__ import annotations

import click

from tilewise import cpulist
from tilewise.cli.common import console, emit_json, json_option, topology_option
from tilewise.errors import UsageError

cpus_option = click.option("--cpus", "cpus_text", metavar="LIST",
                           help="CPUs to measure, e.g. 0-7,64-71 (default: every CPU this process may use).")
out_option = click.option("--out", "out_dir", metavar="DIR",
                          help="Write JSON, CSV and PNG files into DIR (created if missing).")
full_option = click.option("--full", is_flag=True, help="Measure all ordered pairs (default: sample by class on big machines).")


@click.group("probe")
def probe() -> None:
    """Core-to-core latency and bandwidth, STREAM per deployment layout (measured here)."""


def _progress(total: int, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console(stderr=True), transient=True)


def _pair_probe(kind: str, topology_src, cpus_text, full, as_json, out_dir, params):
    from tilewise.probes import matrix, output, pairs

    t = matrix.live_topology(topology_src)
    cpus = matrix.choose_cpus(t, cpus_text)
    if len(cpus) < 2:
        raise UsageError(f"not measured: a core-to-core {kind} probe needs two CPUs, only {cpulist.format(cpus)} "
                         "is available", "run where this process may use two or more CPUs")
    out = output.OutDir(out_dir)
    selected, desc = pairs.select_pairs(t, cpus, full=full)
    if kind == "latency":
        tool, modes, unit, fmt = "tw_latency", params.modes, "ns", "{:.2f}"
    else:
        tool, modes, unit, fmt = "tw_bandwidth", ("bw",), "GB/s", "{:.3f}"
    err = console(stderr=True)
    err.print(f"{kind}: {desc}; estimated {params.estimate_s(len(selected)):.0f} s", markup=False)
    stats: list = []
    complete = False
    doc: dict = {}
    try:
        with _progress(len(selected) * len(modes), kind) as prog:
            task = prog.add_task(kind, total=len(selected) * len(modes))
            matrix.run_pairs(tool, params.argv(), selected,
                             on_result=lambda s: (stats.append(s), prog.advance(task)))
        complete = True
    finally:
        if stats:
            doc = matrix.build_doc(kind, t, cpus, desc, params, stats, modes, unit, complete)
            out.write_json(f"{kind}.json", doc)
            if complete:
                for m in modes:
                    name = kind if m == "bw" else f"{kind}_{m}"
                    out.write_matrix_csv(f"{name}.csv", cpus, doc["matrices"][m], fmt)
                    title = f"core-to-core {kind} ({m}, median {unit})" if m != "bw" else f"core-to-core bandwidth (median {unit})"
                    out.plot(f"{name}.png", output.heatmap(cpus, doc["matrices"][m], title, unit))
    doc["written"] = out.written
    doc["warnings"] = _pair_warnings(doc, modes)
    if as_json:
        emit_json(doc)
        return
    _print_pair_summary(doc, modes, unit, fmt)


UNSTABLE = 1.5  # p90/p10 (pairs) or best/median (stream) above this: warn


def _pair_warnings(doc, modes) -> list[str]:
    out = []
    for m in modes:
        noisy = [(s["a"], s["b"]) for s in doc["raw"]
                 if s["mode"] == m and s["p10"] > 0 and max(s["p90"], s["p10"]) / min(s["p90"], s["p10"]) > UNSTABLE]
        if noisy:
            out.append(f"{m}: {len(noisy)} of {sum(1 for s in doc['raw'] if s['mode'] == m)} pairs have a p90/p10 "
                       f"spread above {UNSTABLE}x: the machine was busy or throttling; re-run on a quiet machine "
                       "or with more --samples")
    return out


def _print_pair_summary(doc, modes, unit, fmt):
    from rich.table import Table

    from tilewise.probes.pairs import CLASS_TITLES

    out = console()
    cpus = doc["cpus"]
    for m in modes:
        label = {"cas": "compare-and-swap on one line", "rw": "one writer / one reader on two lines",
                 "bw": "one writes a buffer, the other reads it"}[m]
        out.print(f"[bold]{doc['probe']} ({m}: {label})[/bold], median per pair in {unit}")
        table = Table(show_edge=False, pad_edge=False)
        for col in ("pair class", "mean", "median", "min", "max", "pairs"):
            table.add_column(col, justify="left" if col == "pair class" else "right")
        for cls, s in doc["summary"][m].items():
            table.add_row(CLASS_TITLES[cls], fmt.format(s["mean"]), fmt.format(s["median"]), fmt.format(s["min"]),
                          fmt.format(s["max"]), str(s["pairs"]))
        out.print(table)
        if len(cpus) <= 16:
            mt = Table(show_edge=False, pad_edge=False, title=None)
            mt.add_column("cpu", justify="right")
            for c in cpus:
                mt.add_column(str(c), justify="right")
            for i, (c, row) in enumerate(zip(cpus, doc["matrices"][m])):
                mt.add_row(str(c), *("-" if i == j else ("n/m" if v is None else fmt.format(v))
                                     for j, v in enumerate(row)))
            out.print(mt)
    out.print(f"pairs: {doc['pairs']}", markup=False)
    for w in doc["warnings"]:
        out.print(f"warning: {w}", markup=False)
    for w in doc["written"]:
        out.print(f"wrote {w}", markup=False)


@probe.command("latency")
@topology_option
@cpus_option
@full_option
@click.option("--samples", type=click.IntRange(1), default=100, show_default=True, help="Timed batches per pair and mode.")
@click.option("--iters", type=click.IntRange(1), default=200, show_default=True, help="Round trips per batch.")
@click.option("--modes", default="cas,rw", show_default=True, help="cas (compare-and-swap), rw (writer/reader).")
@json_option
@out_option
def latency(topology_src, cpus_text, full, samples, iters, modes, as_json, out_dir):
    """Core-to-core latency: cache-line ping-pong per pair of CPUs, ns per one-way hop."""
    from tilewise.probes.matrix import LATENCY_MODES, LatencyParams

    ms = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in ms if m not in LATENCY_MODES]
    if bad or not ms:
        raise UsageError(f"--modes {modes!r}: unknown mode {', '.join(bad) or '(none)'}", "use cas, rw or cas,rw")
    _pair_probe("latency", topology_src, cpus_text, full, as_json, out_dir, LatencyParams(samples, iters, modes=ms))


@probe.command("bandwidth")
@topology_option
@cpus_option
@full_option
@click.option("--size", "size_text", default="256KiB", show_default=True, help="Buffer moved per round (fits the writer's L2 by default).")
@click.option("--samples", type=click.IntRange(1), default=50, show_default=True, help="Timed transfers per pair.")
@json_option
@out_option
def bandwidth(topology_src, cpus_text, full, size_text, samples, as_json, out_dir):
    """Core-to-core bandwidth: one CPU writes a buffer, the other reads it; GB/s per pair."""
    from tilewise.probes.matrix import BandwidthParams

    size = _size(size_text, "--size")
    if size < 4096:
        raise UsageError(f"--size {size_text}: at least 4KiB")
    _pair_probe("bandwidth", topology_src, cpus_text, full, as_json, out_dir, BandwidthParams(size, samples))


def _size(text: str, flag: str) -> int:
    from tilewise.topology.synthetic import _parse_size

    try:
        return _parse_size(text, flag)
    except UsageError:
        raise UsageError(f"{flag}: bad size {text!r}", "use e.g. 64MB, 1GiB (KB/MB/GB are powers of 1000)") from None


@probe.command("stream")
@topology_option
@cpus_option
@click.option("--policies", default="wim,win,wicp,wicp-mixed,wic", show_default=True,
              help="Deployment layouts to compare (one process per instance).")
@click.option("--sizes", "sizes_text", default=None, metavar="LIST",
              help="Sizes of one array over all processes, e.g. 1MB,16MB,256MB (default: 4x the L3 of the CPUs used).")
@click.option("--ntimes", type=click.IntRange(2), default=10, show_default=True, help="Repetitions per run (the first is a warm-up).")
@click.option("--runs", type=click.IntRange(1), default=1, show_default=True,
              help="Runs of every case, interleaved; figures are the median over runs.")
@click.option("--smt", is_flag=True, help="Use SMT siblings too (default: one thread per physical core).")
@click.option("--compare-likwid", is_flag=True, help="Also run likwid-bench copy on the same number of threads and show both.")
@json_option
@out_option
def stream(topology_src, cpus_text, policies, sizes_text, ntimes, runs, smt, compare_likwid, as_json, out_dir):
    """STREAM copy/scale/add/triad as N bound processes per layout; aggregate GB/s."""
    from tilewise.probes import matrix, output, stream as st

    t = matrix.live_topology(topology_src)
    cpus = matrix.choose_cpus(t, cpus_text, smt=smt or bool(cpus_text))
    pols = [p.strip() for p in policies.split(",") if p.strip()]
    if not pols:
        raise UsageError("--policies is empty", f"choose from {', '.join(st.STREAM_POLICIES)}")
    if sizes_text:
        sizes = [_size(s.strip(), "--sizes") for s in sizes_text.split(",") if s.strip()]
        if not sizes or min(sizes) < 4096:
            raise UsageError(f"--sizes {sizes_text!r}: give sizes of at least 4KiB")
        size_note = "from --sizes"
    else:
        size, size_note = st.default_size(t, cpus)
        sizes = [size]
    out = output.OutDir(out_dir)
    plans = st.plans_for(t, cpus, pols, smt)
    err = console(stderr=True)
    err.print(f"stream: {len(pols)} layout(s) x {len(sizes)} size(s) on CPUs {cpulist.format(cpus)} ({size_note}); "
              f"estimated {runs * st.estimate_s(plans, sizes, ntimes):.0f} s", markup=False)
    doc = {"format": output.FORMAT, "probe": "stream", "unit": "GB/s", "complete": False,
           "environment": output.environment(t), "cpus": list(cpus), "ntimes": ntimes, "runs": runs,
           "size_rule": size_note, "cases": [], "likwid": []}

    def save():
        out.write_json("stream.json", doc)
        out.write_rows_csv("stream.csv", ["policy", "instances", "size_bytes", *(f"{k}_best_gbs" for k in st.KERNELS),
                                          *(f"{k}_median_gbs" for k in st.KERNELS)],
                           [[c["policy"], c["instances"], c["size_bytes"],
                             *(f"{c['kernels'][k]['best_gbs']:.3f}" for k in st.KERNELS),
                             *(f"{c['kernels'][k]['median_gbs']:.3f}" for k in st.KERNELS)] for c in doc["cases"]])

    with _progress(runs * len(pols) * len(sizes), "stream") as prog:
        task = prog.add_task("stream", total=runs * len(pols) * len(sizes))

        def on_progress(cases):
            doc["cases"] = cases
            save()  # rewritten after each case: a late failure loses nothing
            prog.advance(task)

        st.run(t, cpus, pols, sizes, ntimes=ntimes, runs=runs, smt=smt, on_progress=on_progress)
        if compare_likwid:
            for s in sizes:
                doc["likwid"].append({"size_bytes": s, "threads": len(cpus)} | st.likwid_median(cpus, s, runs))
    doc["complete"] = True
    save()
    if len(sizes) > 1 or out.path:
        out.plot("stream.png", _stream_plot(doc))
    doc["written"] = out.written
    noisy = [f"{c['policy']}@{_human(c['size_bytes'])}" for c in doc["cases"]
             if c["kernels"]["copy"]["median_gbs"] > 0
             and c["kernels"]["copy"]["best_gbs"] / c["kernels"]["copy"]["median_gbs"] > UNSTABLE]
    doc["warnings"] = [f"copy best/median above {UNSTABLE}x for {', '.join(noisy)}: the machine was busy; re-run on "
                       "a quiet machine, with more --ntimes or --runs"] if noisy else []
    if as_json:
        emit_json(doc)
        return
    _print_stream(doc)


def _stream_plot(doc):
    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, k in zip(axes, ("copy", "triad")):
            for pol in dict.fromkeys(c["policy"] for c in doc["cases"]):
                cs = sorted((c for c in doc["cases"] if c["policy"] == pol), key=lambda c: c["size_bytes"])
                n = cs[0]["instances"]
                ax.plot([c["size_bytes"] / 1e6 for c in cs], [c["kernels"][k]["best_gbs"] for c in cs],
                        marker="o", label=f"{pol} ({n} process{'es' if n > 1 else ''})")
            ax.set_xscale("log")
            ax.set_xlabel("array size (MB, one array over all processes)")
            ax.set_ylabel("aggregate GB/s (best repetition, median of runs)")
            ax.set_title(f"STREAM {k}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        return fig
    return draw


def _print_stream(doc):
    from rich.table import Table

    from tilewise.probes.stream import KERNELS

    out = console()
    runs = doc["runs"]
    out.print(f"[bold]STREAM[/bold] aggregate GB/s (best of {doc['ntimes'] - 1} repetitions after a warm-up"
              + (f", median over {runs} runs" if runs > 1 else "") + f"; CPUs {cpulist.format(doc['cpus'])})")
    table = Table(show_edge=False, pad_edge=False)
    for col in ("policy", "processes", "array size", *KERNELS):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for c in doc["cases"]:
        table.add_row(c["policy"], str(c["instances"]), _human(c["size_bytes"]),
                      *(f"{c['kernels'][k]['best_gbs']:.2f}" for k in KERNELS))
    out.print(table)
    if doc["likwid"]:
        out.print("[bold]reference: likwid-bench[/bold] (same number of threads, node domain; likwid reports the "
                  "mean over its run, tilewise the best and median repetition)")
        lt = Table(show_edge=False, pad_edge=False)
        for col in ("array size", "tilewise wim copy best", "median", "likwid-bench", "best/likwid"):
            lt.add_column(col, justify="right")
        for l in doc["likwid"]:
            ours = next((c["kernels"]["copy"] for c in doc["cases"]
                         if c["policy"] == "wim" and c["size_bytes"] == l["size_bytes"]), None)
            best = f"{ours['best_gbs']:.2f}" if ours else "(wim not run)"
            med = f"{ours['median_gbs']:.2f}" if ours else "-"
            if "gbs" in l:
                ratio = f"{ours['best_gbs'] / l['gbs']:.3f}" if ours else "-"
                lt.add_row(_human(l["size_bytes"]), best, med, f"{l['gbs']:.2f}", ratio)
            else:
                lt.add_row(_human(l["size_bytes"]), best, med, "not measured", "-")
        out.print(lt)
        for l in doc["likwid"]:
            if "command" in l:
                out.print(f"  likwid: {l['command']}", markup=False)
            if "error" in l:
                out.print(f"  likwid-bench failed: {l['error']}", markup=False)
    for w in doc["warnings"]:
        out.print(f"warning: {w}", markup=False)
    for w in doc["written"]:
        out.print(f"wrote {w}", markup=False)


def _human(n: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n} B"
