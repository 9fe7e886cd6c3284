"""cgroups, version 1 (the cpuset hierarchy) and version 2 (unified): where a task is, what the
files mean, and the change-and-undo targets (tilewise.changes) for what tilewise does to them.

Everything reads through an injected mountinfo and /proc root, and cgroup paths are absolute
paths under the mount point, so tests run on fake trees.

The two versions differ where it matters for handing a process its cores:

- v1: the cpuset hierarchy is separate from memory and cpu accounting, so a process can be moved
  into a child cpuset of its own without losing its other limits.
- v2: one hierarchy for every controller. Moving a process out of its group would drop the
  group's memory and CPU limits, and a group holding processes cannot have children with
  controllers ("no internal processes"; the root is exempt). So a group is constrained in place
  (its own cpuset.cpus), and only processes in the root group are moved into a child.
  The cpuset controller must be enabled (cgroup.subtree_control) on the way down; tilewise
  enables it only when asked to (``--enforce cgroup``), journaled, and undoes that unless another
  group has started using it meanwhile.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import ClassVar

from tilewise import changes, cpulist
from tilewise.changes import Gone, Target
from tilewise.procs import ProcId


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> dict:
    """{'v1': cpuset v1 mount point or None, 'v2': cgroup2 mount point or None}."""
    out = {"v1": None, "v2": None}
    try:
        text = _read(mountinfo)
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 1:
            continue
        fstype, point = rparts[0], parts[4]
        if fstype == "cgroup" and "cpuset" in (rparts[2] if len(rparts) > 2 else "").split(","):
            out["v1"] = out["v1"] or point
        elif fstype == "cgroup2":
            out["v2"] = out["v2"] or point
    return out


def task_cgroup(pid: int, version: int, proc: str = "/proc") -> str | None:
    """The task's group path relative to the hierarchy root ('/' for the root)."""
    try:
        text = _read(f"{proc}/{pid}/cgroup")
    except OSError:
        return None
    for line in text.splitlines():
        hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if version == 2 and hid == "0" and ctrls == "":
            return path
        if version == 1 and "cpuset" in ctrls.split(","):
            return path
    return None


def join(root: str, rel: str) -> str:
    return os.path.normpath(os.path.join(root, rel.lstrip("/")))


def rel_to(root: str, path: str) -> str:
    r = os.path.relpath(path, root)
    return "/" if r == "." else "/" + r


def pids_in(group: str) -> list[int]:
    return [int(x) for x in _read(os.path.join(group, "cgroup.procs")).split()]


def words(path: str) -> list[str]:
    try:
        return _read(path).split()
    except OSError:
        return []


def effective_cpus(group: str) -> tuple[int, ...]:
    for name in ("cpuset.effective_cpus", "cpuset.cpus.effective", "cpuset.cpus"):
        try:
            text = _read(os.path.join(group, name))
        except FileNotFoundError:
            continue
        cpus = cpulist.parse(text, what=name, allow_empty=True)
        if cpus:
            return cpus
    return ()


def ancestors(root: str, group: str) -> list[str]:
    """root, ..., parent of group (top down)."""
    out, cur = [], os.path.dirname(group)
    while len(cur) >= len(root):
        out.append(cur)
        if cur == root:
            break
        cur = os.path.dirname(cur)
    return list(reversed(out))


# ---- targets for the change-and-undo layer -------------------------------------------------------

@changes.kind
@dataclass(frozen=True)
class CgroupDir(Target):
    """A cpuset group tilewise creates. Value: "absent", or {"cpus": ..., "mems": ...} to create it
    with. Undoing its creation moves whatever is still inside to the parent, then removes it."""

    kind: ClassVar[str] = "cgroup-dir"
    path: str
    parent: str
    version: int

    def lock_key(self) -> str:
        return "cgroup:" + self.path

    def describe(self, key: str) -> str:
        return f"cgroup {self.path}"

    def needs(self, key: str, value) -> changes.Needs:
        return changes.Needs(writes=(self.parent, os.path.join(self.parent, "cgroup.procs")))

    def get(self, key: str):
        return {"present": True} if os.path.isdir(self.path) else "absent"

    def same(self, key: str, current, wanted) -> bool:
        return (current == "absent") == (wanted == "absent")

    def show(self, value) -> str:
        return "absent" if value == "absent" else "created"

    def set(self, key: str, value) -> None:
        if value == "absent":
            self._remove()
            return
        os.mkdir(self.path)
        if self.version == 1:  # a v1 cpuset takes tasks only once it has memory nodes and CPUs
            mems = value.get("mems")
            if mems is None:
                name = "cpuset.effective_mems" if os.path.exists(os.path.join(self.parent, "cpuset.effective_mems")) else "cpuset.mems"
                mems = _read(os.path.join(self.parent, name)).strip()
            _write(os.path.join(self.path, "cpuset.mems"), mems)
        if value.get("cpus"):
            _write(os.path.join(self.path, "cpuset.cpus"), value["cpus"])

    def _remove(self) -> None:
        procs_file = os.path.join(self.path, "cgroup.procs")
        for _ in range(100):  # move back what is left (processes born inside, late threads)
            try:
                left = [int(x) for x in _read(procs_file).split()]
            except FileNotFoundError:
                return
            if not left:
                break
            for pid in left:
                try:
                    _write(os.path.join(self.parent, "cgroup.procs"), str(pid))
                except ProcessLookupError:
                    pass
                except OSError as e:
                    if e.errno != 3:  # ESRCH: exited meanwhile
                        raise OSError(e.errno, f"cannot move pid {pid} back to {self.parent}: {e.strerror}") from None
            time.sleep(0.01)
        for i in range(200):  # exiting tasks leave the group a moment later
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if i == 199:
                    raise
                time.sleep(0.01)

    def to_json(self) -> dict:
        return {"path": self.path, "parent": self.parent, "version": self.version}


@changes.kind
@dataclass(frozen=True)
class CpusetCpus(changes.FileValue):
    """A group's cpuset.cpus (a CPU list; on v2 "" means "what the parent has")."""

    kind: ClassVar[str] = "cgroup-cpus"
    style: str = "cpulist"

    def set(self, key: str, value: str) -> None:
        try:
            super().set(key, value)
        except OSError as e:
            # the kernel (validate_change) refuses to empty the cpuset of a group with tasks (ENOSPC):
            # the nearest is the parent's CPUs, which the group had in effect before; said, not hidden
            if value != "" or e.errno != errno.ENOSPC:
                raise
            parent = os.path.dirname(os.path.dirname(self.path))
            inherit = cpulist.format(effective_cpus(parent))
            if not inherit:
                raise
            super().set(key, inherit)
            raise changes.Kept(f"the kernel does not let a group with tasks go back to an empty cpuset.cpus; "
                               f"set to {inherit}, the parent's CPUs that it had in effect before") from None


@changes.kind
@dataclass(frozen=True)
class CgroupMember(Target):
    """Which group of a hierarchy one process (pid + start time) is in. Value: the group's path
    relative to the hierarchy root. Writing it moves every thread of the process."""

    kind: ClassVar[str] = "cgroup-member"
    pid: int
    start: int
    version: int
    root: str
    proc: str = "/proc"

    def lock_key(self) -> str:
        return f"process:{self.pid}:{self.start}"

    def describe(self, key: str) -> str:
        return f"cgroup of pid {self.pid}"

    def get(self, key: str) -> str:
        if not ProcId(self.pid, self.start).alive(self.proc):
            raise Gone(f"pid {self.pid} exited")
        rel = task_cgroup(self.pid, self.version, self.proc)
        if rel is None:
            raise Gone(f"pid {self.pid} exited")
        return rel

    def needs(self, key: str, value) -> changes.Needs:
        return changes.Needs(writes=(os.path.join(join(self.root, value), "cgroup.procs"),)) \
            if ProcId(self.pid, self.start).alive(self.proc) else changes.Needs()

    def set(self, key: str, value: str) -> None:
        if not ProcId(self.pid, self.start).alive(self.proc):
            raise Gone(f"pid {self.pid} exited")
        try:
            _write(os.path.join(join(self.root, value), "cgroup.procs"), str(self.pid))
        except ProcessLookupError:
            raise Gone(f"pid {self.pid} exited") from None

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start, "version": self.version, "root": self.root, "proc": self.proc}


@changes.kind
@dataclass(frozen=True)
class CgroupController(Target):
    """Whether a v2 group hands a controller to its children (cgroup.subtree_control).
    Value "on"/"off". Turning it off again is skipped while another child group uses it."""

    kind: ClassVar[str] = "cgroup-controller"
    group: str
    controller: str = "cpuset"
    ours: str = ""  # the child group tilewise itself uses (ignored when checking for other users)

    def lock_key(self) -> str:  # shared: several runs may rely on an enabled controller
        return f"cgroup-controller:{self.group}:{self.controller}:{os.getpid()}"

    def describe(self, key: str) -> str:
        return f"{self.controller} controller of {self.group}"

    def get(self, key: str) -> str:
        path = os.path.join(self.group, "cgroup.subtree_control")
        try:
            text = _read(path)
        except FileNotFoundError:
            raise Gone(f"{self.group} does not exist") from None
        return "on" if self.controller in text.split() else "off"

    def needs(self, key: str, value) -> changes.Needs:
        return changes.Needs(writes=(os.path.join(self.group, "cgroup.subtree_control"),))

    def set(self, key: str, value: str) -> None:
        if value == "off":
            users = self.users()
            if users:
                raise InUse(f"left on: {users[0]} uses it now")
        _write(os.path.join(self.group, "cgroup.subtree_control"), ("+" if value == "on" else "-") + self.controller)

    def users(self) -> list[str]:
        """Child groups (other than ours) that configured the controller or pass it on."""
        out = []
        try:
            names = sorted(os.listdir(self.group))
        except OSError:
            return out
        for n in names:
            child = os.path.join(self.group, n)
            if not os.path.isdir(child) or child == self.ours or (self.ours and self.ours.startswith(child + "/")):
                continue
            if self.controller in words(os.path.join(child, "cgroup.subtree_control")):
                out.append(child)
            elif self.controller == "cpuset" and any(words(os.path.join(child, f)) for f in ("cpuset.cpus", "cpuset.mems")):
                out.append(child)
        return out

    def to_json(self) -> dict:
        return {"group": self.group, "controller": self.controller, "ours": self.ours}


class InUse(changes.Kept):
    """Turning the controller off would break another group's use of it."""


# ---- v2: how to give a target a cpuset -----------------------------------------------------------

@dataclass
class V2Plan:
    mode: str  # "constrain": write the group's own cpuset.cpus; "move": a child group of the root
    group: str  # constrain: the target's group; move: the root (the parent of our group)
    enable: list[str]  # groups whose cgroup.subtree_control must get +cpuset first (top down)


def plan_v2(root: str, *, group: str | None = None, pid: int | None = None, tree_pids: set[int] | None = None,
            proc: str = "/proc", may_enable: bool = False) -> V2Plan | str:
    """How to constrain a target's CPUs on cgroup v2, or why it cannot be done (a string)."""
    if "cpuset" not in words(os.path.join(root, "cgroup.controllers")):
        got = " ".join(words(os.path.join(root, "cgroup.controllers"))) or "none"
        return f"cgroup v2 at {root} offers no cpuset controller (cgroup.controllers: {got})"
    if group is not None:
        g = os.path.normpath(os.path.abspath(group))
        if g != root and not g.startswith(root.rstrip("/") + "/"):
            return f"{g} is not under the cgroup2 mount {root}"
        if g == root:
            return "the root cgroup has no cpuset.cpus of its own: give one of its child groups"
        mode = "constrain"
    else:
        rel = task_cgroup(pid, 2, proc) if pid else None
        if rel is None:
            return f"pid {pid} is in no cgroup v2 group"
        g = join(root, rel)
        if g == root:
            mode = "move"
        else:
            mode = "constrain"
            try:
                others = sorted(set(pids_in(g)) - set(tree_pids or ()))
            except OSError as e:
                return f"cannot read {g}/cgroup.procs: {e.strerror}"
            if others:
                return (f"its cgroup {g} also holds {len(others)} other process(es) (pid {others[0]}...), "
                        "and constraining the group would constrain them too")
    path = ancestors(root, g) if mode == "constrain" else [root]
    enable = [a for a in path if "cpuset" not in words(os.path.join(a, "cgroup.subtree_control"))]
    if enable and not may_enable:
        return (f"cgroup v2: cpuset is not enabled in {enable[0]}/cgroup.subtree_control "
                "(`--enforce cgroup` enables it for the run, journaled and undone)")
    return V2Plan(mode, g if mode == "constrain" else root, enable)


def v2_writes(plan: V2Plan) -> list[tuple[str, str]]:
    """What carrying out plan writes, as (what, path): the admission checks each before anything
    changes. constrain: the group's own cpuset.cpus (never writable by the user a group is
    delegated to: it is the parent's resource control); move: a new child of the root and the
    root's cgroup.procs (the common ancestor of the old and the new group); both: the
    cgroup.subtree_control of every group where cpuset must be enabled."""
    out = [("cgroup.subtree_control of", os.path.join(g, "cgroup.subtree_control")) for g in plan.enable]
    if plan.mode == "constrain":
        out.append(("cpuset.cpus of", os.path.join(plan.group, "cpuset.cpus")))
    else:
        out += [("the cgroup", plan.group), ("cgroup.procs of", os.path.join(plan.group, "cgroup.procs"))]
    return out
