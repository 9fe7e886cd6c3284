"""Launcher: the edge where plans touch processes. Bind, start, verify, supervise, clean up.

A child is bound before it execs (``preexec_fn``): CPU affinity with sched_setaffinity and the
memory policy with the set_mempolicy syscall. Both are inherited by everything it spawns (threads,
Spark executors), and DuckDB, DataFusion and Java size their thread pools from the affinity mask.
An allocator is preloaded with LD_PRELOAD. After start, /proc/PID is read back to verify it all.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from tilewise import allocators, cpulist
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MODE_OF = {"first-touch": MPOL_DEFAULT, "preferred": MPOL_PREFERRED, "membind": MPOL_BIND,
           "interleave": MPOL_INTERLEAVE, "local": MPOL_LOCAL}
# How /proc/PID/numa_maps names each policy (kernel mpol_to_str)
NUMA_MAPS_NAME = {"first-touch": "default", "preferred": "prefer", "membind": "bind",
                  "interleave": "interleave", "local": "local"}
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 258, "s390x": 237}.get(platform.machine(), 238)
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


class LaunchError(TilewiseError):
    pass


@dataclass(frozen=True)
class Binding:
    cpus: tuple[int, ...] | None  # None: leave affinity alone
    mem_policy: str = "first-touch"
    mem_nodes: tuple[int, ...] = ()
    allocator: str = "system"

    @classmethod
    def from_instance(cls, inst: Instance, allocator: str = "system") -> Binding:
        return cls(tuple(inst.cpus), inst.mem_policy, tuple(inst.mem_nodes), allocator)

    def describe(self) -> str:
        cpus = cpulist.format(self.cpus) if self.cpus is not None else "unchanged"
        mem = self.mem_policy + (f":{cpulist.format(self.mem_nodes)}" if self.mem_nodes and self.mem_policy not in ("first-touch", "local") else "")
        return f"cpus {cpus}, memory {mem}, allocator {self.allocator}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["cpus"] = list(self.cpus) if self.cpus is not None else None
        d["mem_nodes"] = list(self.mem_nodes)
        return d


# ---- applying a binding (in the child, before exec) ----------------------------------------

def set_mempolicy(policy: str, nodes: Sequence[int]) -> None:
    mode = MODE_OF[policy]
    if mode in (MPOL_DEFAULT, MPOL_LOCAL):
        res = _libc.syscall(SYS_SET_MEMPOLICY, mode, None, ctypes.c_ulong(0))
    else:
        if not nodes:
            raise OSError(22, f"memory policy {policy} needs at least one node")
        nbits = max(nodes) + 1
        words = (nbits + 63) // 64
        mask = (ctypes.c_ulong * words)()
        for n in nodes:
            mask[n // 64] |= 1 << (n % 64)
        res = _libc.syscall(SYS_SET_MEMPOLICY, mode, mask, ctypes.c_ulong(words * 64 + 1))
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy({policy}, {cpulist.format(nodes)}): {os.strerror(err)}")


def apply_to_self(b: Binding) -> None:
    """Bind the calling process (used in children before exec, and by tests)."""
    if b.cpus is not None:
        os.sched_setaffinity(0, b.cpus)
    set_mempolicy(b.mem_policy, b.mem_nodes)


def child_env(b: Binding, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    lib = allocators.find_library(b.allocator)
    if lib:
        prev = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = lib + ((":" + prev) if prev else "")
    return env


def _preexec(b: Binding, die_with_parent: bool) -> Callable[[], None]:
    def fn() -> None:
        if die_with_parent:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        apply_to_self(b)
    return fn


# ---- reading back what a process got -----------------------------------------------------------

@dataclass
class Verification:
    pid: int
    ok: bool
    cpus: tuple[int, ...] = ()
    mems_allowed: tuple[int, ...] = ()
    mem_policy: str = ""
    allocator_loaded: bool | None = None  # None: not checked (system allocator, or exited too soon)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["cpus"] = cpulist.format(self.cpus)
        d["mems_allowed"] = cpulist.format(self.mems_allowed)
        return d


def read_status(pid: int, proc: str = "/proc") -> dict[str, str]:
    out = {}
    with open(f"{proc}/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def read_task_policy(pid: int, proc: str = "/proc") -> str:
    """The process's memory policy as numa_maps prints it for mappings without their own policy."""
    try:
        with open(f"{proc}/{pid}/numa_maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    return parts[1]
    except OSError:
        pass
    return ""


def maps_contain(pid: int, path: str, proc: str = "/proc") -> bool:
    base = os.path.basename(path)
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any(line.rstrip().endswith(path) or line.rstrip().endswith("/" + base) for line in f)
    except OSError:
        return False


def _expected_policy(b: Binding) -> str:
    name = NUMA_MAPS_NAME[b.mem_policy]
    if b.mem_policy in ("first-touch", "local"):
        return name
    return f"{name}:{cpulist.format(b.mem_nodes)}"


def verify(pid: int, b: Binding, *, allocator_wait_s: float = 0.5, proc: str = "/proc") -> Verification:
    """Compare what /proc/PID shows with the binding; every mismatch becomes a problem line."""
    v = Verification(pid, True)
    try:
        st = read_status(pid, proc)
    except OSError:
        v.ok = False
        v.problems.append(f"pid {pid} vanished before its binding could be read")
        return v
    v.cpus = cpulist.parse(st.get("Cpus_allowed_list", ""), what="Cpus_allowed_list", allow_empty=True)
    v.mems_allowed = cpulist.parse(st.get("Mems_allowed_list", ""), what="Mems_allowed_list", allow_empty=True)
    zombie = st.get("State", "").startswith("Z")
    if b.cpus is not None and tuple(sorted(b.cpus)) != v.cpus:
        v.problems.append(f"cpus: wanted {cpulist.format(b.cpus)}, process has {cpulist.format(v.cpus)}")
    missing = [n for n in b.mem_nodes if n not in v.mems_allowed]
    if b.mem_policy != "first-touch" and missing:
        v.problems.append(f"memory nodes {cpulist.format(missing)} are not in Mems_allowed_list {cpulist.format(v.mems_allowed)}")
    if not zombie:
        v.mem_policy = read_task_policy(pid, proc)
        want = _expected_policy(b)
        got = v.mem_policy.split("=")[0]  # drop flags like =static
        if v.mem_policy and got != want:
            v.problems.append(f"memory policy: wanted {want}, process has {v.mem_policy}")
    lib = allocators.find_library(b.allocator)
    if lib:
        deadline = time.monotonic() + allocator_wait_s
        while True:
            if maps_contain(pid, lib, proc):
                v.allocator_loaded = True
                break
            alive = os.path.exists(f"{proc}/{pid}/maps") and not read_status(pid, proc).get("State", "").startswith("Z")
            if not alive:
                v.allocator_loaded = None  # exited before the loader's maps could be read
                break
            if time.monotonic() > deadline:
                v.allocator_loaded = False
                v.problems.append(f"allocator {b.allocator} ({lib}) is not mapped into pid {pid}")
                break
            time.sleep(0.005)
    v.ok = not v.problems
    return v


# ---- is this plan runnable here? ----------------------------------------------------------------

def ensure_runnable(p: Plan, live_fingerprint: str | None = None) -> None:
    """A plan made on a loaded topology that is not this machine can be shown, not executed."""
    from tilewise import topology

    live = topology.load(None)
    fp = live_fingerprint or live.fingerprint()
    if p.topology_fingerprint != fp:
        raise UsageError(
            f"the plan's topology ({p.topology_source}) is not this machine ({live.summary()}): "
            "it can be planned but not executed here",
            "drop --topology, or use a file exported here with `tilewise topo --export`",
        )
    allowed = set(os.sched_getaffinity(0))
    for inst in p.instances:
        bad = [c for c in inst.cpus if c not in allowed]
        if bad:
            raise UsageError(f"instance {inst.id} wants CPUs {cpulist.format(bad)}, which this process may not use",
                             f"allowed CPUs are {cpulist.format(allowed)}")


# ---- starting and supervising ------------------------------------------------------------------

@dataclass
class Started:
    name: str
    proc: subprocess.Popen
    binding: Binding
    verification: Verification | None

    @property
    def pid(self) -> int:
        return self.proc.pid


def spawn(argv: Sequence[str], b: Binding, *, env: dict | None = None, die_with_parent: bool = True,
          new_session: bool = True, **popen_kwargs) -> subprocess.Popen:
    """Start argv bound. In its own session by default, so its whole tree can be signalled."""
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. tilewise exec ... -- python3 -c 'print(1)'")
    try:
        return subprocess.Popen(
            list(argv), env=child_env(b, env), preexec_fn=_preexec(b, die_with_parent),
            start_new_session=new_session, **popen_kwargs,
        )
    except subprocess.SubprocessError as e:  # raised when preexec_fn failed in the child
        raise LaunchError(f"could not bind {argv[0]} ({b.describe()}): {e}",
                          "check the CPUs and NUMA nodes exist here (tilewise topo)") from None
    except FileNotFoundError:
        raise UsageError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise UsageError(f"permission denied running {argv[0]}") from None


def kill_tree(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM the process group (or the process), wait, then SIGKILL; always reap."""
    if proc.poll() is not None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        proc.poll()
        return
    group = pgid == proc.pid  # its own group: signal the whole tree
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            if group:
                os.killpg(pgid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if group:  # stragglers in the group (grandchildren) go too
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Supervisor:
    """Owns bound children; stops them all (whole trees) on exit, error or Ctrl-C."""

    def __init__(self) -> None:
        self.children: list[Started] = []

    def start(self, name: str, argv: Sequence[str], b: Binding, *, verify_binding: bool = True,
              die_with_parent: bool = True, **popen_kwargs) -> Started:
        proc = spawn(argv, b, die_with_parent=die_with_parent, **popen_kwargs)
        s = Started(name, proc, b, None)
        self.children.append(s)
        if verify_binding:
            s.verification = verify(proc.pid, b)
            if not s.verification.ok:
                raise LaunchError(f"{name}: binding not applied: " + "; ".join(s.verification.problems))
        return s

    def check(self) -> list[tuple[Started, int]]:
        """Children that exited, with their return codes (a crashed instance is reported, not hung on)."""
        return [(s, rc) for s in self.children if (rc := s.proc.poll()) is not None]

    def stop_all(self, timeout: float = 5.0) -> None:
        for s in reversed(self.children):
            kill_tree(s.proc, timeout)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
