"""Handing the target its cores: a cpuset (cgroup v1 or v2), or sched_setaffinity on every thread.

- cgroup v1 (cpuset hierarchy, e.g. /sys/fs/cgroup/cpuset): a child group
  ``tilewise-elastic-<daemon pid>-<random>`` is created inside the target's own cpuset group
  (or inside --cgroup PATH); its cpuset.mems copies the parent's (memory nodes are never
  changed), the target's processes are moved in, and every core change is one write to its
  cpuset.cpus. New threads and children are born inside. No other group is written.
- cgroup v2 (the only hierarchy on current distributions): a group cannot be left without losing
  its memory and CPU limits, so the target's own group is constrained in place (its cpuset.cpus)
  where it holds only the target's process tree, or --cgroup PATH is; a target in the root group
  is moved into a child group of ours. The cpuset controller must be enabled on the way down;
  ``--enforce cgroup`` enables it where needed (journaled, undone unless another group uses it
  by then), ``auto`` falls back to affinity and says why (tilewise.cgroups.plan_v2).
- affinity: sched_setaffinity on every thread of the target's process tree; threads that appear
  later are bound on the next tick (they also inherit their creator's mask at birth).

Every change goes through the change-and-undo layer (tilewise.changes): the target is locked
(a second daemon on it refuses, naming the first), the original of everything is journaled
before it is changed (CPU mask of every thread, group of every process, the group we create,
cpuset.cpus we write), and restore undoes it in reverse order past failures with signals held.
What a daemon killed with SIGKILL left, `tilewise restore` (or the next daemon on the same
target) undoes.
"""

from __future__ import annotations

import errno
import os
import secrets

from tilewise import admission, cgroups, changes, cpulist, procs
from tilewise.cgroups import mounts, task_cgroup  # noqa: F401 - where callers look for them
from tilewise.changes import Busy, Gone, ProcessAffinity
from tilewise.errors import TilewiseError
from tilewise.procs import ProcId


FRESH_CHECKS = 10  # ticks a process born during the run is checked for a switch of user


class Enforcer:
    """Base: locks the target, records originals through a Session, applies CPU sets, restores."""

    kind = "affinity"

    def __init__(self, *, target_pid: int | None = None, cgroup_path: str | None = None, proc: str = "/proc",
                 reason: str = "", session: changes.Session | None = None, caller: admission.Caller | None = None):
        self.target_pid = target_pid
        self.caller = caller or admission.caller()
        self.cgroup_path = cgroup_path
        self.proc = proc
        self.reason = reason
        what = f"pid {target_pid}" if target_pid else f"cgroup {cgroup_path}"
        self.session = session or changes.Session(f"elastic {what}")
        self.what = what
        self.cpus: tuple[int, ...] = ()
        self.default: list[int] = []
        self.original: set[int] = set()  # processes present at start: what they have now is the original
        self.seen: set[int] = set()
        self.bound: set[int] = set()  # tids already given the current set
        self.path: str | None = None  # a group we created, if any
        self.active = False
        self.kept: list[str] = []  # undo items done the nearest possible way (said in the summary)
        self.denied: dict[int, str] = {}  # pid -> why it is not controlled (said once, then left alone)
        self.since: int | None = None  # --pid targets: when control began (clock ticks since boot)
        # live processes born since (bound without a journal entry each) -> [the user ids they ran as when
        # last seen, how many more ticks look again]
        self.fresh: dict[int, list] = {}

    def lock_target(self) -> None:
        if self.target_pid:
            start = ProcId.of(self.target_pid, self.proc)
            if start is None:
                raise TilewiseError(f"no running process with pid {self.target_pid}", "check the pid (ps -e)")
            self.session.lock(f"process:{self.target_pid}:{start.start}", self.what)
        if self.cgroup_path:
            self.session.lock("cgroup:" + os.path.abspath(self.cgroup_path), self.what)

    def start(self, tasks: dict[int, int], default_cpus, cpus) -> None:
        if self.target_pid:  # what the tree gains from now on is born with the mask we give its parent
            self.since = changes.boot_ticks()
        self.lock_target()
        self.default = sorted(default_cpus)
        self.original = set(tasks.values())
        self.active = True
        try:
            self._start(tasks, tuple(sorted(cpus)))
        except BaseException:
            self.restore()
            raise

    def _start(self, tasks, cpus) -> None:
        self.apply(cpus, tasks)

    def apply(self, cpus, tasks: dict[int, int]) -> list[str]:
        raise NotImplementedError

    def _origin_mask(self, pid: int):
        return None if pid in self.original else {"threads": {}, "default": self.default}

    def born_since(self, pid: int) -> bool:
        """A process of a --pid target's tree born after control began (a new backend, a parallel
        worker): one journal entry (changes.BornSince) covers all of them, none is made for it."""
        if self.since is None or pid in self.original:
            return False
        st = procs.start_time(pid, self.proc)
        return st is not None and st >= self.since

    def journal_born_since(self) -> None:
        """Journal, before anything is changed, that the processes the tree gains get the target's
        original CPUs back on undo (undone last: after the processes present at the start)."""
        start = ProcId.of(self.target_pid, self.proc)
        if start is None:
            raise TilewiseError(f"no running process with pid {self.target_pid}", "check the pid (ps -e)")
        self.session.record(changes.BornSince(self.target_pid, start.start, self.since, self.proc), "cpus",
                            list(self.default), None)

    def _new_pids(self, tasks: dict[int, int]) -> list[int]:
        return sorted(set(tasks.values()) - self.seen)

    def admit(self, pid: int) -> str | None:
        """A process that joined the tree: None when this caller may re-bind it, else the line that
        says once why it stays uncontrolled (and it is left alone from then on)."""
        if pid in self.denied:
            return None
        p = admission.process(pid, self.proc)
        why = admission.may_set_affinity(self.caller, p) if p is not None else None
        return self.deny(pid, why, p) if why else None

    def deny(self, pid: int, why: str, p: admission.Proc | None = None) -> str:
        p = p or admission.process(pid, self.proc)
        who = f"{p.label()}, owned by {p.owner}" if p is not None else f"pid {pid}"
        try:  # what it has: the CPUs it inherited at birth stay (ours to change no more than the rest)
            keeps = f" (it keeps CPUs {cpulist.format(sorted(os.sched_getaffinity(pid)))})"
        except OSError:
            keeps = ""
        line = f"{who}: not controlled{keeps}: {why}"
        self.denied[pid] = line
        return line

    def restore(self) -> list[str]:
        """Undo everything (reverse order, past failures, signals held); returns the problems."""
        if not self.active:
            return []
        self.active = False
        rep = self.session.close()
        self.kept = [o.line() for o in rep.outcomes if o.result == "kept"]
        return [o.line() for o in rep.failed] + rep.notes


class AffinityEnforcer(Enforcer):
    kind = "affinity"

    def _start(self, tasks, cpus) -> None:
        if self.since is not None:
            self.journal_born_since()
        self.apply(cpus, tasks)

    def apply(self, cpus, tasks) -> list[str]:
        cpus = tuple(sorted(cpus))
        changed = cpus != self.cpus
        if changed:
            self.cpus, self.bound = cpus, set()
        problems: list[str] = []
        by_pid: dict[int, list[int]] = {}
        for tid, pid in tasks.items():
            by_pid.setdefault(pid, []).append(tid)
        for pid, tids in by_pid.items():
            if pid in self.denied:
                continue
            new = pid not in self.seen
            if new:
                self.seen.add(pid)
                line = self.admit(pid)
                if line:  # another user's process joined the tree: said once, left alone
                    problems.append(line)
                    continue
                if self.born_since(pid):
                    self.fresh[pid] = [self._ids(pid), FRESH_CHECKS]
            elif pid in self.fresh and self.fresh[pid][1] > 0:
                # a child that switches user does so right after its birth (setuid, then exec): its first
                # ticks look again, and one that is no longer ours is said once and left alone
                seen = self.fresh[pid]
                seen[1] -= 1
                ids = self._ids(pid)
                if ids != seen[0]:
                    seen[0] = ids
                    line = self.admit(pid)
                    if line:
                        problems.append(line)
                        continue
            if pid in self.fresh or not (new or changed):
                # threads born since (already journaled with their process), and every thread of a
                # process born since (journaled with the tree: changes.BornSince): just bound
                for tid in tids:
                    if tid in self.bound:
                        continue
                    try:
                        os.sched_setaffinity(tid, cpus)
                        self.bound.add(tid)
                    except (ProcessLookupError, FileNotFoundError):
                        pass
                    except OSError as e:
                        what = f"sched_setaffinity({cpulist.format(cpus)}) of task {tid}: {e.strerror}"
                        if e.errno == errno.EPERM:  # lost the right to it (it changed its uid): said once
                            problems.append(self.deny(pid, what))
                            break
                        problems.append(what)  # said once: not retried until the CPUs change
                        self.bound.add(tid)
                continue
            try:  # the whole process through the layer: journaled, set, read back
                self.session.change(ProcessAffinity.of(pid, self.proc), "cpus", list(cpus),
                                    origin=self._origin_mask(pid))
                self.bound.update(tids)
            except Gone:
                pass
            except TilewiseError as e:  # retried at the next core change, unless it is no longer ours
                problems.append(self.admit(pid) or str(e))
        self.bound &= set(tasks)
        live = set(tasks.values())
        self.fresh = {p: u for p, u in self.fresh.items() if p in live}
        return problems

    def _ids(self, pid: int) -> tuple | None:
        """Who a process runs as (real, effective, saved uid), from /proc/PID/status."""
        p = admission.process(pid, self.proc)
        return None if p is None else (p.uid, p.euid, p.suid)


class CgroupMoveEnforcer(Enforcer):
    """A child cpuset group of our own (v1; v2 for a target in the root group); tasks moved in."""

    def __init__(self, version: int, root: str, parent: str, *, enable: list[str] | None = None, **kw):
        super().__init__(**kw)
        self.version = version
        self.root = root
        self.parent = parent
        self.enable = list(enable or [])
        self.kind = f"cgroup-v{version}"
        self.path = os.path.join(parent, f"tilewise-elastic-{os.getpid()}-{secrets.token_hex(3)}")

    def _start(self, tasks, cpus) -> None:
        for g in self.enable:
            self.session.change(cgroups.CgroupController(g, "cpuset", self.path), "enabled", "on")
        try:
            self.session.change(cgroups.CgroupDir(self.path, self.parent, self.version), "state",
                                {"cpus": cpulist.format(cpus)})
        except TilewiseError as e:
            raise TilewiseError(f"cannot set up cgroup {self.path}: {e}", "use --enforce affinity") from None
        self.cpus = cpus
        probs = self.apply(cpus, tasks)
        if probs:
            raise TilewiseError(f"cannot move the target into {self.path}: {probs[0]}", "use --enforce affinity")

    def _set_cpus(self, cpus) -> None:
        f = os.path.join(self.path, "cpuset.cpus")
        want = cpulist.format(cpus)
        with open(f, "w") as fh:
            fh.write(want)
        with open(f) as fh:
            got = cpulist.parse(fh.read(), what="cpuset.cpus", allow_empty=True)
        if got != tuple(cpus):
            raise OSError(5, f"cpuset.cpus reads back {cpulist.format(got)!r}, wrote {want!r}")
        self.cpus = tuple(cpus)

    def apply(self, cpus, tasks) -> list[str]:
        problems = []
        cpus = tuple(sorted(cpus))
        if cpus != self.cpus:
            try:  # a file in our own group: removed with it, nothing to journal
                self._set_cpus(cpus)
            except OSError as e:
                problems.append(f"{self.path}/cpuset.cpus: {e.strerror or e}")
        ours = cgroups.rel_to(self.root, self.path)
        for pid in self._new_pids(tasks):
            self.seen.add(pid)
            if self.born_since(pid) and task_cgroup(pid, self.version, self.proc) == ours:
                continue  # born inside our group: removing the group moves it back (CgroupDir), nothing to journal
            line = self.admit(pid)
            if line:
                problems.append(line)
                continue
            try:
                start = ProcId.of(pid, self.proc)
                if start is None:
                    continue
                member = cgroups.CgroupMember(pid, start.start, self.version, self.root, self.proc)
                self.session.lock(member, f"pid {pid}")
                # moving between cpusets resets the CPU masks: journal them first, restored after moving back
                self.session.protect(ProcessAffinity(pid, start.start, self.proc), "cpus", origin=self._origin_mask(pid))
                self.session.change(member, "group", ours,
                                    origin=None if pid in self.original else cgroups.rel_to(self.root, self.parent))
            except Gone:
                continue
            except TilewiseError as e:
                problems.append(self.deny(pid, str(e)))
        return problems


class CgroupConstrainEnforcer(Enforcer):
    """cgroup v2: the target's own group (or --cgroup PATH) gets its cpuset.cpus written in place."""

    kind = "cgroup-v2 in place"

    def __init__(self, group: str, *, enable: list[str] | None = None, **kw):
        super().__init__(**kw)
        self.group = group
        self.enable = list(enable or [])
        self.file = cgroups.CpusetCpus(os.path.join(group, "cpuset.cpus"), "cpulist", f"cpuset.cpus of {group}")

    def _start(self, tasks, cpus) -> None:
        for g in self.enable:
            self.session.change(cgroups.CgroupController(g, "cpuset", self.group), "enabled", "on")
        self.session.lock("cgroup:" + self.group, f"cgroup {self.group}")
        probs = self._protect(tasks)  # before the first cpuset write, so they are restored after it
        if probs:
            raise TilewiseError(probs[0])
        self.session.change(self.file, "value", cpulist.format(cpus))
        self.cpus = cpus

    def _protect(self, tasks) -> list[str]:
        problems = []
        for pid in self._new_pids(tasks):  # on older kernels a cpuset change resets the masks
            self.seen.add(pid)
            if self.born_since(pid):
                continue  # born inside the group with the mask the cpuset gave its parent: nothing of its own
            line = self.admit(pid)
            if line:
                problems.append(line)
                continue
            try:
                self.session.protect(ProcessAffinity.of(pid, self.proc), "cpus", origin=self._origin_mask(pid))
            except Gone:
                continue
            except TilewiseError as e:
                problems.append(self.deny(pid, str(e)))
        return problems

    def apply(self, cpus, tasks) -> list[str]:
        problems = self._protect(tasks)
        cpus = tuple(sorted(cpus))
        if cpus != self.cpus:
            try:
                self.session.change(self.file, "value", cpulist.format(cpus))
                self.cpus = cpus
            except TilewiseError as e:
                problems.append(str(e))
        return problems


def choose(kind: str, target_pid: int | None, cgroup_path: str | None, proc: str = "/proc",
           mountinfo: str = "/proc/self/mountinfo", tree_pids: set[int] | None = None,
           session: changes.Session | None = None, caller: admission.Caller | None = None) -> Enforcer:
    """auto: a cpuset where one can be had, else affinity (with the reason). cgroup: a cpuset or
    an error (and on v2, enable the cpuset controller where needed). affinity: affinity.

    Admission (tilewise.admission) is part of the choice: a cpuset this caller may not write (not
    root, no delegated group) is no choice for auto (affinity, with the reason), and for
    `--enforce cgroup` or `--cgroup PATH` a refusal naming the file, its owner and the way out."""
    who = caller or admission.caller()
    kw = {"target_pid": target_pid, "cgroup_path": cgroup_path, "proc": proc, "session": session, "caller": who}
    if kind == "affinity":
        if cgroup_path:
            raise TilewiseError("--cgroup needs cgroup enforcement", "drop --enforce affinity")
        return AffinityEnforcer(reason="requested", **kw)
    m = cgroups.mounts(mountinfo)
    why: list[str] = []
    refused: list[admission.Refusal] = []

    def admitted(needs: admission.CgroupNeeds) -> bool:
        r = admission.cgroup_refusals(who, needs)
        refused.extend(r)
        why.extend(x.line() for x in r[:1])
        return not r

    under = (lambda root: cgroup_path is None or os.path.abspath(cgroup_path) == root
             or os.path.abspath(cgroup_path).startswith(root.rstrip("/") + "/"))
    v1 = m["v1"]
    if not v1:
        why.append("no cgroup v1 cpuset mount")
    elif under(v1):
        if cgroup_path:
            parent = os.path.abspath(cgroup_path)
        else:
            rel = task_cgroup(target_pid, 1, proc) if target_pid else None
            parent = cgroups.join(v1, rel) if rel is not None else None
        if parent is None:
            why.append("target has no v1 cpuset group")
        elif admitted(admission.CgroupNeeds(
                [("the cpuset group", admission.access(parent))],
                admission.processes(tree_pids or (), proc) if not who.root else [])):
            return CgroupMoveEnforcer(1, v1, parent, **kw)
    v2 = m["v2"]
    if not v2:
        why.append("no cgroup2 mount")
    elif under(v2):
        plan = cgroups.plan_v2(v2, group=cgroup_path, pid=target_pid, tree_pids=tree_pids, proc=proc,
                               may_enable=kind == "cgroup")
        if isinstance(plan, str):
            why.append(plan)
        elif admitted(admission.CgroupNeeds([(what, admission.access(path)) for what, path in cgroups.v2_writes(plan)])):
            if plan.mode == "move":
                return CgroupMoveEnforcer(2, v2, plan.group, enable=plan.enable, **kw)
            return CgroupConstrainEnforcer(plan.group, enable=plan.enable, **kw)
    if refused and (kind == "cgroup" or cgroup_path):
        raise admission.Refused(refused)
    if kind == "cgroup" or cgroup_path:
        raise TilewiseError("cannot use a cgroup cpuset here: " + "; ".join(why),
                            "use --enforce affinity with --pid" if not cgroup_path else "check the path and run as root")
    return AffinityEnforcer(reason="; ".join(why) or "no cgroup cpuset", **kw)


__all__ = ["AffinityEnforcer", "Busy", "CgroupConstrainEnforcer", "CgroupMoveEnforcer", "Enforcer", "choose",
           "mounts", "task_cgroup"]
