"""`tilewise probe latency|bandwidth|stream|memory|gpu`: measure this machine (paper 001, section 2;
thesis 004, ch. 4 for `memory`, ch. 3 for `gpu`)."""

from __future__ import annotations

import click

from tilewise import cpulist
from tilewise.cli.common import AT_LEAST_1, Number, console, emit_json, json_option, parse_size, topology_option
from tilewise.errors import UsageError
from tilewise.results.kinds.memory import TESTS as MEMORY_TESTS

cpus_option = click.option("--cpus", "cpus_text", metavar="LIST",
                           help="CPUs to measure, e.g. 0-7,64-71 (default: every CPU this process may use).")
out_option = click.option("--out", "out_dir", metavar="DIR",
                          help="Write JSON, CSV and PNG files into DIR (created if missing).")
full_option = click.option("--full", is_flag=True, help="Measure all ordered pairs (default: sample by class on big machines).")


@click.group("probe")
def probe() -> None:
    """Core-to-core latency and bandwidth, STREAM per deployment layout, GPU copy bandwidth per node (measured here)."""


def _progress(total: int, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console(stderr=True), transient=True)


def _pair_probe(kind: str, topology_src, cpus_text, full, as_json, out_dir, params):
    from dataclasses import asdict

    from tilewise.probes import matrix, pairs
    from tilewise.results import model
    from tilewise.results.output import Writer

    t = matrix.live_topology(topology_src)
    cpus = matrix.choose_cpus(t, cpus_text)
    if len(cpus) < 2:
        raise UsageError(f"not measured: a core-to-core {kind} probe needs two CPUs, only {cpulist.format(cpus)} "
                         "is available", "run where this process may use two or more CPUs")
    out = Writer(out_dir, name=f"{kind}.json") if out_dir else Writer(None)
    selected, desc = pairs.select_pairs(t, cpus, full=full)
    if kind == "latency":
        tool, modes, unit = "tw_latency", params.modes, "ns"
    else:
        tool, modes, unit = "tw_bandwidth", ("bw",), "GB/s"
    err = console(stderr=True)
    doc = model.new(f"probe.{kind}", topo=t, params={**asdict(params), "cpus": list(cpus), "full": full},
                    system_check=_system_check(t))
    err.print(f"{kind}: {desc}; estimated {params.estimate_s(len(selected)):.0f} s", markup=False)
    stats: list = []
    try:
        with _progress(len(selected) * len(modes), kind) as prog:
            task = prog.add_task(kind, total=len(selected) * len(modes))
            matrix.run_pairs(tool, params.argv(), selected,
                             on_result=lambda s: (stats.append(s), prog.advance(task)))
        model.finish(doc, complete=True)
    except BaseException as e:
        model.stopped(doc, e)
        raise
    finally:
        matrix.build_doc(doc, t, cpus, desc, stats, modes if stats else (), unit)
        doc["warnings"] = _pair_warnings(doc, modes)
        out.write(doc)
    _show(doc, out, as_json)


def _show(doc: dict, out, as_json: bool) -> None:
    """The finished document on stdout: JSON, or the kind's table and the files written."""
    from tilewise.results import report

    doc["written"] = out.written
    if as_json:
        emit_json(doc)
        return
    report.render(doc, console(wide=True))
    for w in doc["written"]:
        console().print(f"wrote {w}", markup=False)


def _system_check(t):
    from tilewise.environment import system_check

    return system_check(numa_nodes=len(t.cpu_nodes))


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


@probe.command("latency")
@topology_option
@cpus_option
@full_option
@click.option("--samples", type=AT_LEAST_1, default=100, show_default=True, help="Timed batches per pair and mode.")
@click.option("--iters", type=AT_LEAST_1, default=200, show_default=True, help="Round trips per batch.")
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
@click.option("--samples", type=AT_LEAST_1, default=50, show_default=True, help="Timed transfers per pair.")
@json_option
@out_option
def bandwidth(topology_src, cpus_text, full, size_text, samples, as_json, out_dir):
    """Core-to-core bandwidth: one CPU writes a buffer, the other reads it; GB/s per pair."""
    from tilewise.probes.matrix import BandwidthParams

    size = parse_size(size_text, "--size", minimum=4096)
    _pair_probe("bandwidth", topology_src, cpus_text, full, as_json, out_dir, BandwidthParams(size, samples))


@probe.command("stream")
@topology_option
@cpus_option
@click.option("--policies", default="wim,win,wicp,wicp-mixed,wic", show_default=True,
              help="Deployment layouts to compare (one process per instance).")
@click.option("--sizes", "sizes_text", default=None, metavar="LIST",
              help="Sizes of one array over all processes, e.g. 1MB,16MB,256MB (default: 4x the L3 of the CPUs used).")
@click.option("--ntimes", type=Number(integer=True, min=2), default=10, show_default=True, help="Repetitions per run (the first is a warm-up).")
@click.option("--runs", type=AT_LEAST_1, default=1, show_default=True,
              help="Runs of every case, interleaved; figures are the median over runs.")
@click.option("--smt", is_flag=True, help="Use SMT siblings too (default: one thread per physical core).")
@click.option("--compare-likwid", is_flag=True, help="Also run likwid-bench copy on the same number of threads and show both.")
@json_option
@out_option
def stream(topology_src, cpus_text, policies, sizes_text, ntimes, runs, smt, compare_likwid, as_json, out_dir):
    """STREAM copy/scale/add/triad as N bound processes per layout; aggregate GB/s."""
    from tilewise.probes import matrix, stream as st
    from tilewise.results import model, report
    from tilewise.results.output import Writer
    from tilewise.results.tables import human_bytes

    t = matrix.live_topology(topology_src)
    cpus = matrix.choose_cpus(t, cpus_text, smt=smt or bool(cpus_text))
    pols = [p.strip() for p in policies.split(",") if p.strip()]
    if not pols:
        raise UsageError("--policies is empty", f"choose from {', '.join(st.STREAM_POLICIES)}")
    if sizes_text:
        sizes = [parse_size(s.strip(), "--sizes", minimum=4096) for s in sizes_text.split(",") if s.strip()]
        if not sizes or min(sizes) < 4096:
            raise UsageError(f"--sizes {sizes_text!r}: give sizes of at least 4KiB")
        size_note = "from --sizes"
    else:
        size, size_note = st.default_size(t, cpus)
        sizes = [size]
    out = Writer(out_dir, name="stream.json", plots=False) if out_dir else Writer(None)
    plans = st.plans_for(t, cpus, pols, smt)
    err = console(stderr=True)
    err.print(f"stream: {len(pols)} layout(s) x {len(sizes)} size(s) on CPUs {cpulist.format(cpus)} ({size_note}); "
              f"estimated {runs * st.estimate_s(plans, sizes, ntimes):.0f} s", markup=False)
    doc = model.new("probe.stream", topo=t, system_check=_system_check(t),
                    params={"cpus": list(cpus), "policies": pols, "sizes": sizes, "ntimes": ntimes, "runs": runs,
                            "smt": smt, "compare_likwid": compare_likwid})
    doc.update({"probe": "stream", "unit": "GB/s", "cpus": list(cpus), "ntimes": ntimes, "runs": runs,
                "size_rule": size_note, "cases": [], "likwid": []})
    try:
        with _progress(runs * len(pols) * len(sizes), "stream") as prog:
            task = prog.add_task("stream", total=runs * len(pols) * len(sizes))

            def on_progress(cases):
                doc["cases"] = cases
                out.write(doc)  # rewritten after each case: a late failure loses nothing
                prog.advance(task)

            st.run(t, cpus, pols, sizes, ntimes=ntimes, runs=runs, smt=smt, on_progress=on_progress)
            if compare_likwid:
                for s in sizes:
                    doc["likwid"].append({"size_bytes": s, "threads": len(cpus)} | st.likwid_median(cpus, s, runs))
    except BaseException as e:
        model.stopped(doc, e)
        out.write(doc)
        raise
    model.finish(doc, complete=True)
    noisy = [f"{c['policy']}@{human_bytes(c['size_bytes'])}" for c in doc["cases"]
             if c["kernels"]["copy"]["median_gbs"] > 0
             and c["kernels"]["copy"]["best_gbs"] / c["kernels"]["copy"]["median_gbs"] > UNSTABLE]
    doc["warnings"] = [f"copy best/median above {UNSTABLE}x for {', '.join(noisy)}: the machine was busy; re-run on "
                       "a quiet machine, with more --ntimes or --runs"] if noisy else []
    out.write(doc, plots=True)
    _show(doc, out, as_json)


class _MemoryReporter:
    """Messages and a progress bar on stderr for `probe memory`."""

    def __init__(self, prog) -> None:
        self.prog, self.task = prog, None
        self.err = console(stderr=True)

    def message(self, text: str) -> None:
        self.err.print(text, markup=False)

    def start(self, cells: int) -> None:
        self.task = self.prog.add_task("memory", total=cells)

    def cell(self, label: str) -> None:
        if self.task is not None:
            self.prog.update(self.task, description=f"memory: {label}")

    def partial(self, doc: dict) -> None:
        if self.task is not None:
            self.prog.advance(self.task)


@probe.command("memory")
@topology_option
@click.option("--initiators", "initiators", metavar="NODES",
              help="Initiator NUMA nodes (with CPUs), e.g. 0,1 (default: every node with CPUs this process may use).")
@click.option("--cpus", "cpus_text", metavar="LIST", help="One initiator made of these CPUs instead, e.g. 0-7.")
@click.option("--targets", metavar="NODES", help="Target memory nodes, CPU-less included (default: every node with memory).")
@click.option("--threads", "threads", metavar="LIST", help="Thread counts per initiator (default: 1, 2, 4, ... and all its CPUs).")
@click.option("--size", "size_text", default=None, metavar="SIZE",
              help="Buffer per cell, far larger than the L3 (default: 8x the machine's L3, at least 256MiB).")
@click.option("--tests", "tests_text", default=",".join(MEMORY_TESTS),
              show_default=True, help="Which figures to measure.")
@click.option("--reps", type=Number(integer=True, min=2), default=5, show_default=True,
              help="Repetitions per figure (the first is a warm-up).")
@click.option("--min-ms", "min_ms", type=Number(min=1, max=60000), default=100, show_default=True,
              help="Each repetition runs at least this many milliseconds.")
@click.option("--no-hugepages", is_flag=True, help="Do not ask for transparent huge pages on the buffer.")
@click.option("--smt", is_flag=True, help="Use SMT siblings too (default: one thread per physical core).")
@click.option("--compare", is_flag=True,
              help="Also run likwid-bench (read, write, non-temporal write), a reference chase under numactl, and Intel MLC where installed.")
@json_option
@out_option
def memory_cmd(topology_src, initiators, cpus_text, targets, threads, size_text, tests_text, reps, min_ms, no_hugepages,
               smt, compare, as_json, out_dir):
    """Every CPU-to-memory path: latency and read/write bandwidth, initiator x target node (thesis 004, ch. 4)."""
    from tilewise.probes import memory
    from tilewise.results.output import Writer

    size = parse_size(size_text, "--size", minimum=memory.MIN_SIZE) if size_text else None
    cfg = memory.Config(topology_src=topology_src, initiators=initiators, cpus=cpus_text, targets=targets,
                        threads=threads, size=size, tests=memory.parse_tests(tests_text), reps=reps, min_ms=min_ms,
                        hugepages=not no_hugepages, smt=smt, compare=compare)
    out = Writer(out_dir, name="memory.json", plots=False) if out_dir else Writer(None)
    with _progress(1, "memory") as prog:
        doc = memory.run(cfg, _MemoryReporter(prog), writer=out.write)
    out.write(doc, plots=True)
    _show(doc, out, as_json)


@probe.command("gpu")
@click.option("--device", default="cuda", show_default=True, metavar="cuda[:N|:UUID]|all",
              help="The GPU to measure (all: every GPU CUDA can use).")
@click.option("--size", "size_text", default="256MiB", show_default=True, help="Bytes moved per copy.")
@click.option("--reps", type=AT_LEAST_1, default=20, show_default=True, help="Timed copies per figure (a warm-up first).")
@click.option("--nodes", "nodes_text", default=None, metavar="LIST", help="NUMA nodes to allocate host memory on (default: all with memory).")
@click.option("--timeout", type=Number(min=0, min_open=True, name="SECONDS"), default=300, show_default=True,
              help="Seconds per (GPU, node) before the measuring process is stopped.")
@json_option
@out_option
def gpu(device, size_text, reps, nodes_text, timeout, as_json, out_dir):
    """Host-to-device and device-to-host bandwidth from pinned and pageable memory on every NUMA
    node: the GPU's own node against the others (one bound process per node)."""
    from tilewise import devices, topology
    from tilewise.probes import gpu as gp
    from tilewise.results import model
    from tilewise.results.kinds import gpu as gpu_kind
    from tilewise.results.output import Writer

    size = parse_size(size_text, "--size", minimum=4096)
    found = devices.discover()
    if device.strip().lower() == "all":
        if not found.cuda:
            devices.resolve_cuda("cuda", found)  # the one-line refusal, with what is here
        gpus = list(found.cuda)
    else:
        gpus = [devices.resolve_cuda(device, found)]
    t = topology.load(None)
    nodes = tuple(cpulist.parse(nodes_text, what="--nodes")) if nodes_text else None
    out = Writer(out_dir, name="gpu.json") if out_dir else Writer(None)
    doc = model.new("probe.gpu", topo=t, system_check=_system_check(t),
                    params={"device": device, "size": size, "reps": reps, "nodes": list(nodes) if nodes else None})
    doc.update({"probe": "gpu", "unit": "GB/s", "size_bytes": size, "reps": reps,
                "gpus": [g.to_json() for g in gpus], "driver": found.driver, "cases": []})
    try:
        def on_case(cases):
            doc["cases"] = cases
            out.write(doc, plots=False)

        gp.run(t, gpus, size, reps, nodes, timeout, on_case=on_case)
        doc["summary"] = gp.summarize(doc["cases"])
        doc["metrics"] = gpu_kind.metrics(doc)
        model.finish(doc, complete=all("gbs" in c for c in doc["cases"]))
    except BaseException as e:
        model.stopped(doc, e)
        out.write(doc)
        raise
    out.write(doc, plots=True)
    _show(doc, out, as_json)
