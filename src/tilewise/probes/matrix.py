"""Core-to-core probes over pairs of CPUs: run tw_latency / tw_bandwidth, assemble matrices.

The native tool gets the pairs on stdin and prints one line per pair (and mode) as it finishes,
so the caller can show progress. The tool runs in its own session and is killed on any exit path.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tilewise import cpulist, native, topology
from tilewise import launch, procs
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import pairs as pairs_mod
from tilewise.topology.model import Topology

LATENCY_MODES = ("cas", "rw")
NOMINAL_HOP_NS = 150.0  # for the estimate printed before starting; the progress bar refines it
NOMINAL_GBS = 8.0
PAIR_OVERHEAD_S = 0.002


class ProbeError(TilewiseError):
    pass


@dataclass(frozen=True)
class PairStat:
    a: int
    b: int
    mode: str
    median: float
    p10: float
    p90: float
    min: float
    max: float
    samples: int
    node: int  # NUMA node the shared memory was placed on (-1: unknown)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LatencyParams:
    samples: int = 100
    iters: int = 200
    warmup: int = 2000
    modes: tuple[str, ...] = LATENCY_MODES

    def argv(self) -> list[str]:
        return ["--samples", str(self.samples), "--iters", str(self.iters), "--warmup", str(self.warmup),
                "--modes", ",".join(self.modes)]

    def estimate_s(self, npairs: int) -> float:
        per_mode = (self.warmup + self.samples * self.iters) * 2 * NOMINAL_HOP_NS * 1e-9
        return npairs * (len(self.modes) * per_mode + PAIR_OVERHEAD_S)


@dataclass(frozen=True)
class BandwidthParams:
    size: int = 256 * 1024
    samples: int = 50
    warmup: int = 5

    def argv(self) -> list[str]:
        return ["--size", str(self.size), "--samples", str(self.samples), "--warmup", str(self.warmup)]

    def estimate_s(self, npairs: int) -> float:
        per_round = 2 * self.size / (NOMINAL_GBS * 1e9)
        return npairs * ((self.samples + self.warmup) * per_round + PAIR_OVERHEAD_S)


# ---- choosing CPUs ---------------------------------------------------------------------------

def live_topology(src: str | None) -> Topology:
    """The topology to group by; a loaded one must describe this machine (probes measure here)."""
    t = topology.load(src)
    if src is not None:
        live = topology.load(None)
        if t.fingerprint() != live.fingerprint():
            raise UsageError(
                f"--topology {src} is not this machine ({live.summary()}): probes measure the machine they run on",
                "drop --topology, or pass a file exported here with `tilewise topo --export`",
            )
    return t


def choose_cpus(t: Topology, cpus_text: str | None, *, smt: bool = True) -> tuple[int, ...]:
    """--cpus, or every CPU this process may use (SMT siblings included unless smt=False)."""
    allowed = set(os.sched_getaffinity(0))
    if t.allowed_cpus is not None:
        allowed &= set(t.allowed_cpus)
    if cpus_text:
        cpus = cpulist.parse_set(cpus_text, sorted(allowed), what="--cpus")
        unknown = [c for c in cpus if c not in t.core_of_cpu]
        if unknown:
            raise UsageError(f"--cpus {cpulist.format(unknown)}: not CPUs of this machine",
                             f"CPUs are {cpulist.format(t.pus)}")
        bad = [c for c in cpus if c not in allowed]
        if bad:
            raise UsageError(f"--cpus {cpulist.format(bad)}: this process may not use them",
                             f"allowed CPUs are {cpulist.format(allowed)}")
        return tuple(cpus)
    cpus = [p for p in t.pus if p in allowed]
    if not smt:  # one hardware thread per core
        seen: set[int] = set()
        cpus = [p for p in cpus if not (t.core_of_cpu[p].id in seen or seen.add(t.core_of_cpu[p].id))]
    return tuple(cpus)


# ---- running the native tool -----------------------------------------------------------------

def run_pairs(tool: str, argv: Sequence[str], pairs: Sequence[tuple[int, int]],
              on_result: Callable[[PairStat], None] | None = None, timeout_s: float | None = None) -> list[PairStat]:
    exe = native.binary(tool)
    stdin_text = "".join(f"{a} {b}\n" for a, b in pairs)
    proc = launch.spawn([exe, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    results: list[PairStat] = []
    try:
        proc.stdin.write(stdin_text)
        proc.stdin.close()
        for line in proc.stdout:
            r = parse_line(line)
            results.append(r)
            if on_result:
                on_result(r)
        rc = proc.wait(timeout=timeout_s)
        err = proc.stderr.read().strip()
        if rc != 0:
            last = err.splitlines()[-1] if err else f"exit status {rc}"
            raise ProbeError(f"{tool} failed: {last.removeprefix('error: ')}")
    finally:
        procs.stop(proc)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
    return results


def parse_line(line: str) -> PairStat:
    p = line.split()
    if len(p) != 10:
        raise ProbeError(f"unexpected output from a probe: {line.strip()!r}")
    return PairStat(int(p[0]), int(p[1]), p[2], *(float(x) for x in p[3:8]), int(p[8]), int(p[9]))


# ---- assembling --------------------------------------------------------------------------------

def assemble(cpus: Sequence[int], stats: Sequence[PairStat], mode: str, field: str = "median") -> list[list]:
    """CPU x CPU matrix of one mode: None where a pair was not measured, 0 on the diagonal."""
    pos = {c: i for i, c in enumerate(cpus)}
    m: list[list] = [[0.0 if i == j else None for j in range(len(cpus))] for i in range(len(cpus))]
    for s in stats:
        if s.mode == mode:
            m[pos[s.a]][pos[s.b]] = getattr(s, field)
    return m


def build_doc(doc: dict, t: Topology, cpus, selection: str, stats: Sequence[PairStat], modes: Sequence[str],
              unit: str) -> dict:
    """Fill a probe.latency / probe.bandwidth results document (results.model.new) with the
    measured pairs: raw per-pair statistics, median matrices, p10/p90 spread, per-class summary."""
    doc.update({
        "probe": doc["kind"].split(".", 1)[1],
        "unit": unit,
        "cpus": list(cpus),
        "pairs": selection,
        "matrices": {},
        "spread": {},
        "summary": {},
        "raw": [s.to_json() for s in stats],
    })
    for mode in modes:
        med = assemble(cpus, stats, mode)
        doc["matrices"][mode] = med
        doc["spread"][mode] = {"p10": assemble(cpus, stats, mode, "p10"), "p90": assemble(cpus, stats, mode, "p90")}
        doc["summary"][mode] = pairs_mod.group_matrix(t, cpus, med, values=True)
    return doc


# ---- tilewise topo --measure -------------------------------------------------------------------

def measure_into(t: Topology, *, full: bool = False, latency: LatencyParams | None = None,
                 bandwidth: BandwidthParams | None = None, report: Callable[[str], None] | None = None) -> list[str]:
    """Measure latency (cas, median ns) and bandwidth (GB/s) on this machine and store them in
    t.measurements as "latency_ns" and "bandwidth_gbs" (diagonal 0, unmeasured pairs 0).
    Returns notes; stores nothing (and says why) where no pair can be measured."""
    if not topology.is_live(t) and t.fingerprint() != topology.load(None).fingerprint():
        raise UsageError(f"--measure measures this machine, but the topology is {t.source}",
                         "drop --topology, or use a file exported here")
    cpus = choose_cpus(t, None)
    if len(cpus) < 2:
        return [f"not measured: core-to-core probes need two CPUs, this process may use only {cpulist.format(cpus)}"]
    selected, desc = pairs_mod.select_pairs(t, cpus, full=full)
    lat = latency or LatencyParams(samples=50, iters=200, modes=("cas",))
    bw = bandwidth or BandwidthParams(samples=20)
    if report:
        report(f"measuring {desc}; estimated {lat.estimate_s(len(selected)) + bw.estimate_s(len(selected)):.0f} s")
    stats = run_pairs("tw_latency", lat.argv(), selected)
    t.measurements["latency_ns"] = pairs_mod.to_measurement(cpus, assemble(cpus, stats, "cas"))
    stats = run_pairs("tw_bandwidth", bw.argv(), selected)
    t.measurements["bandwidth_gbs"] = pairs_mod.to_measurement(cpus, assemble(cpus, stats, "bw"))
    notes = [f"measured {desc}: latency_ns (compare-and-swap, median ns per one-way hop), bandwidth_gbs (GB/s)"]
    if len(selected) < len(cpus) * (len(cpus) - 1):
        notes.append("pairs not sampled are stored as 0 (not measured)")
    return notes
