"""Launcher: the one edge where tilewise touches processes. Bind, start, verify, supervise, stop.

Starting: every child runs in its own session (so its own process group), bound before it execs
(``preexec_fn``): CPU affinity with sched_setaffinity and the memory policy with the
set_mempolicy syscall. Both are inherited by everything it spawns (threads, Spark executors), and
DuckDB, DataFusion and Java size their thread pools from the affinity mask. An allocator is
preloaded with LD_PRELOAD. Every child also carries a token in ``TILEWISE_SPAWN`` that its
descendants inherit, so they can be found after they left the group or lost their parent.

Verifying: /proc/PID is read back item by item (cpus, memory policy, allocator); each item is
verified, a mismatch, or not checkable (with the reason). Nothing is called verified that was not
read back.

Stopping (``stop``), as systemd's KillMode=control-group: take the set of processes (the group,
every descendant, every process carrying the token) BEFORE signalling; SIGTERM the group and the
strays that left it; wait a grace period; SIGKILL what is left; then check again and report what
was stopped and what survived. Processes are named by (pid, start time), never by pid alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from tilewise import allocators, changes, cpulist, procs, signals
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan
from tilewise.procs import ProcId

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_WEIGHTED_INTERLEAVE = 6  # Linux 6.9+: interleave by the weights in WEIGHTED_INTERLEAVE_SYSFS
MODE_OF = {"first-touch": MPOL_DEFAULT, "preferred": MPOL_PREFERRED, "membind": MPOL_BIND,
           "interleave": MPOL_INTERLEAVE, "local": MPOL_LOCAL, "weighted-interleave": MPOL_WEIGHTED_INTERLEAVE}
NEEDS_NODES = ("preferred", "membind", "interleave", "weighted-interleave")
# How /proc/PID/numa_maps names each policy (kernel mpol_to_str)
NUMA_MAPS_NAME = {"first-touch": "default", "preferred": "prefer", "membind": "bind",
                  "interleave": "interleave", "local": "local", "weighted-interleave": "weighted interleave"}
WEIGHTED_INTERLEAVE_SYSFS = "/sys/kernel/mm/mempolicy/weighted_interleave"
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 258, "s390x": 237}.get(platform.machine(), 238)
PR_SET_PDEATHSIG = 1
SPAWN_VAR = "TILEWISE_SPAWN"  # colon-separated tokens of every tilewise spawn a process descends from
GRACE_S = 5.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the kernel to finish them

_libc = ctypes.CDLL(None, use_errno=True)


class LaunchError(TilewiseError):
    pass


class CommandNotFound(LaunchError):
    exit_code = 127  # as shells


class NotExecutable(LaunchError):
    exit_code = 126  # as shells


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
        return f"OS cpus {cpus}, memory {mem}, allocator {self.allocator}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["cpus"] = list(self.cpus) if self.cpus is not None else None
        d["mem_nodes"] = list(self.mem_nodes)
        return d


def check_binding(b: Binding, proc: str = "/proc") -> None:
    """Reject, before anything is started, a binding that cannot be applied here (one line)."""
    if b.mem_policy not in MODE_OF:
        raise UsageError(f"unknown memory policy {b.mem_policy!r}", f"choose one of {', '.join(MODE_OF)}")
    if b.mem_policy in NEEDS_NODES and not b.mem_nodes:
        raise UsageError(f"memory policy {b.mem_policy} needs at least one NUMA node", "e.g. --mem-nodes 0")
    if b.cpus is not None and not b.cpus:
        raise UsageError("the binding has an empty CPU list", "give at least one CPU")
    if b.mem_policy in NEEDS_NODES:
        try:
            st = read_status("self", proc)
            allowed = cpulist.parse(st.get("Mems_allowed_list", ""), what="Mems_allowed_list", allow_empty=True)
        except OSError:
            allowed = ()
        bad = [n for n in b.mem_nodes if allowed and n not in allowed]
        if bad:
            raise UsageError(f"memory node(s) {cpulist.format(bad)} cannot be used here",
                             f"this process may use nodes {cpulist.format(allowed)} (tilewise topo)")
    allocators.get(b.allocator)


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
        try:
            os.sched_setaffinity(0, b.cpus)
        except OSError as e:
            raise OSError(e.errno, f"sched_setaffinity({cpulist.format(b.cpus)}): {e.strerror}") from None
    set_mempolicy(b.mem_policy, b.mem_nodes)


def child_env(b: Binding, base: dict | None = None, token: str | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    lib = allocators.find_library(b.allocator)
    if lib:
        prev = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = lib + ((":" + prev) if prev else "")
    if token:
        prev = env.get(SPAWN_VAR, "")
        env[SPAWN_VAR] = (prev + ":" if prev else "") + token
    return env


def _preexec(b: Binding, die_with_parent: bool, err_fd: int) -> Callable[[], None]:
    def fn() -> None:
        if die_with_parent:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            apply_to_self(b)
        except OSError as e:  # tell the parent exactly what failed (subprocess only says "preexec_fn")
            os.write(err_fd, (e.strerror or str(e)).encode()[:500])
            raise
    return fn


# ---- reading back what a process got -----------------------------------------------------------

VERIFIED, MISMATCH, NOT_CHECKABLE = "verified", "mismatch", "not checkable"


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
        return {VERIFIED: True, MISMATCH: False}.get(self.state)

    def summary(self) -> str:
        parts = [f"{k} {c.describe()}" for k, c in self.checks.items()]
        return "; ".join(parts + self.notes)

    def to_json(self) -> dict:
        return {"pid": self.pid, "state": self.state, "verified": self.verified, "ok": self.ok,
                "checks": {k: asdict(c) for k, c in self.checks.items()},
                "cpus": cpulist.format(self.cpus), "mems_allowed": cpulist.format(self.mems_allowed),
                "mem_policy": self.mem_policy, "allocator_loaded": self.allocator_loaded,
                "problems": self.problems, "notes": self.notes}


def read_status(pid, proc: str = "/proc") -> dict[str, str]:
    out = {}
    with open(f"{proc}/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


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
    """The policy column of a numa_maps line; Linux 6.9+ writes "weighted interleave:0-1" (two words)."""
    return f"{parts[1]} {parts[2]}" if parts[1] == "weighted" and len(parts) >= 3 else parts[1]


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


def _expected_policy(b: Binding) -> str:
    name = NUMA_MAPS_NAME.get(b.mem_policy, b.mem_policy)
    if b.mem_policy in ("first-touch", "local"):
        return name
    return f"{name}:{cpulist.format(b.mem_nodes)}"


def _zombie(st: dict) -> bool:
    return st.get("State", "").startswith(("Z", "X"))


def verify(pid: int, b: Binding, *, allocator_wait_s: float = 0.5, proc: str = "/proc") -> Verification:
    """Read back what /proc/PID shows, item by item: verified, mismatch, or not checkable."""
    v = Verification(pid)
    want_mem = _expected_policy(b)
    lib = allocators.find_library(b.allocator)
    try:
        st = read_status(pid, proc)
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
    return v


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
            gone = _zombie(read_status(pid, proc))
        except OSError:
            gone = True
        if gone:
            return Check(NOT_CHECKABLE, b.allocator, None, "the process exited before its maps could be read")
        if time.monotonic() > deadline:
            v.allocator_loaded = False
            return Check(MISMATCH, b.allocator, "not mapped", f"{lib} is not mapped into pid {pid}")
        time.sleep(0.005)


# ---- is this plan runnable here? ----------------------------------------------------------------

def weighted_interleave_supported(sysfs: str = WEIGHTED_INTERLEAVE_SYSFS) -> bool:
    """Linux 6.9+ has MPOL_WEIGHTED_INTERLEAVE, and with it this sysfs directory of node weights."""
    return os.path.isdir(sysfs)


def ensure_mem_policy_supported(p: Plan, sysfs: str = WEIGHTED_INTERLEAVE_SYSFS) -> None:
    if any(i.mem_policy == "weighted-interleave" for i in p.instances) and not weighted_interleave_supported(sysfs):
        raise TilewiseError(
            f"memory policy weighted-interleave is not supported by this kernel (Linux {platform.release()}; "
            "MPOL_WEIGHTED_INTERLEAVE needs 6.9 or later)",
            "use --mem interleave (equal weights)",
        )


def ensure_runnable(p: Plan, live_fingerprint: str | None = None) -> None:
    """A plan made on a loaded topology that is not this machine can be shown, not executed."""
    from tilewise import topology

    ensure_mem_policy_supported(p)
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


# ---- starting ------------------------------------------------------------------------------------

class Child(subprocess.Popen):
    """A started process: a Popen, plus its identity and the token its descendants carry."""

    ident: ProcId
    token: str

    def tree(self) -> Tree:
        return Tree(self.ident, self.token, popen=self)


def journal_start(session: changes.Session, argv: Sequence[str]) -> str:
    """Journal a process about to be started (by the token it will carry), before it exists, so
    that if tilewise is killed hard, `tilewise restore` stops what it left running. Returns the
    token to pass to spawn."""
    token = uuid.uuid4().hex[:16]
    session.record(changes.StartedProcess(token=token, var=SPAWN_VAR, name=os.path.basename(argv[0]) if argv else ""),
                   "state", "stopped", "running", lock=False)
    return token


def spawn(argv: Sequence[str], b: Binding, *, env: dict | None = None, die_with_parent: bool = True,
          new_session: bool = True, journal: changes.Session | None = None, token: str | None = None,
          **popen_kwargs) -> Child:
    """Start argv bound, in a session (and process group) of its own, carrying a token (fresh, or
    the one journal_start returned). journal: record the start there first (see journal_start).
    (new_session is accepted for old callers; it must stay True.)"""
    if not new_session:
        raise ValueError("every child gets a session of its own: new_session=False is not supported")
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. tilewise exec ... -- python3 -c 'print(1)'")
    check_binding(b)
    if journal is not None and token is None:
        token = journal_start(journal, argv)
    token = token or uuid.uuid4().hex[:16]
    r, w = os.pipe()
    try:
        child = Child(list(argv), env=child_env(b, env, token), preexec_fn=_preexec(b, die_with_parent, w),
                      start_new_session=True, **popen_kwargs)
    except subprocess.SubprocessError:  # preexec_fn failed in the child: it wrote why
        os.close(w)
        w = -1
        why = os.read(r, 600).decode(errors="replace") or "unknown error"
        raise LaunchError(f"could not bind {argv[0]} ({b.describe()}): {why}",
                          "check the CPUs and NUMA nodes exist and are allowed here (tilewise topo)") from None
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {argv[0]}", "check the name and PATH") from None
    except PermissionError:
        raise NotExecutable(f"permission denied running {argv[0]} (not executable?)") from None
    except OSError as e:
        if e.errno in (errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR):
            raise NotExecutable(f"cannot execute {argv[0]}: {e.strerror}") from None
        raise
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    child.token = token
    child.ident = ProcId.of(child.pid) or ProcId(child.pid, -1)
    return child


# ---- stopping ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tree:
    """Everything that belongs to one started process: its group, its descendants, and every
    process whose environment carries its token (var)."""

    leader: ProcId | None  # None: only the processes carrying the token
    token: str | None = None
    var: str = SPAWN_VAR
    popen: subprocess.Popen | None = field(default=None, compare=False, hash=False)

    def group_is_ours(self, proc: str = "/proc") -> bool:
        """Whether signalling process group <leader pid> can only reach our processes: the leader (a
        session leader) still exists, zombie included, so its pid cannot have been reused."""
        if self.leader is None:
            return False
        if self.popen is not None and self.popen.returncode is None:
            return True
        return self.leader.exists(proc)


@dataclass
class StopReport:
    stopped: list[dict] = field(default_factory=list)  # {"pid", "start", "name", "by"}
    survived: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.survived

    def extend(self, other: StopReport) -> StopReport:
        self.stopped += other.stopped
        self.survived += other.survived
        return self

    def summary(self) -> str:
        def names(items):
            shown = ", ".join(f"{p['pid']} ({p['name']})" for p in items[:6])
            return shown + (f" and {len(items) - 6} more" if len(items) > 6 else "")
        parts = []
        if self.stopped:
            parts.append(f"stopped {len(self.stopped)} process{'es' if len(self.stopped) != 1 else ''}: {names(self.stopped)}")
        if self.survived:
            parts.append(f"could not stop {len(self.survived)}: {names(self.survived)}")
        return "; ".join(parts) or "nothing was left running"

    def to_json(self) -> dict:
        return {"stopped": self.stopped, "survived": self.survived, "ok": self.ok}


def _members(trees: Sequence[Tree], proc: str) -> dict[ProcId, procs.Stat]:
    """The live processes of the trees now: groups, token carriers, and all their descendants."""
    table = procs.scan(proc)
    me = os.getpid()
    roots: set[int] = set()
    tokens: dict[str, set[str]] = {}
    for t in trees:
        st = table.get(t.leader.pid) if t.leader else None
        if st is not None and st.start == t.leader.start:
            roots.add(t.leader.pid)
        if t.group_is_ours(proc):
            roots.update(p for p, s in table.items() if s.pgrp == t.leader.pid)
        if t.token:
            tokens.setdefault(t.var, set()).add(t.token)
    for var, toks in tokens.items():
        for pids in procs.carrying(var, toks, table, proc).values():
            roots |= pids
    found = roots | procs.descendants(roots, table)
    out = {}
    for pid in found:
        st = table.get(pid)
        if st is not None and pid != me and st.state not in "ZX":
            out[st.id] = st
    return out


def _signal(pid_id: ProcId, sig: int, proc: str) -> None:
    """Signal exactly this process: a pidfd pins it, then its start time is checked."""
    try:
        fd = os.pidfd_open(pid_id.pid)
    except (ProcessLookupError, AttributeError, OSError):
        if pid_id.alive(proc):  # no pidfd support: check, then signal (a tiny window remains)
            try:
                os.kill(pid_id.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return
    try:
        if procs.start_time(pid_id.pid, proc) == pid_id.start:
            signal.pidfd_send_signal(fd, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        os.close(fd)


def _reap(trees: Sequence[Tree]) -> None:
    for t in trees:
        if t.popen is not None:
            t.popen.poll()


def _forget_if_stopped(session: changes.Session | None, rep: StopReport) -> None:
    """Everything journaled was stopped and checked: drop the journal. Otherwise it stays for
    `tilewise restore`."""
    if session is not None and rep.ok:
        session.commit()


def stop(trees, grace: float = GRACE_S, *, kill_wait: float = KILL_WAIT_S, proc: str = "/proc") -> StopReport:
    """Stop one or more process trees (Tree, Child/Started, or a list of them); never raises.

    Takes the set of processes first, then SIGTERMs each group (where the group's pid is still
    ours) and every process of the set outside it, waits up to `grace` seconds, SIGKILLs what is
    left (and what was forked meanwhile), then checks. Reaps the Popen leaders.
    """
    if not isinstance(trees, (list, tuple)):
        trees = [trees]
    trees = [_as_tree(t, proc) for t in trees]
    with signals.deferred():  # a second Ctrl-C or SIGTERM cannot abort a stop half way
        return _stop(trees, grace, kill_wait, proc)


def _as_tree(t, proc: str) -> Tree:
    if isinstance(t, Tree):
        return t
    if hasattr(t, "tree"):
        return t.tree()
    if isinstance(t, subprocess.Popen):  # started elsewhere, in a session of its own
        return Tree(ProcId.of(t.pid, proc) if t.returncode is None else None, None, popen=t)
    raise TypeError(f"cannot stop {t!r}")


def _stop(trees: list[Tree], grace: float, kill_wait: float, proc: str) -> StopReport:
    first = _members(trees, proc)
    names = {i: s.comm for i, s in first.items()}
    by: dict[ProcId, str] = {}
    live = dict(first)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if not live:
            break
        grouped = set()
        for t in trees:
            if t.group_is_ours(proc):
                try:
                    os.killpg(t.leader.pid, sig)
                    grouped.add(t.leader.pid)
                except (ProcessLookupError, PermissionError):
                    pass
        for i, st in live.items():
            if st.pgrp not in grouped:
                _signal(i, sig, proc)
            by[i] = signal.Signals(sig).name
        deadline = time.monotonic() + wait
        next_scan = time.monotonic() + 0.2
        while True:
            _reap(trees)
            live = {i: s for i, s in live.items() if i.alive(proc)}
            if time.monotonic() >= next_scan or not live:  # newcomers (forked while dying)
                for i, s in _members(trees, proc).items():
                    if i not in live:
                        live[i] = s
                        names.setdefault(i, s.comm)
                        if i not in by:
                            _signal(i, sig, proc)
                            by[i] = signal.Signals(sig).name
                next_scan = time.monotonic() + 0.2
            if not live or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
    for t in trees:
        if t.popen is not None:
            try:
                t.popen.wait(timeout=kill_wait)
            except subprocess.TimeoutExpired:
                pass
    left = {i for i in set(first) | set(live) if i.alive(proc)} | set(_members(trees, proc))
    rep = StopReport()
    for i in sorted(set(first) | set(by) | left):
        item = {"pid": i.pid, "start": i.start, "name": names.get(i, "?"), "by": by.get(i, "exited")}
        (rep.survived if i in left else rep.stopped).append(item)
    return rep


# ---- supervising ---------------------------------------------------------------------------------

@dataclass
class Started:
    name: str
    proc: Child
    binding: Binding
    verification: Verification | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> Tree:
        return self.proc.tree()


class Supervisor:
    """Owns bound children; stops them all (whole trees) on exit, error or Ctrl-C, and says what it
    stopped only after checking (``report``). Each start is journaled first (journal=True), so
    what a tilewise killed hard leaves running, `tilewise restore` stops."""

    def __init__(self, journal: bool = True) -> None:
        self.children: list[Started] = []
        self.report = StopReport()
        self._journal = journal
        self.session: changes.Session | None = None

    def start(self, name: str, argv: Sequence[str], b: Binding, *, verify_binding: bool = True,
              die_with_parent: bool = True, **popen_kwargs) -> Started:
        if self._journal and self.session is None:
            self.session = changes.Session("processes started by this run")
        proc = spawn(argv, b, die_with_parent=die_with_parent, journal=self.session, **popen_kwargs)
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

    def stop_all(self, timeout: float = GRACE_S) -> StopReport:
        rep = stop([s.tree() for s in reversed(self.children)], grace=timeout)
        self.report.extend(rep)
        _forget_if_stopped(self.session, rep)
        if rep.ok:
            self.session = None
        return rep

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        rep = self.stop_all()
        if not rep.ok:
            msg = f"processes left running: {rep.summary()}"
            if exc_type is None:
                raise LaunchError(msg, "kill them by pid")
            print(f"tilewise: {msg}", file=sys.stderr, flush=True)


# ---- running one command in the foreground (tilewise exec) ----------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass
class Run:
    verification: Verification
    returncode: int  # Popen's: negative for a signal
    forwarded: list[int]
    leftovers: StopReport  # what the command left running when it exited, stopped and checked

    @property
    def status(self) -> int:
        """The exit status a shell would give: 128+n for a signal."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


def run_forwarding(argv: Sequence[str], b: Binding, *, grace: float = GRACE_S,
                   on_started: Callable[[Verification], None] | None = None, **popen_kwargs) -> Run:
    """Start argv bound, verify, wait; forward SIGINT/SIGTERM/SIGHUP to its process group.

    After a forwarded SIGTERM or SIGHUP the command gets `grace` seconds, then everything of it
    is killed. When it exits, whatever it left running is stopped. Main thread only.
    """
    forwarded: list[int] = []
    holder: list[Child] = []

    def forward(signum: int) -> None:
        forwarded.append(signum)
        if holder and holder[0].returncode is None:
            try:
                os.killpg(holder[0].pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    journal = changes.Session(f"exec {os.path.basename(argv[0])}")
    with signals.forwarding(forward):
        child = spawn(argv, b, journal=journal, **popen_kwargs)
        holder.append(child)
        try:
            for s in forwarded:  # arrived while it was being started
                os.killpg(child.pid, s)
            v = verify(child.pid, b)
            if not v.ok:
                raise LaunchError("binding not applied: " + "; ".join(v.problems))
            if on_started:
                on_started(v)
            kill_at = None
            while True:
                try:
                    rc = child.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if kill_at is None and any(s in STOP_SIGNALS for s in forwarded):
                    kill_at = time.monotonic() + grace
                if kill_at is not None and time.monotonic() >= kill_at:
                    stop(child, grace=0)
        except BaseException:
            _forget_if_stopped(journal, stop(child, grace))
            raise
    leftovers = stop(child, grace)
    _forget_if_stopped(journal, leftovers)
    return Run(v, rc, forwarded, leftovers)


def run(argv: Sequence[str], b: Binding | None = None, *, timeout: float | None = None,
        **popen_kwargs) -> subprocess.CompletedProcess:
    """subprocess.run through the edge: bound, own group, whole tree stopped on timeout or error.
    Raises subprocess.TimeoutExpired (after stopping it) like subprocess.run."""
    journal = changes.Session(f"run {os.path.basename(argv[0])}")
    child = spawn(argv, b or Binding(None), journal=journal, **popen_kwargs)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        _forget_if_stopped(journal, stop(child))
    return subprocess.CompletedProcess(list(argv), child.returncode, out, err)
