"""Reading back what a started process got: /proc/PID, item by item (cpus, memory policy,
allocator). Each item is verified, a mismatch, or not checkable (with the reason). Nothing is
called verified that was not read back.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from tilewise import allocators, cpulist, devices, procs
from tilewise.binding import NEEDS_NODES, Binding
from tilewise.errors import TilewiseError

# How /proc/PID/numa_maps names each policy (kernel mpol_to_str)
NUMA_MAPS_NAME = {"first-touch": "default", "preferred": "prefer", "membind": "bind",
                  "interleave": "interleave", "local": "local", "weighted-interleave": "weighted interleave",
                  "preferred-many": "prefer (many)"}

VERIFIED, MISMATCH, NOT_CHECKABLE = "verified", "mismatch", "not checkable"
# the one-field verdict (Verification.verdict) as results and `tilewise status` say it
VERDICT_TEXT = {True: VERIFIED, False: MISMATCH, None: NOT_CHECKABLE}


@dataclass
class Check:
    """One item of a binding read back: verified, mismatch, or not checkable (detail says why)."""

    state: str
    want: str
    got: str | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.state == VERIFIED:
            return f"{self.want} verified"
        if self.state == MISMATCH:
            return f"MISMATCH: wanted {self.want}, process has {self.got}"
        return f"{self.want} not checkable ({self.detail})"


@dataclass
class Verification:
    pid: int
    checks: dict[str, Check] = field(default_factory=dict)  # cpus (when set), memory, allocator (when not system)
    cpus: tuple[int, ...] = ()
    mems_allowed: tuple[int, ...] = ()
    mem_policy: str = ""
    allocator_loaded: bool | None = None  # None: not checked
    notes: list[str] = field(default_factory=list)  # what was not asked for, said plainly

    @property
    def problems(self) -> list[str]:
        return [f"{k}: {c.describe()}" for k, c in self.checks.items() if c.state == MISMATCH]

    @property
    def ok(self) -> bool:
        """No item is known to be wrong (some may not be checkable)."""
        return not self.problems

    @property
    def verified(self) -> bool:
        """Every item was read back and matches."""
        return all(c.state == VERIFIED for c in self.checks.values())

    @property
    def state(self) -> str:
        states = {c.state for c in self.checks.values()}
        return MISMATCH if MISMATCH in states else NOT_CHECKABLE if NOT_CHECKABLE in states else VERIFIED

    @property
    def verdict(self) -> bool | None:
        """True verified, False mismatch, None not checkable (for one-field summaries)."""
        return next(v for v, text in VERDICT_TEXT.items() if text == self.state)

    def summary(self) -> str:
        parts = [f"{k} {c.describe()}" for k, c in self.checks.items()]
        return "; ".join(parts + self.notes)

    def to_json(self) -> dict:
        return {"pid": self.pid, "state": self.state, "verified": self.verified, "ok": self.ok,
                "checks": {k: asdict(c) for k, c in self.checks.items()},
                "cpus": cpulist.format(self.cpus), "mems_allowed": cpulist.format(self.mems_allowed),
                "mem_policy": self.mem_policy, "allocator_loaded": self.allocator_loaded,
                "problems": self.problems, "notes": self.notes}


def parse_policy(text: str) -> tuple[str, tuple[int, ...] | None]:
    """'bind:0-1' / 'interleave=static:0' / 'default' -> (mode, nodes or None)."""
    head, _, nodes = text.partition(":")
    mode = head.split("=")[0]
    if not nodes:
        return mode, None
    try:
        return mode, cpulist.parse(nodes, what="numa_maps nodes")
    except TilewiseError:
        return mode, None


def _policy_field(parts: list[str]) -> str:
    """The policy column of a numa_maps line; two words for "weighted interleave:0-1" (Linux 6.9+) and
    "prefer (many):0,2" (MPOL_PREFERRED_MANY, 5.15+)."""
    if len(parts) >= 3 and (parts[1] == "weighted" or (parts[1] == "prefer" and parts[2].startswith("(many)"))):
        return f"{parts[1]} {parts[2]}"
    return parts[1]


def read_task_policy(pid: int, proc: str = "/proc") -> str:
    """The process's memory policy as numa_maps shows it for mappings without one of their own: the
    policy most mappings show. '' when numa_maps is empty; OSError when it cannot be read."""
    with open(f"{proc}/{pid}/numa_maps") as f:
        seen = Counter(_policy_field(parts) for line in f if len(parts := line.split()) >= 2)
    return seen.most_common(1)[0][0] if seen else ""


def maps_contain(pid: int, path: str, proc: str = "/proc") -> bool:
    base = os.path.basename(path)
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any(line.rstrip().endswith(path) or line.rstrip().endswith("/" + base) for line in f)
    except OSError:
        return False


def expected_policy(b: Binding) -> str:
    """The policy, as numa_maps writes it, that a process bound by b shows."""
    name = NUMA_MAPS_NAME.get(b.mem_policy, b.mem_policy)
    if b.mem_policy in ("first-touch", "local"):
        return name
    return f"{name}:{cpulist.format(b.mem_nodes)}"


def _zombie(st: dict) -> bool:
    return st.get("State", "").startswith(("Z", "X"))


def verify(pid: int, b: Binding, *, allocator_wait_s: float = 0.5, proc: str = "/proc") -> Verification:
    """Read back what /proc/PID shows, item by item: verified, mismatch, or not checkable."""
    v = Verification(pid)
    want_mem = expected_policy(b)
    lib = allocators.find_library(b.allocator)
    try:
        st = procs.status(pid, proc)
    except OSError as e:
        why = f"pid {pid} is gone ({e.strerror or e})"
        if b.cpus is not None:
            v.checks["cpus"] = Check(NOT_CHECKABLE, cpulist.format(b.cpus), None, why)
        v.checks["memory"] = Check(NOT_CHECKABLE, want_mem, None, why)
        if lib:
            v.checks["allocator"] = Check(NOT_CHECKABLE, b.allocator, None, why)
        return v
    v.cpus = cpulist.parse(st.get("Cpus_allowed_list", ""), what="Cpus_allowed_list", allow_empty=True)
    v.mems_allowed = cpulist.parse(st.get("Mems_allowed_list", ""), what="Mems_allowed_list", allow_empty=True)
    if b.cpus is not None:  # a zombie's status still shows its mask
        want = cpulist.format(sorted(b.cpus))
        got = cpulist.format(v.cpus)
        v.checks["cpus"] = Check(VERIFIED if tuple(sorted(b.cpus)) == v.cpus else MISMATCH, want, got)
    else:
        v.notes.append("cpus not set (left as inherited)")
    v.checks["memory"] = _check_memory(pid, b, want_mem, v, st, proc)
    if lib:
        v.checks["allocator"] = _check_allocator(pid, b, lib, v, allocator_wait_s, proc)
    else:
        v.notes.append(f"allocator {b.allocator}: nothing preloaded, nothing to check")
    if b.gpu:
        v.checks["gpu"] = check_gpu(pid, b.gpu, proc)
    return v


def verify_tree(pid: int, b: Binding, *, proc: str = "/proc") -> dict:
    """Every process of pid's tree (pid and its descendants: a postmaster's backends and workers,
    which inherit its CPUs, memory policy and preloaded allocator at fork) read back against b.
    A summary for results: processes, how many verified, the allocator mapped in how many, and
    one line per process that is not as bound."""
    table = procs.scan(proc)
    pids = [pid, *sorted(procs.descendants([pid], table))]
    verified, unchecked, mapped, problems, why = 0, 0, 0, [], []
    gone = 0
    for p in pids:
        v = verify(p, b, allocator_wait_s=0.0, proc=proc)
        if procs.stat(p, proc) is None:  # it ended meanwhile (a backend whose client left): not a member now
            gone += 1
            continue
        st = table.get(p)
        who = f"pid {p} ({st.comm if st else '?'})"
        if v.state == VERIFIED:
            verified += 1
        elif v.ok:
            unchecked += 1
            why.append(f"{who}: " + "; ".join(f"{k} {c.describe()}" for k, c in v.checks.items()
                                                if c.state == NOT_CHECKABLE))
        else:
            problems.append(f"{who}: " + "; ".join(v.problems))
        mapped += bool(v.allocator_loaded)
    return {"root": pid, "processes": len(pids) - gone, "verified": verified, "not_checkable": unchecked,
            "allocator": b.allocator, "allocator_mapped": mapped if allocators.find_library(b.allocator) else None,
            "problems": problems, "unchecked": why[:3]}


def check_gpu(pid: int, uuid: str, proc: str = "/proc", nvml=None) -> Check:
    """A GPU tile's process: its environment shows only its GPU, and, where NVML is present and the
    process has a CUDA context, NVML sees it on that GPU and no other. nvml: devices.process_gpus."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError as e:
        return Check(NOT_CHECKABLE, uuid, None, f"environ unreadable ({e.strerror or e})")
    seen = env.get(b"CUDA_VISIBLE_DEVICES", b"").decode(errors="replace")
    if seen != uuid:
        return Check(MISMATCH, uuid, f"CUDA_VISIBLE_DEVICES={seen or '(unset)'}")
    on, why = (nvml or devices.process_gpus)(pid)
    if on is None:
        return Check(NOT_CHECKABLE, uuid, None, f"CUDA_VISIBLE_DEVICES={uuid} verified; which GPU it runs on: {why}")
    if not on:
        return Check(NOT_CHECKABLE, uuid, None, f"CUDA_VISIBLE_DEVICES={uuid} verified; NVML sees no CUDA context "
                                                "of this process yet")
    if on == [uuid]:
        return Check(VERIFIED, uuid, f"NVML: running on {uuid}")
    return Check(MISMATCH, uuid, f"NVML: running on {', '.join(on)}")


def _check_memory(pid: int, b: Binding, want: str, v: Verification, st: dict, proc: str) -> Check:
    missing = [n for n in b.mem_nodes if n not in v.mems_allowed]
    if b.mem_policy in NEEDS_NODES and missing:
        return Check(MISMATCH, want, f"Mems_allowed_list {cpulist.format(v.mems_allowed)}",
                     f"nodes {cpulist.format(missing)} are not allowed")
    if _zombie(st):
        return Check(NOT_CHECKABLE, want, None, "the process exited before its memory policy could be read")
    try:
        v.mem_policy = read_task_policy(pid, proc)
    except OSError as e:
        return Check(NOT_CHECKABLE, want, None, f"numa_maps unreadable ({e.strerror or e})")
    if not v.mem_policy:
        return Check(NOT_CHECKABLE, want, None, "numa_maps is empty (no memory mapped, or the process is exiting)")
    got_mode, got_nodes = parse_policy(v.mem_policy)
    want_mode, want_nodes = parse_policy(want)
    same = got_mode == want_mode and (want_nodes is None or got_nodes == want_nodes)
    return Check(VERIFIED if same else MISMATCH, want, v.mem_policy)


def _check_allocator(pid: int, b: Binding, lib: str, v: Verification, wait_s: float, proc: str) -> Check:
    deadline = time.monotonic() + wait_s
    while True:
        if maps_contain(pid, lib, proc):
            v.allocator_loaded = True
            return Check(VERIFIED, b.allocator, lib)
        try:
            gone = _zombie(procs.status(pid, proc))
        except OSError:
            gone = True
        if gone:
            return Check(NOT_CHECKABLE, b.allocator, None, "the process exited before its maps could be read")
        if time.monotonic() > deadline:
            v.allocator_loaded = False
            return Check(MISMATCH, b.allocator, "not mapped", f"{lib} is not mapped into pid {pid}")
        time.sleep(0.005)
