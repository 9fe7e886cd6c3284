"""Core-to-core probes over pairs of CPUs: run tw_latency / tw_bandwidth, assemble matrices.

The native tool gets the pairs on stdin and prints one line per pair (and mode) as it finishes,
so the caller can show progress. The tool runs in its own session and is killed on any exit path.
`probe latency` and `probe bandwidth` are ``run(config, reporter)``: the probe.latency /
probe.bandwidth results document, written through `writer` also when interrupted.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tilewise import cpulist, launch, native, procs, topology
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import pairs as pairs_mod
from tilewise.results import model
from tilewise.topology.model import Topology

LATENCY_MODES = ("cas", "rw")
NOMINAL_HOP_NS = 150.0  # for the estimate printed before starting; the progress bar refines it
NOMINAL_GBS = 8.0
PAIR_OVERHEAD_S = 0.002
UNSTABLE = 1.5  # p90/p10 of a pair above this: warn


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


# ---- tilewise probe latency | bandwidth ---------------------------------------------------------

@dataclass
class Config:
    params: LatencyParams | BandwidthParams  # which probe, and how much of it
    topology_src: str | None = None  # must describe this machine (grouping only)
    cpus: str | None = None  # --cpus (default: every CPU this process may use)
    full: bool = False  # every ordered pair (default: a sample by class on big machines)

    @property
    def kind(self) -> str:
        return "latency" if isinstance(self.params, LatencyParams) else "bandwidth"


class Reporter:
    def message(self, text: str) -> None: ...
    def start(self, total: int) -> None: ...  # the number of measurements to come
    def advance(self) -> None: ...  # one more done


def run(cfg: Config, reporter: Reporter | None = None, *, writer: Callable[[dict], None] | None = None) -> dict:
    """Measure the pairs; returns the results document, given to `writer` at the end, also when
    interrupted (then marked stopped, with the pairs measured so far)."""
    rep = reporter or Reporter()
    kind = cfg.kind
    t = live_topology(cfg.topology_src)
    cpus = choose_cpus(t, cfg.cpus)
    if len(cpus) < 2:
        raise UsageError(f"not measured: a core-to-core {kind} probe needs two CPUs, only {cpulist.format(cpus)} "
                         "is available", "run where this process may use two or more CPUs")
    selected, desc = pairs_mod.select_pairs(t, cpus, full=cfg.full)
    if kind == "latency":
        tool, modes, unit = "tw_latency", cfg.params.modes, "ns"
    else:
        tool, modes, unit = "tw_bandwidth", ("bw",), "GB/s"
    doc = model.new(f"probe.{kind}", topo=t, params={**asdict(cfg.params), "cpus": list(cpus), "full": cfg.full},
                    system_check=system_check(numa_nodes=len(t.cpu_nodes)))
    rep.message(f"{kind}: {desc}; estimated {cfg.params.estimate_s(len(selected)):.0f} s")
    stats: list[PairStat] = []
    try:
        rep.start(len(selected) * len(modes))
        run_pairs(tool, cfg.params.argv(), selected, on_result=lambda s: (stats.append(s), rep.advance()))
        model.finish(doc, complete=True)
    except BaseException as e:
        model.stopped(doc, e)
        raise
    finally:
        build_doc(doc, t, cpus, desc, stats, modes if stats else (), unit)
        doc["warnings"] = pair_warnings(doc, modes)
        if writer is not None:
            writer(doc)
    return doc


def pair_warnings(doc: dict, modes) -> list[str]:
    out = []
    for m in modes:
        noisy = [(s["a"], s["b"]) for s in doc["raw"]
                 if s["mode"] == m and s["p10"] > 0 and max(s["p90"], s["p10"]) / min(s["p90"], s["p10"]) > UNSTABLE]
        if noisy:
            out.append(f"{m}: {len(noisy)} of {sum(1 for s in doc['raw'] if s['mode'] == m)} pairs have a p90/p10 "
                       f"spread above {UNSTABLE}x: the machine was busy or throttling; re-run on a quiet machine "
                       "or with more --samples")
    return out


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
