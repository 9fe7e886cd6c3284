"""`tilewise probe memory`: every CPU-to-memory path of this machine (thesis 004, ch. 4, for CXL).

For every initiator (each NUMA node with CPUs, or one given CPU set) and every target memory node
(CPU-less nodes included), one native tool (tw_memory) runs bound to the initiator's CPUs, places
its buffer on the target with mbind, checks that every page is there (move_pages, numa_maps)
before and after measuring, and measures idle load latency (dependent-load chase), read bandwidth
sequential and random, and write bandwidth with and without non-temporal stores, at each thread
count. A cell whose buffer cannot be placed, or whose pages are found elsewhere, is "not
measured" with the reason; it never gets a number.

Decisions are pure functions (initiators, targets, thread counts, sizes, parsing the tool's
output, the matrix); `run` is the use case (config, reporter) -> results document.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tilewise import cpulist, launch, native, topology
from tilewise.binding import Binding
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import matrix as pair_probes
from tilewise.probes.stream import likwid_gbs, reference_tool
from tilewise.results import model
from tilewise.results.kinds.memory import TESTS, MemoryDoc, best
from tilewise.topology import firmware as fw
from tilewise.topology import tiers
from tilewise.topology.model import Topology

MIN_SIZE = 64 * 2**20  # the buffer of a cell, at least
SIZE_PER_L3 = 8  # default buffer: 8x the machine's L3 ...
DEFAULT_MIN_SIZE = 256 * 2**20  # ... and at least 256 MiB
FREE_SHARE = 0.8  # a buffer may take at most this share of the target node's free memory
NOMINAL_SETUP_S = 0.5  # per cell: mapping, first touch, page checks (for the estimate)


class MemoryProbeError(TilewiseError):
    pass


@dataclass(frozen=True)
class Initiator:
    name: str  # "node 0" or "cpus 0-3"
    node: int | None  # the node, when the initiator is one (None: a CPU set)
    cpus: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "node": self.node, "cpus": list(self.cpus)}


@dataclass(frozen=True)
class Config:
    topology_src: str | None = None
    initiators: str | None = None  # --initiators: node list (default: every node with CPUs)
    cpus: str | None = None  # --cpus: one initiator made of these CPUs
    targets: str | None = None  # --targets: node list (default: every node with memory)
    threads: str | None = None  # --threads: counts (default 1, 2, 4, ... and the initiator's CPUs)
    size: int | None = None  # bytes per cell (default: SIZE_PER_L3 x the L3, at least DEFAULT_MIN_SIZE)
    tests: tuple[str, ...] = TESTS
    reps: int = 5  # repetitions per figure, the first a warm-up
    min_ms: float = 100.0  # each repetition runs at least this long
    hugepages: bool = True  # madvise(MADV_HUGEPAGE) on the buffer
    smt: bool = False  # every hardware thread (default: one per core)
    compare: bool = False  # also run likwid-bench, the reference chase, and Intel MLC where installed


class Reporter:
    """What the probe tells the user while it runs (the CLI renders it; tests can record it)."""

    def message(self, text: str) -> None: ...
    def start(self, cells: int) -> None: ...
    def cell(self, label: str) -> None: ...
    def partial(self, doc: dict) -> None: ...


# ---- decisions (pure) ---------------------------------------------------------------------------

def parse_tests(text: str) -> tuple[str, ...]:
    tests = tuple(dict.fromkeys(x.strip() for x in str(text).split(",") if x.strip()))
    bad = [x for x in tests if x not in TESTS]
    if bad or not tests:
        raise UsageError(f"--tests {text!r}: unknown test {', '.join(bad) or '(none)'}", f"choose from {','.join(TESTS)}")
    return tests


def initiator_cpus(t: Topology, cpus: Sequence[int], smt: bool) -> tuple[int, ...]:
    """The CPUs of an initiator the threads run on: one per core unless smt (first thread of a core first)."""
    if smt:
        return tuple(sorted(cpus))
    seen: set[int] = set()
    out = []
    for c in sorted(cpus):
        core = t.core_of_cpu[c].id
        if core not in seen:
            seen.add(core)
            out.append(c)
    return tuple(out)


def choose_initiators(t: Topology, nodes_text: str | None, cpus_text: str | None, allowed: Sequence[int],
                      *, smt: bool = False) -> tuple[list[Initiator], list[str]]:
    """The initiators and notes: the nodes of --initiators (default every node with CPUs this process
    may use), or the one CPU set of --cpus."""
    allowed_set = set(allowed)
    notes: list[str] = []
    if nodes_text and cpus_text:
        raise UsageError("--initiators and --cpus cannot be combined", "--cpus makes one initiator of its CPUs")
    if cpus_text:
        cpus = cpulist.parse_set(cpus_text, sorted(allowed_set), what="--cpus")
        unknown = [c for c in cpus if c not in t.core_of_cpu]
        if unknown:
            raise UsageError(f"--cpus {cpulist.format(unknown)}: not CPUs of this machine", f"CPUs are {cpulist.format(t.pus)}")
        bad = [c for c in cpus if c not in allowed_set]
        if bad:
            raise UsageError(f"--cpus {cpulist.format(bad)}: this process may not use them",
                             f"allowed CPUs are {cpulist.format(sorted(allowed_set))}")
        nodes = {t.core_of_cpu[c].numa_node for c in cpus}
        node = next(iter(nodes)) if len(nodes) == 1 and set(t.node_by_id[next(iter(nodes))].cpus) == set(cpus) else None
        return [Initiator(f"cpus {cpulist.format(cpus)}", node, initiator_cpus(t, cpus, smt))], notes
    ids = [n.id for n in t.numa_nodes]
    if nodes_text:
        chosen = cpulist.parse_set(nodes_text, ids, what="--initiators")
        unknown = [n for n in chosen if n not in t.node_by_id]
        if unknown:
            raise UsageError(f"--initiators {cpulist.format(unknown)}: no such NUMA node",
                             f"this machine's nodes are {cpulist.format(ids)}")
        cpuless = [n for n in chosen if t.node_by_id[n].cpuless]
        if cpuless:
            raise UsageError(f"--initiators {cpulist.format(cpuless)}: CPU-less node(s) cannot initiate a load",
                             f"they are targets; initiators are nodes with CPUs: {cpulist.format(n.id for n in t.cpu_nodes)}")
        out = []
        for n in chosen:
            cpus = [c for c in t.node_by_id[n].cpus if c in allowed_set]
            if not cpus:
                raise UsageError(f"--initiators {n}: this process may use none of node {n}'s CPUs "
                                 f"({cpulist.format(t.node_by_id[n].cpus)})",
                                 f"allowed CPUs are {cpulist.format(sorted(allowed_set))}")
            out.append(Initiator(f"node {n}", n, initiator_cpus(t, cpus, smt)))
        return out, notes
    out = []
    for n in t.cpu_nodes:
        cpus = [c for c in n.cpus if c in allowed_set]
        if cpus:
            out.append(Initiator(f"node {n.id}", n.id, initiator_cpus(t, cpus, smt)))
        else:
            notes.append(f"node {n.id} is not an initiator here: this process may use none of its CPUs")
    if not out:
        raise UsageError("no node with CPUs this process may use", "run where the affinity mask allows some CPUs")
    return out, notes


def choose_targets(t: Topology, text: str | None, mems_allowed: Sequence[int] | None = None) -> tuple[list[int], list[str]]:
    """The target nodes and notes: --targets (each must have memory), default every node with memory
    this process may allocate on."""
    ids = [n.id for n in t.numa_nodes]
    allowed = set(mems_allowed) if mems_allowed is not None else set(ids)
    notes: list[str] = []
    if text:
        chosen = cpulist.parse_set(text, ids, what="--targets")
        unknown = [n for n in chosen if n not in t.node_by_id]
        if unknown:
            raise UsageError(f"--targets {cpulist.format(unknown)}: no such NUMA node", f"this machine's nodes are {cpulist.format(ids)}")
        empty = [n for n in chosen if t.node_by_id[n].memory_bytes <= 0]
        if empty:
            raise UsageError(f"--targets {cpulist.format(empty)}: node(s) without memory cannot be a target",
                             "see `tilewise topo` for each node's memory")
        denied = [n for n in chosen if n not in allowed]
        if denied:
            raise UsageError(f"--targets {cpulist.format(denied)}: this process may not allocate there "
                             f"(Mems_allowed {cpulist.format(sorted(allowed))})", "run outside the cpuset that excludes them")
        return list(chosen), notes
    out = []
    for n in t.numa_nodes:
        if n.memory_bytes <= 0:
            notes.append(f"node {n.id} is not a target: it has no memory")
        elif n.id not in allowed:
            notes.append(f"node {n.id} is not a target: this process may not allocate there (Mems_allowed)")
        else:
            out.append(n.id)
    if not out:
        raise UsageError("no node with memory this process may allocate on")
    return out, notes


def thread_counts(text: str | None, ncpus: int) -> list[int]:
    """--threads LIST, or 1, 2, 4, ... up to and including the initiator's CPU count."""
    if ncpus < 1:
        raise UsageError("an initiator without CPUs")
    if text is None:
        out, k = [], 1
        while k < ncpus:
            out.append(k)
            k *= 2
        return out + [ncpus]
    out = []
    for part in str(text).split(","):
        p = part.strip()
        if not p:
            continue
        if not p.isdigit() or int(p) < 1:
            raise UsageError(f"--threads {text}: {p!r} is not a count of 1 or more", "e.g. --threads 1,2,4")
        out.append(int(p))
    if not out:
        raise UsageError("--threads is empty", "e.g. --threads 1,2")
    return sorted(set(out))


def clamp_threads(counts: Sequence[int], ncpus: int) -> list[int]:
    """The counts an initiator with ncpus CPUs can run (the others are left out and said so)."""
    return [c for c in counts if c <= ncpus]


def default_size(t: Topology) -> tuple[int, str]:
    l3 = t.total_l3_bytes
    if l3 <= 0:
        return DEFAULT_MIN_SIZE, "L3 size unknown: 256 MiB per cell"
    size = max(DEFAULT_MIN_SIZE, SIZE_PER_L3 * l3)
    size = (size + 2**21 - 1) // 2**21 * 2**21
    return size, f"{SIZE_PER_L3}x the machine's {l3 / 2**20:.0f} MiB of L3 (at least 256 MiB) per cell"


def estimate_s(cells: int, threads: Sequence[int], tests: Sequence[str], reps: int, min_ms: float) -> float:
    per_bw = len(threads) * reps * min_ms / 1e3 * 1.3
    per_cell = NOMINAL_SETUP_S + ("latency" in tests) * (reps + 1) * min_ms / 1e3 + \
        sum(1 for x in tests if x != "latency") * per_bw
    return cells * per_cell


def tool_argv(exe: str, target: int, size: int, threads: Sequence[int], tests: Sequence[str], reps: int,
              min_ms: float, hugepages: bool) -> list[str]:
    return [exe, "--target", str(target), "--size", str(size), "--threads", ",".join(map(str, threads)),
            "--tests", ",".join(tests), "--reps", str(reps), "--min-ms", f"{min_ms:g}",
            "--hugepages", "1" if hugepages else "0"]


_PLACE = re.compile(r"placement (\w+) target=(\d+) pages=(\d+) on_target=(\d+) other=(\S+) missing=(\d+) policy=(\S+)"
                    r" maps=(\S+)")


def _node_counts(text: str) -> dict[int, int]:
    """'0:12,2:4' -> {0: 12, 2: 4}; '-' -> {}."""
    return {} if text == "-" else {int(a): int(b) for a, b in (x.split(":") for x in text.split(","))}


def parse_output(text: str) -> dict:
    """tw_memory's output -> {"status", "reason", "info", "placement": {before, after}, "results"}.

    results[test][threads] = {"median", "best", "p10", "p90", "unit", "reps", "passes"}; a test the
    build cannot run (no non-temporal stores) is recorded with "unsupported": True."""
    out: dict = {"status": None, "reason": None, "info": {}, "placement": {}, "results": {}}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        head = parts[0]
        if head == "info" and len(parts) >= 3:
            out["info"][parts[1]] = " ".join(parts[2:])
        elif head == "placement":
            m = _PLACE.fullmatch(line.strip())
            if not m:
                raise MemoryProbeError(f"unexpected output from tw_memory: {line.strip()!r}")
            when, target, pages, on, other, missing, policy, maps = m.groups()
            # elsewhere: move_pages' answer page by page; numa_maps: the kernel's page counts per node
            out["placement"][when] = {"target": int(target), "pages": int(pages), "on_target": int(on),
                                      "elsewhere": _node_counts(other), "missing": int(missing), "policy": policy,
                                      "numa_maps": _node_counts(maps)}
        elif head == "result":
            if len(parts) != 10:
                raise MemoryProbeError(f"unexpected output from tw_memory: {line.strip()!r}")
            test, threads = parts[1], int(parts[2])
            vals = [float(x) for x in parts[3:7]]
            rec = {"median": vals[0], "best": vals[1], "p10": vals[2], "p90": vals[3], "unit": parts[7],
                   "reps": int(parts[8]), "passes": int(parts[9])}
            if any(math.isnan(v) for v in vals):
                rec = {"unsupported": True, "unit": parts[7]}
            out["results"].setdefault(test, {})[str(threads)] = rec
        elif head == "values" and len(parts) >= 3:
            rec = out["results"].get(parts[1], {}).get(parts[2])
            if rec is None or "median" not in rec:
                raise MemoryProbeError(f"tw_memory printed values before their result: {line.strip()!r}")
            rec["values"] = [float(x) for x in parts[3:]]
        elif head == "not_measured":
            out["status"] = "not_measured"
            out["reason"] = line.partition(" ")[2].strip()
        elif head == "ok":
            out["status"] = "measured"
    if out["status"] is None:
        raise MemoryProbeError("tw_memory ended without saying whether it measured (no ok/not_measured line)")
    if out["status"] == "measured":
        before = out["placement"].get("before")
        if not before or before["on_target"] != before["pages"] or before["pages"] == 0:
            raise MemoryProbeError("tw_memory measured without a complete placement check")
        if before["numa_maps"] != {before["target"]: before["pages"]}:
            raise MemoryProbeError("tw_memory measured although numa_maps counts pages elsewhere")
    return out


def emulation(cpuinfo: str | None, hypervisor: str | None) -> str | None:
    """Why measured times are not the hardware's (an emulator), or None."""
    if hypervisor and hypervisor.upper().startswith("TCG"):
        return "QEMU TCG (emulated CPU): times are the emulator's, not the memory's"
    if cpuinfo and re.search(r"^model name\s*:.*\bTCG\b", cpuinfo, re.M):
        return "QEMU TCG (emulated CPU): times are the emulator's, not the memory's"
    return None


def measured_paths(doc: dict) -> dict[tuple[int, int], dict]:
    """The figures topology.tiers takes, per (initiator node, target node): idle latency and the
    best sequential read bandwidth; untrusted (with the reason) when measured under an emulator."""
    out: dict[tuple[int, int], dict] = {}
    v = MemoryDoc.from_json(doc, "probe.memory document")
    nodes = {i.name: i.node for i in v.initiators}
    for c in v.measured():
        node = nodes.get(c.initiator)
        if node is None:
            continue
        out[(node, c.target)] = {"latency_ns": best(c, "latency")[0], "read_bw_gbs": best(c, "read_seq")[0],
                                 "trusted": v.emulated is None, "why_untrusted": v.emulated}
    return out


# ---- the edge: running the native tool ----------------------------------------------------------

def node_free_bytes(node: int, root: str = "/sys/devices/system/node") -> int | None:
    try:
        with open(os.path.join(root, f"node{node}", "meminfo")) as f:
            m = re.search(r"MemFree:\s+(\d+)\s*kB", f.read())
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def run_cell(ini: Initiator, target: int, size: int, threads: Sequence[int], tests: Sequence[str], reps: int,
             min_ms: float, hugepages: bool, *, timeout_s: float) -> dict:
    """One (initiator, target) cell: tw_memory bound to the initiator's CPUs."""
    cell = {"initiator": ini.name, "target": target, "threads": list(threads), "size_bytes": size}
    free = node_free_bytes(target)
    if free is not None and size > FREE_SHARE * free:
        return cell | {"status": "not_measured",
                       "reason": f"node {target} has {free / 2**20:.0f} MiB free; the {size / 2**20:.0f} MiB buffer "
                                 f"would take more than {FREE_SHARE:.0%} of it (use a smaller --size)"}
    argv = tool_argv(native.binary("tw_memory"), target, size, threads, tests, reps, min_ms, hugepages)
    try:
        cp = launch.run(argv, Binding(tuple(ini.cpus)), timeout=timeout_s, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        return cell | {"status": "failed", "reason": f"did not finish within {timeout_s:.0f} s (stopped)"}
    if cp.returncode != 0:
        err = (cp.stderr or "").strip().splitlines()
        why = err[-1].removeprefix("error: ") if err else f"exit status {cp.returncode}"
        if cp.returncode < 0:
            why = f"killed by signal {-cp.returncode}" + (" (out of memory on the target node?)" if cp.returncode == -9 else "")
        return cell | {"status": "failed", "reason": f"tw_memory: {why}"}
    return cell | parse_output(cp.stdout)


# ---- references ---------------------------------------------------------------------------------

def likwid_kernels() -> dict[str, str]:
    """likwid-bench kernels matching our tests (AVX where the CPU has it)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        flags = []
    avx = "avx" in flags
    return {"read_seq": "load_avx" if avx else "load", "write": "store_avx" if avx else "store",
            "write_nt": "store_mem_avx" if avx else "store_mem"}


def likwid_run(kernel: str, ini: Initiator, threads: int, target: int, size: int, timeout_s: float = 300) -> dict:
    """likwid-bench `kernel` with `threads` threads in the initiator's memory domain (M<node>; N, the
    whole machine, for a CPU set), its stream placed on memory domain M<target>: GB/s. likwid picks
    the domain's first hardware threads itself, which are the initiator's CPUs when it is a whole node."""
    exe = shutil.which("likwid-bench")
    if not exe:
        return {"error": "likwid-bench not found (Debian package likwid)"}
    domain = f"M{ini.node}" if ini.node is not None else "N"
    cmd = [exe, "-t", kernel, "-w", f"{domain}:{max(1, size // 1000)}kB:{threads}-0:M{target}"]
    return reference_tool(cmd, timeout_s, likwid_gbs)


def reference_chase(cpu: int, target: int, size: int, hugepages: bool, timeout_s: float = 300) -> dict:
    """tw_chase_ref on one CPU with its memory placed by numactl --membind (an independent placement
    and chase): ns per load."""
    numactl = shutil.which("numactl")
    if not numactl:
        return {"error": "numactl not found (Debian package numactl)"}
    cmd = [numactl, f"--membind={target}", f"--physcpubind={cpu}", native.binary("tw_chase_ref"), "--size", str(size),
           "--loads", "5000000", "--reps", "5", "--hugepages", "1" if hugepages else "0"]
    return reference_tool(cmd, timeout_s, lambda out: _ns(r"ns_per_load ([\d.]+)", out))


def mlc_run(initiator_cpu: int, target: int, timeout_s: float = 300) -> dict | None:
    """Intel MLC's idle latency from one CPU to a node, where mlc is installed (None otherwise)."""
    exe = shutil.which("mlc")
    if not exe:
        return None
    cmd = [exe, "--idle_latency", f"-c{initiator_cpu}", f"-j{target}"]
    return reference_tool(cmd, timeout_s, lambda out: _ns(r"\(\s*([\d.]+)\s*ns\)", out))


def _ns(pattern: str, text: str) -> dict | None:
    m = re.search(pattern, text)
    return {"ns": float(m.group(1))} if m else None


def references(cells: Sequence[dict], initiators: Sequence[Initiator], size: int, hugepages: bool) -> list[dict]:
    """For every measured cell: likwid-bench (read_seq, write, write_nt at the cell's largest thread
    count, stream on the target's memory domain), the reference chase and MLC (latency)."""
    by_name = {i.name: i for i in initiators}
    kernels = likwid_kernels()
    out = []
    for c in cells:
        if c.get("status") != "measured":
            continue
        ini = by_name[c["initiator"]]
        n = max(c["threads"])
        rec: dict = {"initiator": c["initiator"], "target": c["target"], "threads": n, "likwid": {}}
        for test, kernel in kernels.items():
            if test in (c.get("results") or {}):
                rec["likwid"][test] = {"kernel": kernel} | likwid_run(kernel, ini, n, c["target"], size)
        if "latency" in (c.get("results") or {}):
            rec["chase"] = reference_chase(ini.cpus[0], c["target"], size, hugepages)
            m = mlc_run(ini.cpus[0], c["target"])
            if m is not None:
                rec["mlc"] = m
        out.append(rec)
    return out


# ---- the use case ---------------------------------------------------------------------------------

def _mems_allowed(status_path: str = "/proc/self/status") -> list[int] | None:
    try:
        with open(status_path) as f:
            line = next((ln for ln in f if ln.startswith("Mems_allowed_list:")), "")
        return list(cpulist.parse(line.partition(":")[2], what="Mems_allowed_list"))
    except (OSError, UsageError):
        return None


def run(cfg: Config, reporter: Reporter | None = None, *, writer: Callable[[dict], None] | None = None) -> dict:
    """Measure the matrix; returns the probe.memory results document (rewritten through `writer`
    after every cell, so an interruption loses nothing)."""
    rep = reporter or Reporter()
    t = pair_probes.live_topology(cfg.topology_src)
    allowed = [c for c in os.sched_getaffinity(0) if t.allowed_cpus is None or c in t.allowed_cpus]
    inits, notes = choose_initiators(t, cfg.initiators, cfg.cpus, allowed, smt=cfg.smt)
    targets, tnotes = choose_targets(t, cfg.targets, _mems_allowed())
    notes += tnotes
    most = max(len(i.cpus) for i in inits)
    asked = thread_counts(cfg.threads, most)
    over = [c for c in asked if c > most]
    if over:  # never clamped: a count no initiator can run is refused, not left out
        raise UsageError(f"--threads {cfg.threads}: {over[0]} threads is more than any initiator's CPUs "
                         f"(at most {most})", f"use counts of 1 to {most}")
    if cfg.size is not None:
        if cfg.size < MIN_SIZE:
            raise UsageError(f"--size {cfg.size}: at least {MIN_SIZE // 2**20} MiB", "the buffer must be far larger than the caches")
        size, size_note = cfg.size, "from --size"
    else:
        size, size_note = default_size(t)
    if size <= 2 * t.total_l3_bytes:
        notes.append(f"the buffer ({size / 2**20:.0f} MiB) is not far larger than the L3 "
                     f"({t.total_l3_bytes / 2**20:.0f} MiB): latency and bandwidth include cache hits")
    if cfg.reps < 2:
        raise UsageError("--reps must be at least 2 (the first repetition is a warm-up)")
    cells_plan = [(i, tg) for i in inits for tg in targets]
    per_init = {i.name: clamp_threads(asked, len(i.cpus)) for i in inits}
    for i in inits:
        left = [c for c in asked if c not in per_init[i.name]]
        if not per_init[i.name]:
            raise UsageError(f"--threads {cfg.threads}: initiator {i.name} has {len(i.cpus)} CPU(s), fewer than every "
                             "count asked", f"add a count of 1 to {len(i.cpus)}, or leave --threads out")
        if left:
            notes.append(f"{i.name}: thread count(s) {', '.join(map(str, left))} left out (it has {len(i.cpus)} CPUs)")
    firmware = fw.read()
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = None
    est = sum(estimate_s(1, per_init[i.name], cfg.tests, cfg.reps, cfg.min_ms) for i, _ in cells_plan)
    params = {**asdict(cfg), "tests": list(cfg.tests), "size": size, "threads_per_initiator": per_init}
    doc = model.new("probe.memory", topo=t, params=params)
    doc.update({"probe": "memory", "initiators": [i.to_json() for i in inits], "targets": targets,
                "size_bytes": size, "size_rule": size_note, "tests": list(cfg.tests), "cells": [],
                "firmware": firmware.to_json(), "emulated": emulation(cpuinfo, None), "notes": notes, "references": []})
    rep.message(f"memory: {len(inits)} initiator(s) x {len(targets)} target(s), {size / 2**20:.0f} MiB per cell "
                f"({size_note}); estimated {est:.0f} s")
    for n in notes:
        rep.message(f"note: {n}")
    write = writer or (lambda d: None)
    rep.start(len(cells_plan))
    try:
        for ini, tg in cells_plan:
            rep.cell(f"{ini.name} -> node {tg}")
            threads = per_init[ini.name]
            timeout = 120 + 20 * estimate_s(1, threads, cfg.tests, cfg.reps, cfg.min_ms)
            cell = run_cell(ini, tg, size, threads, cfg.tests, cfg.reps, cfg.min_ms, cfg.hugepages, timeout_s=timeout)
            doc["cells"].append(cell)
            hv = (cell.get("info") or {}).get("hypervisor")
            if doc["emulated"] is None and hv:
                doc["emulated"] = emulation(None, hv)
            write(doc)
            rep.partial(doc)
        if cfg.compare:
            rep.message("references: likwid-bench, the reference chase" + (", Intel MLC" if shutil.which("mlc") else ""))
            doc["references"] = references(doc["cells"], inits, size, cfg.hugepages)
    except BaseException as e:
        model.stopped(doc, e)
        write(doc)
        raise
    model.finish(doc, complete=True)
    doc["warnings"] = warnings(doc)
    write(doc)
    return doc


UNSTABLE = 1.25  # p90/p10 above this: the machine was busy


def warnings(doc: dict) -> list[str]:
    out = []
    if doc.get("emulated"):
        out.append(f"{doc['emulated']}: the matrix shows where pages were, not how fast the memory is")
    bad = [f"{c['initiator']} -> node {c['target']}" for c in doc.get("cells", []) if c.get("status") != "measured"]
    if bad:
        out.append(f"{len(bad)} cell(s) not measured: {', '.join(bad)}")
    noisy = []
    for c in doc.get("cells", []):
        for test, by in (c.get("results") or {}).items():
            for k, r in by.items():
                if r.get("p10") and r.get("p90") and max(r["p90"], r["p10"]) / min(r["p90"], r["p10"]) > UNSTABLE:
                    noisy.append(f"{c['initiator']}->{c['target']} {test}@{k}")
    if noisy:
        out.append(f"{len(noisy)} figure(s) with a p90/p10 spread above {UNSTABLE}x ({', '.join(noisy[:6])}"
                   f"{', ...' if len(noisy) > 6 else ''}): the machine was busy; re-run on a quiet machine or with more --reps")
    return out


# ---- tilewise topo --measure-memory -------------------------------------------------------------

def measure_into(t: Topology, *, size: int | None = None, reps: int = 3, min_ms: float = 50.0,
                 report: Callable[[str], None] | None = None) -> list[str]:
    """Measure idle latency and sequential read bandwidth (all the initiator's cores) from every node
    with CPUs to every node with memory, and keep them in t.memattrs (tilewise:MeasuredLatency,
    tilewise:MeasuredReadBandwidth, tilewise:MeasuredTrusted: 0 under an emulator). Returns notes."""
    if not topology_is_this_machine(t):
        raise UsageError(f"--measure-memory measures this machine, but the topology is {t.source}",
                         "drop --topology, or use a file exported here")
    allowed = [c for c in os.sched_getaffinity(0) if t.allowed_cpus is None or c in t.allowed_cpus]
    inits, notes = choose_initiators(t, None, None, allowed)
    targets, tnotes = choose_targets(t, None, _mems_allowed())
    notes += tnotes
    size = size or default_size(t)[0]
    try:
        with open("/proc/cpuinfo") as f:
            why = emulation(f.read(), None)
    except OSError:
        why = None
    doc: dict = {"initiators": [i.to_json() for i in inits], "cells": [], "emulated": why}
    if report:
        report(f"measuring memory: {len(inits)} initiator(s) x {len(targets)} node(s), {size / 2**20:.0f} MiB each")
    for ini in inits:
        for tg in targets:
            n = len(ini.cpus)
            cell = run_cell(ini, tg, size, [n], ("latency", "read_seq"), reps, min_ms, True,
                            timeout_s=120 + 20 * estimate_s(1, [n], ("latency", "read_seq"), reps, min_ms))
            doc["cells"].append(cell)
            if doc["emulated"] is None:
                doc["emulated"] = emulation(None, (cell.get("info") or {}).get("hypervisor"))
            if cell.get("status") != "measured":
                notes.append(f"{ini.name} -> node {tg} not measured: {cell.get('reason')}")
    paths = measured_paths(doc)
    for name, attr in tiers.measured_memattrs(t, paths).items():
        t.memattrs[name] = attr
    notes.append(f"measured memory: idle latency and read bandwidth of {len(paths)} path(s), kept as memattrs "
                 f"{tiers.MEASURED_LATENCY}, {tiers.MEASURED_READ_BW}"
                 + (f"; {doc['emulated']}: marked untrusted ({tiers.MEASURED_TRUSTED} 0)" if doc["emulated"] else ""))
    return notes


def topology_is_this_machine(t: Topology) -> bool:
    return topology.is_live(t) or t.fingerprint() == topology.load(None).fingerprint()
