"""`tilewise probe latency|bandwidth|stream|memory|exchange|gpu`: measure this machine (paper 001,
section 2; thesis 004, ch. 4 for `memory`, ch. 3 for `gpu`; issue 30 for `exchange`)."""

from __future__ import annotations

import click

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


class _Reporter:
    """A probe's messages and progress bar on stderr, the bar shown from the first measurement (a
    refusal before it stays one line). The probes' Reporter: start/advance; memory's: start/cell/partial."""

    def __init__(self, label: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.label, self.task = label, None
        self.prog = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                             console=console(stderr=True), transient=True)

    def __enter__(self) -> _Reporter:
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None:
            self.prog.stop()

    def message(self, text: str) -> None:
        self.prog.console.print(text, markup=False)

    def start(self, total: int) -> None:
        self.prog.start()
        self.task = self.prog.add_task(self.label, total=total)

    def advance(self) -> None:
        if self.task is not None:
            self.prog.advance(self.task)

    def cell(self, label: str) -> None:
        if self.task is not None:
            self.prog.update(self.task, description=f"{self.label}: {label}")

    def partial(self, doc: dict) -> None:
        self.advance()


def _pair_probe(kind: str, topology_src, cpus_text, full, as_json, out_dir, params):
    from tilewise.probes import matrix
    from tilewise.results.output import Writer

    out = Writer(out_dir, name=f"{kind}.json") if out_dir else Writer(None)
    with _Reporter(kind) as rep:
        doc = matrix.run(matrix.Config(params, topology_src, cpus_text, full), rep, writer=out.write)
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
    from tilewise.probes import stream as st
    from tilewise.results.output import Writer

    sizes = ()
    if sizes_text:
        sizes = tuple(parse_size(s.strip(), "--sizes", minimum=4096) for s in sizes_text.split(",") if s.strip())
        if not sizes or min(sizes) < 4096:
            raise UsageError(f"--sizes {sizes_text!r}: give sizes of at least 4KiB")
    cfg = st.Config(topology_src, cpus_text, policies, sizes, ntimes, runs, smt, compare_likwid)
    out = Writer(out_dir, name="stream.json", plots=False) if out_dir else Writer(None)
    with _Reporter("stream") as rep:
        doc = st.run(cfg, rep, writer=out.write)
    out.write(doc, plots=True)
    _show(doc, out, as_json)


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
    with _Reporter("memory") as rep:
        doc = memory.run(cfg, rep, writer=out.write)
    out.write(doc, plots=True)
    _show(doc, out, as_json)


@probe.command("exchange")
@topology_option
@click.option("--sender-cpus", metavar="LIST", help="CPUs of the sending process, e.g. 0-7 (with --receiver-cpus; "
              "default: two NUMA nodes, else two L3 domains, else two cores).")
@click.option("--receiver-cpus", metavar="LIST", help="CPUs of the receiving process (its node holds the shm ring).")
@click.option("--transports", "transports_text", default="shm,unix,tcp", show_default=True, help="Transports to measure.")
@click.option("--sizes", "sizes_text", default="4KiB,64KiB,1MiB,16MiB,64MiB", show_default=True,
              help="Message sizes (multiples of 8 bytes).")
@click.option("--channels", "channels_text", default="1,2", show_default=True,
              help="Channel counts (one sender and one receiver thread per channel, round-robin over the CPUs).")
@click.option("--ring", "ring_text", default="8MiB", show_default=True, help="shm: ring buffer per channel (bounded memory).")
@click.option("--runs", type=AT_LEAST_1, default=3, show_default=True, help="Runs per case; figures are the median.")
@json_option
@out_option
def exchange(topology_src, sender_cpus, receiver_cpus, transports_text, sizes_text, channels_text, ring_text, runs,
             as_json, out_dir):
    """What moving a batch between two processes costs: shared memory on the receiver's node, Unix
    sockets, loopback TCP; throughput and latency against message size and channels, next to memcpy."""
    from tilewise.probes import exchange as ex
    from tilewise.results.output import Writer

    words = [w.strip() for w in transports_text.split(",")]
    sizes = tuple(parse_size(s.strip(), "--sizes", minimum=8) for s in sizes_text.split(",") if s.strip())
    try:
        channels = tuple(int(c) for c in channels_text.split(","))
    except ValueError:
        raise UsageError(f"--channels {channels_text!r}: give whole numbers, e.g. 1,2,4") from None
    cfg = ex.Config(topology_src, sender_cpus, receiver_cpus, tuple(words), sizes, channels,
                    parse_size(ring_text, "--ring", minimum=ex.MIN_RING), runs)
    ex.check(cfg)  # refused before the output folder is made
    out = Writer(out_dir, name="exchange.json", plots=False) if out_dir else Writer(None)
    with _Reporter("exchange") as rep:
        doc = ex.run(cfg, rep, writer=out.write)
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
    from tilewise.probes import gpu as gp
    from tilewise.results.output import Writer

    cfg = gp.Config(device, parse_size(size_text, "--size", minimum=4096), reps, nodes_text, timeout)
    out = Writer(out_dir, name="gpu.json") if out_dir else Writer(None)
    doc = gp.run(cfg, writer=lambda d: out.write(d, plots=False))
    out.write(doc, plots=True)
    _show(doc, out, as_json)
