"""Running the native workloads (W1-W4, the allocator microbenchmark) and arbitrary commands under
one `Config`, through tilewise.launch: allocator preload (LD_PRELOAD), memory policy
(set_mempolicy in the child), thread placement (a per-thread CPU order passed with --pin).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass

from tilewise import allocators, changes, launch, native, procs, verification
from tilewise.errors import TilewiseError, UsageError
from tilewise.results.kinds.workload import DESCRIPTIONS  # noqa: F401 - the workloads' titles, owned by their results kind
from tilewise.tune.knobs import Config, thread_order

BINARIES = {"W1": "tw_w1_holistic", "W2": "tw_w2_distributive", "W3": "tw_w3_hashjoin", "W4": "tw_w4_inlj",
            "alloc": "tw_allocbench"}
AGG_DATASETS = ("moving-cluster", "sequential", "zipf")
# The paper's sizes (003 section 4.2): 100M records / 1M groups; 16M x 256M; 100M ops per thread.
PAPER_SCALE = {"W1": {"records": 100_000_000, "groups": 1_000_000}, "W2": {"records": 100_000_000, "groups": 1_000_000},
               "W3": {"records": 16_000_000}, "W4": {"records": 16_000_000}, "alloc": {"ops": 100_000_000}}


def canonical(name: str) -> str:
    for k in BINARIES:
        if k.lower() == name.strip().lower():
            return k
    raise UsageError(f"unknown workload {name!r}", f"choose one of {', '.join(BINARIES)}")


@dataclass(frozen=True)
class Params:
    """Workload parameters; None means the binary's default (sized for seconds on 2 cores)."""

    dataset: str | None = None
    records: int | None = None
    groups: int | None = None
    zipf_exponent: float | None = None
    ratio: int | None = None
    ops: int | None = None
    slots: int | None = None
    threads: int | None = None
    seed: int | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def validate(workload: str, p: Params) -> None:
    w = workload
    if p.dataset is not None:
        if w in ("W1", "W2") and p.dataset not in AGG_DATASETS:
            raise UsageError(f"{w} datasets are {', '.join(AGG_DATASETS)}, not {p.dataset!r}")
        if w in ("W3", "W4") and p.dataset != "uniform":
            raise UsageError(f"{w} has one dataset, uniform (R keys unique, S foreign keys uniform)")
        if w == "alloc":
            raise UsageError("the allocator microbenchmark takes no --dataset")
    if w not in ("W1", "W2") and (p.groups is not None or p.zipf_exponent is not None):
        raise UsageError(f"--groups/--zipf-exponent apply to W1 and W2, not {w}")
    if w not in ("W3", "W4") and p.ratio is not None:
        raise UsageError(f"--ratio applies to W3 and W4, not {w}")
    if w != "alloc" and (p.ops is not None or p.slots is not None):
        raise UsageError(f"--ops/--slots apply to the allocator microbenchmark (alloc), not {w}")
    if w == "alloc" and p.records is not None:
        raise UsageError("the allocator microbenchmark takes --ops (per thread), not --records")
    for name in ("records", "groups", "ratio", "ops", "slots", "threads"):
        v = getattr(p, name)
        if v is not None and v < 1:
            raise UsageError(f"--{name} must be at least 1")


def argv(workload: str, p: Params, pin: list[int] | None, extra: list[str] | None = None) -> list[str]:
    validate(workload, p)
    a = [native.binary(BINARIES[workload])]
    flags = {"dataset": p.dataset, "records": p.records, "groups": p.groups, "zipf-exponent": p.zipf_exponent,
             "ratio": p.ratio, "ops": p.ops, "slots": p.slots, "threads": p.threads, "seed": p.seed}
    for k, v in flags.items():
        if v is not None:
            a += [f"--{k}", str(v)]
    if pin:
        a += ["--pin", ",".join(map(str, pin))]
    return a + list(extra or [])


def effective_threads(p: Params) -> int:
    return p.threads or len(os.sched_getaffinity(0))


def pin_for(cfg: Config, p: Params, topo) -> list[int] | None:
    return thread_order(topo, cfg.placement, effective_threads(p), set(os.sched_getaffinity(0)))


@dataclass
class RunResult:
    result: dict  # the binary's JSON (or {"time_s": wall} for a command)
    wall_s: float
    config: Config
    verification: dict | None
    allocator_verified: bool | None

    def to_json(self) -> dict:
        return {"result": self.result, "wall_s": self.wall_s, "config": self.config.to_json(),
                "verification": self.verification, "allocator_verified": self.allocator_verified}


def _allocator_check(cfg: Config, libs: list[str]) -> bool:
    lib = allocators.find_library(cfg.allocator)
    if lib is None:
        return not libs  # the system allocator: nothing else mapped
    return os.path.basename(lib) in libs


def _run_bound(cmd: list[str], cfg: Config, what: str, timeout: float, hint: str, *, capture: bool,
               cpus: tuple[int, ...] | None = None, env: dict | None = None, binding=None):
    """Start cmd bound by cfg (and to cpus when given), verify the binding, wait (with a time
    limit), always reap. env: the child's environment (default: ours). binding: a Binding to use
    instead of cfg's (a plan's instance: its CPUs, memory policy and weights).

    Returns (stdout bytes or None, wall seconds, Verification); a non-zero exit is a TilewiseError
    carrying the last lines of the command's stderr.
    """
    b = binding if binding is not None else cfg.binding(cpus)
    with tempfile.TemporaryFile() as errf:
        journal = changes.Session(f"tune run {os.path.basename(cmd[0])}")  # restore stops it after a kill -9
        token = launch.journal_start(journal, cmd)  # before the clock starts
        t0 = time.perf_counter()
        proc = launch.spawn(cmd, b, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=errf,
                            stdin=subprocess.DEVNULL, journal=journal, token=token, env=env)  # a failed start leaves no record
        try:
            v = verification.verify(proc.pid, b, allocator_wait_s=0.2)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise TilewiseError(f"{what} ran longer than {timeout:g} s and was stopped", hint) from None
            wall = time.perf_counter() - t0
        finally:
            if procs.stop(proc).ok:
                journal.commit()
        if proc.returncode != 0:
            errf.seek(0)
            tail = errf.read().decode(errors="replace").strip().splitlines()[-3:]
            raise TilewiseError(f"{what} ({cfg.label()}) exited with code {proc.returncode}: {' / '.join(tail) or 'no message'}")
    return out, wall, v


def run_workload(workload: str, p: Params, cfg: Config, topo, *, timeout: float = 600, extra: list[str] | None = None,
                 binding=None) -> RunResult:
    """One run of a native workload under cfg (or under `binding`, a plan instance's, with cfg's
    placement inside its CPUs); raises TilewiseError on failure (the child is reaped)."""
    if binding is not None and binding.cpus:
        pin = thread_order(topo, cfg.placement, p.threads or len(binding.cpus), set(binding.cpus))
    else:
        pin = pin_for(cfg, p, topo)
    cmd = argv(workload, p, pin, extra)
    out, wall, v = _run_bound(cmd, cfg, workload, timeout, "use smaller --records or a larger --timeout", capture=True,
                              binding=binding)
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip().startswith("{")]
    try:
        res = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise TilewiseError(f"{workload} printed no JSON result") from None
    other = [x for x in v.problems if not x.startswith("allocator")]  # the binary reports its allocator itself
    if other:
        raise TilewiseError(f"{workload}: binding not applied: " + "; ".join(other))
    ok = _allocator_check(cfg, res.get("allocator_libs", []))
    if not ok:
        raise TilewiseError(f"{workload}: allocator {cfg.allocator} is not the one in use (mapped: {res.get('allocator_libs')})")
    return RunResult(res, wall, cfg, v.to_json(), ok)


def run_command(command: list[str], cfg: Config, *, timeout: float = 600) -> RunResult:
    """Black-box mode: time an arbitrary command (wall clock) under cfg; placement must be none."""
    if cfg.placement != "none":
        raise UsageError("thread placement inside an arbitrary command is not possible",
                         "use --placements none with `tune -- CMD` (placement needs a tilewise workload)")
    _, wall, v = _run_bound(command, cfg, command[0], timeout, "use --timeout", capture=False)
    if v.problems and not all(x.startswith("allocator") for x in v.problems):
        raise TilewiseError(f"{command[0]}: binding not applied: " + "; ".join(v.problems))
    return RunResult({"time_s": wall}, wall, cfg, v.to_json(), v.allocator_loaded)
