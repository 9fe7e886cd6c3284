"""Admission: before tilewise changes anything of another process or of the system, check that
every change can be made (and read back), and refuse in one line otherwise.

Kubernetes' topology manager refuses a pod up front and says why; tilewise does the same for
`elastic`, `tune --apply-os`, `workload --apply-os`, `restore`, the binding of `exec`/`up` and the
weighted-interleave weights of `exec`/`bench` (``binding.admit_weights``):
nothing is journaled or changed when a check fails, and the one `Error:` line names the target,
its owner, what is missing and the way out.

The rules are the kernel's (Linux 6.x):

- **CPU affinity** of a task (``sched_setaffinity``): the caller's effective uid equals the
  task's real or effective uid (kernel/sched/syscalls.c, ``check_same_owner``) and the task's
  permitted capabilities are a subset of the caller's (security/commoncap.c, ``cap_safe_nice``:
  a setuid program started by the user is not theirs to re-bind), or the caller has
  CAP_SYS_NICE. Kernel threads cannot be moved at all. Reading a mask needs nothing.
- **cgroup files** (``cpuset.cpus``, ``cgroup.procs``, ``cgroup.subtree_control``, a new group
  directory): ordinary file permissions. That is how delegation works: systemd (``Delegate=yes``)
  chowns a unit's group directory and its ``cgroup.procs``, ``cgroup.threads`` and
  ``cgroup.subtree_control`` to the user, never the group's own ``cpuset.cpus`` (that is the
  parent's resource control): a user constrains child groups of a delegated group, not the
  delegated group itself. On v2, moving a process also needs write access to ``cgroup.procs`` of
  the common ancestor of its old and new group; on v1 the caller's euid must be root or equal the
  task's real or saved uid.
- **sysfs and procfs switches** (THP, AutoNUMA, weighted-interleave weights): writable files, which
  means root (and a /sys that is not mounted read-only).
- **A whole machine**: pid 1, kthreadd, a systemd manager (system or user instance) or a
  container's init has every process of the machine (or of the user, or of the container) in its
  tree; `elastic` refuses such a target unless ``--whole-machine`` says it is meant.

Decisions are pure functions of facts (``Caller``, ``Proc``, ``Access``); the facts are read at
the edge (``caller()``, ``process()``, ``access()``) through an injectable /proc root, so every
decision is tested without root.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tilewise import procs
from tilewise.errors import UsageError

CAP_SYS_NICE = 23
PF_KTHREAD = 0x00200000
DELEGATE_HINT = ("run as root, or on a group delegated to you: systemd-run --user -p Delegate=yes --scope CMD, "
                 "then --cgroup a child group of it (docs/elastic.md, 'Without root')")


def user_name(uid: int | None) -> str:
    if uid is None:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


# ---- facts -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Caller:
    """Who is asking: real and effective uid and the effective capabilities."""

    uid: int
    euid: int
    caps: frozenset[int] = frozenset()  # effective
    permitted: frozenset[int] | None = None  # None: the same as caps

    def has(self, cap: int) -> bool:
        return cap in self.caps

    @property
    def name(self) -> str:
        return user_name(self.euid)

    @property
    def root(self) -> bool:
        return self.euid == 0


@dataclass(frozen=True)
class Proc:
    """One target process as /proc/PID/status and stat show it."""

    pid: int
    name: str  # comm
    uid: int  # real
    euid: int
    suid: int
    ppid: int = 0
    ns_pid: int | None = None  # its pid in its own (innermost) pid namespace
    kernel: bool = False  # a kernel thread
    cap_prm: frozenset[int] = frozenset()  # its permitted capabilities

    @property
    def owner(self) -> str:
        return user_name(self.uid) if self.uid == self.euid else f"{user_name(self.uid)} (euid {user_name(self.euid)})"

    def label(self) -> str:
        return f"pid {self.pid} ({self.name})"


@dataclass(frozen=True)
class Access:
    """A file or directory a change writes: whether this caller may write it, and its owner."""

    path: str
    writable: bool
    owner: int | None = None  # None: it does not exist
    read_only_fs: bool = False

    @property
    def exists(self) -> bool:
        return self.owner is not None


# ---- verdicts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """Why one change cannot be made: what, whose, what is missing, the way out."""

    action: str  # "change the CPUs of", "write", ...
    target: str
    owner: str
    missing: str
    way_out: str

    def line(self) -> str:
        return f"cannot {self.action} {self.target} (owned by {self.owner}): {self.missing}"


class Refused(UsageError):
    """Admission refused: nothing was journaled or changed. Exit 2, as a request this user may
    not make (as `tune --apply-os` without root always exited)."""

    def __init__(self, refusals: Sequence[Refusal]):
        self.refusals = list(refusals)
        first = self.refusals[0]
        extra = f" (and {len(self.refusals) - 1} more)" if len(self.refusals) > 1 else ""
        super().__init__(f"{first.line()}{extra}; nothing was changed", first.way_out)


def check(refusals: Iterable[Refusal | None]) -> None:
    """Raise Refused for the first refusals, if any."""
    got = [r for r in refusals if r is not None]
    if got:
        raise Refused(got)


def whole_machine(p: Proc) -> str | None:
    """Why p's process tree covers the whole machine (or a whole user or container), or None."""
    if p.pid == 1:
        return "pid 1 is init: its tree is every process on the machine"
    if p.name == "kthreadd" or (p.kernel and p.ppid == 0):
        return f"{p.label()} is the kernel's thread manager: its tree is every kernel thread"
    if p.name == "systemd":
        return f"{p.label()} is a systemd manager: its tree is every service it runs"
    if p.ns_pid == 1:
        return f"{p.label()} is the init of a container (pid 1 in its pid namespace): its tree is the whole container"
    return None


def whole_machine_refusal(p: Proc) -> Refusal | None:
    why = whole_machine(p)
    if why is None:
        return None
    return Refusal("control", p.label(), p.owner, why,
                   "give the pid of the database's own process (e.g. the postmaster), or add --whole-machine "
                   "if you mean every process under it")


def may_set_affinity(caller: Caller, p: Proc) -> str | None:
    """None when caller may change p's CPU affinity, else what is missing."""
    if p.kernel:
        return "it is a kernel thread: its CPUs are the kernel's to set"
    if caller.has(CAP_SYS_NICE):
        return None
    if caller.euid not in (p.uid, p.euid):
        return f"it is not your process ({caller.name}) and you lack CAP_SYS_NICE"
    mine = caller.caps if caller.permitted is None else caller.permitted
    if not p.cap_prm <= mine:  # security/commoncap.c cap_safe_nice
        return ("it holds capabilities you lack (a setuid program, or a service started with capabilities) "
                "and you lack CAP_SYS_NICE")
    return None


def affinity_way_out(p: Proc) -> str:
    owner = user_name(p.uid)
    if p.uid == 0:
        return "run tilewise as root (sudo tilewise ...)"
    return f"run tilewise as {owner} (sudo -u {owner} tilewise ...) or as root"


def affinity_refusals(caller: Caller, procs: Iterable[Proc]) -> list[Refusal]:
    """One refusal per owner whose processes caller may not re-bind (the first pid named, with a count)."""
    by_owner: dict[str, list[tuple[Proc, str]]] = {}
    for p in procs:
        why = may_set_affinity(caller, p)
        if why is not None:
            by_owner.setdefault(p.owner, []).append((p, why))
    out = []
    for owner, denied in by_owner.items():
        p, why = denied[0]
        target = p.label() if len(denied) == 1 else f"{p.label()} and {len(denied) - 1} other process(es)"
        out.append(Refusal("change the CPUs of", target, owner, why, affinity_way_out(p)))
    return out


def may_move_v1(caller: Caller, p: Proc) -> str | None:
    """cgroup v1 (__cgroup1_procs_write): root, or the caller's euid is the task's real or saved uid."""
    if caller.root or caller.euid in (p.uid, p.suid):
        return None
    return f"moving another user's process between v1 cgroups needs root (you are {caller.name})"


def write_refusal(caller: Caller, a: Access, what: str, way_out: str) -> Refusal | None:
    """None when a can be written. A missing file is not refused here: reading it first fails
    with its own message ("refusing to change ...: cannot read it")."""
    if a.writable or not a.exists:
        return None
    if a.read_only_fs:
        missing = "it is on a read-only file system"
    elif caller.root:
        missing = "root may not write it here (a container's read-only or unprivileged mount?)"
    else:
        missing = f"you ({caller.name}) may not write it"
    if a.path in what:
        target = what
    elif what.endswith(" of"):  # "cpuset.cpus of" + the group the file belongs to
        target = f"{what} {os.path.dirname(a.path)}"
    else:
        target = f"{what} {a.path}"
    return Refusal("write", target, user_name(a.owner), missing, way_out)


def switch_refusals(caller: Caller, files: Iterable[tuple[str, Access]]) -> list[Refusal]:
    """OS switches: each file (description, access) must be writable."""
    out = []
    for what, a in files:
        r = write_refusal(caller, a, what, "re-run as root (sudo tilewise ...), or drop --apply-os")
        if r is not None:
            out.append(r)
    return out


@dataclass
class CgroupNeeds:
    """What one cgroup enforcement plan writes: files/directories and process moves."""

    files: list[tuple[str, Access]] = field(default_factory=list)  # (what, access)
    moves_v1: list[Proc] = field(default_factory=list)


def cgroup_refusals(caller: Caller, needs: CgroupNeeds, way_out: str = DELEGATE_HINT) -> list[Refusal]:
    out = []
    for what, a in needs.files:
        r = write_refusal(caller, a, what, way_out)
        if r is not None:
            out.append(r)
    for p in needs.moves_v1:
        why = may_move_v1(caller, p)
        if why is not None:
            out.append(Refusal("move", p.label(), p.owner, why, way_out))
    return out


# ---- facts, read at the edge ---------------------------------------------------------------------

def parse_caps(hexmask: str) -> frozenset[int]:
    try:
        mask = int(hexmask, 16)
    except ValueError:
        return frozenset()
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def caller(proc: str = "/proc") -> Caller:
    """This process: uids, effective and permitted capabilities (/proc/self/status)."""
    caps: dict[str, frozenset[int]] = {}
    try:
        with open(f"{proc}/self/status") as f:
            for line in f:
                if line.startswith(("CapEff:", "CapPrm:")):
                    caps[line[:6]] = parse_caps(line.split()[1])
    except OSError:
        pass
    return Caller(os.getuid(), os.geteuid(), caps.get("CapEff", frozenset()), caps.get("CapPrm", frozenset()))


def parse_process(pid: int, status_text: str, stat_text: str | None = None) -> Proc | None:
    """A Proc from /proc/PID/status (and stat, for the kernel-thread flag); None if malformed."""
    st: dict[str, str] = {}
    for line in status_text.splitlines():
        k, _, v = line.partition(":")
        st[k] = v.strip()
    try:
        uids = [int(x) for x in st["Uid"].split()]
        ppid = int(st.get("PPid", "0") or 0)
    except (KeyError, ValueError):
        return None
    ns = st.get("NSpid", "").split()
    kernel = False
    if stat_text:
        try:
            kernel = bool(int(procs.stat_fields(stat_text)[procs.FLAGS]) & PF_KTHREAD)
        except (IndexError, ValueError):
            pass
    return Proc(pid, st.get("Name", "?"), uids[0], uids[1], uids[2], ppid,
                int(ns[-1]) if ns and ns[-1].isdigit() else None, kernel, parse_caps(st.get("CapPrm", "0")))


def process(pid: int, proc: str = "/proc") -> Proc | None:
    """Facts about one process; None when it is gone (or hidden from us)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            status_text = f.read()
    except OSError:
        return None
    try:
        with open(f"{proc}/{pid}/stat") as f:
            stat_text = f.read()
    except OSError:
        stat_text = None
    return parse_process(pid, status_text, stat_text)


def processes(pids: Iterable[int], proc: str = "/proc") -> list[Proc]:
    return [p for p in (process(pid, proc) for pid in sorted(set(pids))) if p is not None]


def access(path: str) -> Access:
    """May this process write path (a file, or a directory to create entries in)?"""
    try:
        st = os.stat(path)
    except OSError:
        return Access(path, False, None)
    writable = os.access(path, os.W_OK | (os.X_OK if os.path.isdir(path) else 0), effective_ids=True) \
        if os.access in os.supports_effective_ids else os.access(path, os.W_OK)
    ro = False
    if not writable:
        try:
            ro = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError:
            pass
    return Access(path, writable, st.st_uid, ro)


__all__ = ["Access", "CAP_SYS_NICE", "Caller", "CgroupNeeds", "Proc", "Refusal", "Refused", "access",
           "affinity_refusals", "caller", "cgroup_refusals", "check", "may_set_affinity", "process", "processes",
           "switch_refusals", "whole_machine", "whole_machine_refusal"]
