"""STREAM per deployment layout: N tw_stream processes placed by a tilewise plan, run together.

For every policy the plan gives instances (CPUs + memory policy); each instance becomes one
tw_stream process, bound by tilewise.launch (affinity + set_mempolicy before exec), with one
pinned thread per CPU. All processes meet in a barrier (a shared file) before every kernel, so
they run each kernel at the same time. The aggregate bandwidth of a kernel repetition is the sum
of the bytes every process moved divided by the time from the first start to the last end.

Array size: `size` is the size of ONE array summed over all processes (the same total work for
every layout, as in the paper's figures); an instance gets a share proportional to its CPUs.
`probe stream` is ``run(config, reporter)``: the probe.stream results document.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilewise import cpulist, launch, native
from tilewise import plan as plan_mod
from tilewise.binding import Binding, ensure_runnable
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import matrix
from tilewise.results import model
from tilewise.results.tables import human_bytes
from tilewise.topology.model import Topology

KERNELS = ("copy", "scale", "add", "triad")
STREAM_POLICIES = ("wim", "win", "wicp", "wicp-mixed", "wic")
ELEM = 8  # double
UNSTABLE = 1.5  # best/median of the copy kernel above this: warn


class StreamError(TilewiseError):
    pass


def default_size(t: Topology, cpus: Sequence[int]) -> tuple[int, str]:
    """4x the total L3 of the L3 domains the CPUs use (STREAM's rule), per array."""
    l3s = {t.core_of_cpu[c].l3 for c in cpus}
    total = sum(d.size_bytes for d in t.l3_domains if d.id in l3s)
    if total <= 0:
        return 128 * 2**20, "L3 size unknown: 128 MiB per array"
    return 4 * total, f"4x the {total / 2**20:.0f} MiB of L3 used by the CPUs, per array"


def plans_for(t: Topology, cpus: Sequence[int], policies: Sequence[str], smt: bool) -> list[plan_mod.Plan]:
    bad = [p for p in policies if p not in STREAM_POLICIES]
    if bad:
        raise UsageError(f"unknown policy {', '.join(bad)} for stream", f"choose from {', '.join(STREAM_POLICIES)}")
    restricted = dataclasses.replace(t, allowed_cpus=tuple(sorted(cpus)))
    return [plan_mod.plan(restricted, p, smt=smt) for p in policies]


def check_memory(sizes: Sequence[int]) -> None:
    import psutil

    avail = psutil.virtual_memory().available
    need = 3 * max(sizes)
    if need > 0.8 * avail:
        raise UsageError(f"the largest size needs {need / 2**30:.1f} GiB (3 arrays), but only "
                         f"{avail / 2**30:.1f} GiB is available", "use smaller --sizes")


def estimate_s(plans, sizes: Sequence[int], ntimes: int, nominal_gbs: float = 5.0) -> float:
    per_size = sum(10 * s * ntimes / (nominal_gbs * 1e9) + 0.05 + 3 * s / 2e9 for s in sizes)
    return len(plans) * per_size


def run_one(p: plan_mod.Plan, size: int, ntimes: int, timeout_s: float) -> dict:
    """One layout at one size; returns per-kernel aggregate GB/s (best and median over repetitions)."""
    exe = native.binary("tw_stream")
    total_cpus = sum(len(i.cpus) for i in p.instances)
    total_elems = max(size // ELEM, total_cpus)
    files: list = []
    fd, barrier = tempfile.mkstemp(prefix="tw_stream_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.write(fd, b"\0" * 4096)
        os.close(fd)
        outs = []
        with launch.Supervisor() as sup:
            started = []
            for inst in p.instances:
                elems = max(1, total_elems * len(inst.cpus) // total_cpus)
                argv = [exe, "--elements", str(elems), "--ntimes", str(ntimes), "--barrier", barrier,
                        "--nprocs", str(len(p.instances))]
                # files, not pipes: a full pipe would block a child that the others wait for
                so, se = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                files += [so, se]
                s = sup.start(f"stream-{inst.id}", argv, Binding.from_instance(inst), stdout=so, stderr=se)
                started.append((s, so, se))
            deadline = time.monotonic() + timeout_s
            while True:
                exited = sup.check()
                failed = [(s, rc) for s, rc in exited if rc != 0]
                if failed:
                    s, rc = failed[0]
                    se = next(e for x, _, e in started if x is s)
                    se.seek(0)
                    err = se.read().strip().splitlines()
                    raise StreamError(f"{s.name} ({s.binding.describe()}) failed with status {rc}"
                                      + (f": {err[-1]}" if err else ""))
                if len(exited) == len(started):
                    break
                if time.monotonic() > deadline:
                    raise StreamError(f"stream with policy {p.policy} at {size} B did not finish in {timeout_s:.0f} s",
                                      "use smaller --sizes or fewer --ntimes")
                time.sleep(0.01)
            for _, so, _ in started:
                so.seek(0)
                outs.append(so.read())
    finally:
        for f in files:
            f.close()
        try:
            os.unlink(barrier)
        except OSError:
            pass
    return aggregate(outs, ntimes) | {"bytes_per_array": total_elems * ELEM}


def aggregate(outputs: Sequence[str], ntimes: int) -> dict:
    """Per kernel: aggregate GB/s of every repetition but the first (warm-up); best and median."""
    recs: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for text in outputs:
        lines = text.strip().splitlines()
        if not lines or not lines[-1].startswith("ok"):
            raise StreamError("tw_stream did not validate its arrays: " + (lines[-1] if lines else "no output"))
        for line in lines[:-1]:
            k, r, a, b, n = line.split()
            recs.setdefault((k, int(r)), []).append((int(a), int(b), int(n)))
    out: dict = {"kernels": {}}
    for k in KERNELS:
        rates = []
        for r in range(1, ntimes):
            rs = recs.get((k, r), [])
            if len(rs) != len(outputs):
                raise StreamError(f"missing {k} repetition {r} in tw_stream output")
            span = max(e for _, e, _ in rs) - min(s for s, _, _ in rs)
            rates.append(sum(n for _, _, n in rs) / max(span, 1))  # bytes/ns = GB/s
        out["kernels"][k] = {"best_gbs": max(rates), "median_gbs": statistics.median(rates), "reps": rates}
    return out


def run_cases(t: Topology, cpus: Sequence[int], policies: Sequence[str], sizes: Sequence[int], *, ntimes: int = 10,
              runs: int = 1, smt: bool = False, on_progress: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every (policy, size) `runs` times, interleaved (run 1 of all cases, then run 2, ...), so a
    drift of the machine hits every layout alike. A case's figures are the medians over runs of
    each run's best and median repetition; every run's figures stay in "runs"."""

    plans = plans_for(t, cpus, policies, smt)
    for p in plans:
        ensure_runnable(p)
    check_memory(sizes)
    cases: list[dict] = []
    index: dict[tuple[str, int], dict] = {}
    for _ in range(runs):
        for p in plans:
            for size in sizes:
                timeout = 60 + 30 * size * ntimes / 1e9
                r = run_one(p, size, ntimes, timeout)
                case = index.get((p.policy, size))
                if case is None:
                    case = {"policy": p.policy, "size_bytes": size, "instances": len(p.instances),
                            "bytes_per_array": r["bytes_per_array"], "layout": [i.to_json() for i in p.instances],
                            "runs": []}
                    index[(p.policy, size)] = case
                    cases.append(case)
                case["runs"].append(r["kernels"])
                case["kernels"] = {
                    k: {"best_gbs": statistics.median(x[k]["best_gbs"] for x in case["runs"]),
                        "median_gbs": statistics.median(x[k]["median_gbs"] for x in case["runs"]),
                        "reps": [v for x in case["runs"] for v in x[k]["reps"]]}
                    for k in KERNELS
                }
                if on_progress:
                    on_progress(cases)
    return cases


# ---- tilewise probe stream ---------------------------------------------------------------------

@dataclass
class Config:
    topology_src: str | None = None  # must describe this machine
    cpus: str | None = None  # --cpus (default: every CPU this process may use)
    policies: str = ",".join(STREAM_POLICIES)  # the layouts to compare, comma-separated
    sizes: tuple[int, ...] = ()  # bytes of one array over all processes (default: 4x the L3 of the CPUs used)
    ntimes: int = 10  # repetitions per run, the first a warm-up
    runs: int = 1  # runs of every case, interleaved
    smt: bool = False  # SMT siblings too
    compare_likwid: bool = False  # also likwid-bench copy on as many threads


def run(cfg: Config, reporter: matrix.Reporter | None = None, *, writer: Callable[[dict], None] | None = None) -> dict:
    """Every layout at every size; returns the probe.stream results document (given to `writer`
    after each case and when interrupted: a late failure loses nothing)."""
    rep = reporter or matrix.Reporter()
    write = writer or (lambda doc: None)
    t = matrix.live_topology(cfg.topology_src)
    cpus = matrix.choose_cpus(t, cfg.cpus, smt=cfg.smt or bool(cfg.cpus))
    pols = [p.strip() for p in cfg.policies.split(",") if p.strip()]
    if not pols:
        raise UsageError("--policies is empty", f"choose from {', '.join(STREAM_POLICIES)}")
    if cfg.sizes:
        sizes, size_note = list(cfg.sizes), "from --sizes"
    else:
        size, size_note = default_size(t, cpus)
        sizes = [size]
    plans = plans_for(t, cpus, pols, cfg.smt)
    rep.message(f"stream: {len(pols)} layout(s) x {len(sizes)} size(s) on CPUs {cpulist.format(cpus)} ({size_note}); "
                f"estimated {cfg.runs * estimate_s(plans, sizes, cfg.ntimes):.0f} s")
    doc = model.new("probe.stream", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"cpus": list(cpus), "policies": pols, "sizes": sizes, "ntimes": cfg.ntimes,
                            "runs": cfg.runs, "smt": cfg.smt, "compare_likwid": cfg.compare_likwid})
    doc.update({"probe": "stream", "unit": "GB/s", "cpus": list(cpus), "ntimes": cfg.ntimes, "runs": cfg.runs,
                "size_rule": size_note, "cases": [], "likwid": []})
    try:
        rep.start(cfg.runs * len(pols) * len(sizes))

        def on_progress(cases):
            doc["cases"] = cases
            write(doc)
            rep.advance()

        run_cases(t, cpus, pols, sizes, ntimes=cfg.ntimes, runs=cfg.runs, smt=cfg.smt, on_progress=on_progress)
        if cfg.compare_likwid:
            for s in sizes:
                doc["likwid"].append({"size_bytes": s, "threads": len(cpus)} | likwid_median(cpus, s, cfg.runs))
    except BaseException as e:
        model.stopped(doc, e)
        write(doc)
        raise
    model.finish(doc, complete=True)
    noisy = [f"{c['policy']}@{human_bytes(c['size_bytes'])}" for c in doc["cases"]
             if c["kernels"]["copy"]["median_gbs"] > 0
             and c["kernels"]["copy"]["best_gbs"] / c["kernels"]["copy"]["median_gbs"] > UNSTABLE]
    doc["warnings"] = [f"copy best/median above {UNSTABLE}x for {', '.join(noisy)}: the machine was busy; re-run on "
                       "a quiet machine, with more --ntimes or --runs"] if noisy else []
    return doc


# ---- reference: likwid-bench ------------------------------------------------------------------

def likwid_kernel() -> str:
    """The likwid copy kernel that matches tw_stream's: AVX loads/stores on x86 with AVX, else scalar."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l for l in f if l.startswith("flags")), "")
    except OSError:
        flags = ""
    return "copy_avx" if "avx" in flags.split() else "copy"


def likwid_copy(cpus: Sequence[int], size: int, timeout_s: float = 300) -> dict:
    """likwid-bench's copy kernel on the node domain with len(cpus) threads, per-array size `size`.

    likwid's workgroup size is the total of its vectors (2 for copy); its MByte/s counts loads and
    stores as STREAM does. Returns {"gbs": float} or {"error": "..."} (the exact message).
    """
    import shutil

    exe = shutil.which("likwid-bench")
    if not exe:
        return {"error": "likwid-bench not found (Debian package likwid)"}
    kb = max(1, 2 * size // 1000)
    cmd = [exe, "-t", likwid_kernel(), "-W", f"N:{kb}kB:{len(cpus)}"]  # -W: each thread first-touches its chunk, as ours
    return reference_tool(cmd, timeout_s, likwid_gbs)


def likwid_gbs(stdout: str) -> dict | None:
    """likwid-bench's "MByte/s:" line as {"gbs": ...} (it counts loads and stores as STREAM does)."""
    for line in stdout.splitlines():
        if line.startswith("MByte/s:"):
            return {"gbs": float(line.split()[1]) / 1000.0}
    return None


def reference_tool(cmd: list[str], timeout_s: float, parse: Callable[[str], dict | None]) -> dict:
    """Run a reference tool through the process edge (own group, stopped on timeout): parse(stdout)
    with the command line, or {"error": its last line, "command": ...}."""
    import subprocess

    try:
        cp = launch.run(cmd, timeout=timeout_s, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "command": " ".join(cmd)}
    got = parse(cp.stdout) if cp.returncode == 0 else None
    if got is not None:
        return got | {"command": " ".join(cmd)}
    msg = (cp.stderr.strip() or cp.stdout.strip() or f"exit status {cp.returncode}").splitlines()
    return {"error": msg[-1] if msg else f"exit status {cp.returncode}", "command": " ".join(cmd)}


def likwid_median(cpus: Sequence[int], size: int, runs: int) -> dict:
    """likwid_copy `runs` times; the median GB/s (or the first error)."""
    got = []
    for _ in range(runs):
        r = likwid_copy(cpus, size)
        if "error" in r:
            return r
        got.append(r)
    return {"gbs": statistics.median(r["gbs"] for r in got), "runs_gbs": [r["gbs"] for r in got],
            "command": got[0]["command"]}
