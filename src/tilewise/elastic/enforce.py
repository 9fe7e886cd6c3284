"""Handing the target its cores: a cgroup cpuset of our own, or sched_setaffinity on every thread.

- cgroup v1 (cpuset hierarchy, e.g. /sys/fs/cgroup/cpuset): a child group
  ``tilewise-elastic-<daemon pid>-<random>`` is created inside the target's own cpuset group
  (or inside --cgroup PATH); its cpuset.mems copies the parent's (memory nodes are never
  changed), the target's tasks are moved in, and every core change is one write to cpuset.cpus.
  New threads and children inherit the group. No other group is ever written.
- cgroup v2: the same where the target's group already delegates cpuset to children
  (``cpuset`` in its cgroup.subtree_control); we never enable controllers in groups we did not
  create, so elsewhere we fall back to affinity and say why.
- affinity: sched_setaffinity on every thread of the target's process tree; threads that appear
  later are bound on the next tick (they also inherit their creator's mask at birth).

Undo is journaled before the first change (versioned JSON, temp file + fsync + rename):
original cgroup and CPU mask of every thread, and the group we created. ``restore`` undoes from
that record in reverse order, keeps going when one item fails, and is idempotent. A daemon that
crashed leaves its journal behind; the next start undoes it (``recover_stale``).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field

from tilewise.fsutil import atomic_write_json
from tilewise import cpulist
from tilewise.errors import TilewiseError

JOURNAL_VERSION = 1


# ---- where things are ------------------------------------------------------------------------

def state_dir() -> str:
    base = os.environ.get("TILEWISE_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "tilewise")
    return os.path.join(base, "elastic")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def proc_start(pid: int, proc: str = "/proc") -> int | None:
    """Start time (clock ticks since boot) of a task: tells a live pid from a reused one."""
    try:
        st = _read(f"{proc}/{pid}/stat")
        return int(st[st.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


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


# ---- the journal -------------------------------------------------------------------------------

def write_journal(path: str, doc: dict) -> None:
    atomic_write_json(path, doc, indent=None, mode=0o600)


def load_journal(path: str) -> dict:
    try:
        doc = json.loads(_read(path))
    except (OSError, ValueError) as e:
        raise TilewiseError(f"cannot read elastic journal {path}: {e}") from None
    if doc.get("version") != JOURNAL_VERSION:
        raise TilewiseError(f"elastic journal {path} has version {doc.get('version')!r}, expected {JOURNAL_VERSION}",
                            "undo it by hand (restore the target's affinity, remove the group it names) and delete it")
    return doc


def restore_from(doc: dict, proc: str = "/proc") -> list[str]:
    """Undo what a journal records; returns problems (never raises)."""
    problems: list[str] = []
    pids = {int(k): v for k, v in doc.get("pids", {}).items()}
    default = tuple(doc.get("default_cpus") or ())
    cg = doc.get("cgroup")
    if cg:
        created = cg["path"]
        # 1. move everything still in our group back to where it came from (threads one by one on v1)
        for _ in range(50):
            try:
                tasks = [int(x) for x in _read(os.path.join(created, "tasks" if cg["version"] == 1 else "cgroup.procs")).split()]
            except OSError:
                break
            if not tasks:
                break
            for tid in tasks:
                tgid = _tgid(tid, proc) or tid
                dest = pids.get(tgid, {}).get("cgroup") or cg["parent"]
                try:
                    _write(os.path.join(dest, "tasks" if cg["version"] == 1 else "cgroup.procs"), str(tid))
                except OSError as e:
                    if e.errno not in (3,):  # ESRCH: exited meanwhile
                        problems.append(f"could not move task {tid} back to {dest}: {e.strerror}")
            time.sleep(0.01)
    # 2. original masks (moving between v1 cpusets resets them), new threads get the process's mask
    threads = {int(k): tuple(v) for k, v in doc.get("threads", {}).items()}
    for pid, info in pids.items():
        if proc_start(pid, proc) != info.get("start"):
            continue  # gone, or the pid was reused by another process
        try:
            live = [int(x) for x in os.listdir(f"{proc}/{pid}/task")]
        except OSError:
            continue
        for tid in live:
            want = threads.get(tid) or tuple(info.get("cpus") or default)
            if not want:
                continue
            try:
                os.sched_setaffinity(tid, want)
            except (ProcessLookupError, FileNotFoundError):
                pass
            except OSError as e:
                problems.append(f"could not restore the CPUs of task {tid} to {cpulist.format(want)}: {e.strerror}")
    # 3. remove our group (it may take a moment for exiting tasks to leave it)
    if cg:
        created = cg["path"]
        for i in range(100):
            try:
                os.rmdir(created)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if i == 99:
                    problems.append(f"could not remove cgroup {created}: {e.strerror}")
                time.sleep(0.01)
    return problems


def _tgid(tid: int, proc: str = "/proc") -> int | None:
    try:
        for line in _read(f"{proc}/{tid}/status").splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def recover_stale(directory: str | None = None, proc: str = "/proc") -> list[str]:
    """Undo journals left by daemons that died without cleaning up. Returns what was done."""
    directory = directory or state_dir()
    done: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return done
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            doc = load_journal(path)
        except TilewiseError as e:
            done.append(str(e))
            continue
        owner = doc.get("daemon_pid")
        if owner and proc_start(owner, proc) == doc.get("daemon_start"):
            continue  # its daemon is still running
        problems = restore_from(doc, proc)
        done.append(f"undid {path} left by a daemon (pid {owner}) that did not exit cleanly"
                    + (": " + "; ".join(problems) if problems else ""))
        if not problems:
            os.unlink(path)
    return done


# ---- enforcers ---------------------------------------------------------------------------------

@dataclass
class Enforcer:
    """Base: records the originals (journal first), applies CPU sets, restores."""

    proc: str = "/proc"
    journal_dir: str | None = None
    doc: dict = field(default_factory=dict)
    journal_path: str | None = None
    cpus: tuple[int, ...] = ()
    bound: set = field(default_factory=set)  # tids already given the current set
    kind: str = "affinity"
    reason: str = ""

    def _record(self, tasks: dict[int, int], default_cpus) -> None:
        pids: dict[int, dict] = {}
        threads: dict[int, list[int]] = {}
        for tid, pid in tasks.items():
            try:
                threads[tid] = sorted(os.sched_getaffinity(tid))
            except OSError:
                continue
            if pid not in pids:
                pids[pid] = {"start": proc_start(pid, self.proc), "cpus": threads.get(pid) or sorted(default_cpus)}
        self.doc = {"version": JOURNAL_VERSION, "daemon_pid": os.getpid(), "daemon_start": proc_start(os.getpid(), self.proc),
                    "created": time.time(), "default_cpus": sorted(default_cpus),
                    "pids": {str(k): v for k, v in pids.items()}, "threads": {str(k): v for k, v in threads.items()},
                    "cgroup": None}

    def _journal(self) -> None:
        d = self.journal_dir or state_dir()
        if self.journal_path is None:
            self.journal_path = os.path.join(d, f"{os.getpid()}-{secrets.token_hex(4)}.json")
        try:
            write_journal(self.journal_path, self.doc)
        except OSError as e:
            raise TilewiseError(f"cannot write the undo journal {self.journal_path}: {e.strerror}",
                                "set TILEWISE_STATE_DIR to a writable directory") from None

    def track(self, tasks: dict[int, int]) -> None:
        """Remember processes that joined the tree later, so restore can find their threads."""
        pids = self.doc.get("pids", {})
        new = [p for p in set(tasks.values()) if str(p) not in pids]
        if new:
            default = self.doc.get("default_cpus")
            for p in new:
                pids[str(p)] = {"start": proc_start(p, self.proc), "cpus": default,
                                **({"cgroup": self.doc["cgroup"]["parent"]} if self.doc.get("cgroup") else {})}
            self._journal()

    def start(self, tasks: dict[int, int], default_cpus, cpus) -> None:
        raise NotImplementedError

    def apply(self, cpus, tasks: dict[int, int]) -> list[str]:
        raise NotImplementedError

    def restore(self) -> list[str]:
        if not self.doc:
            return []
        problems = restore_from(self.doc, self.proc)
        if self.journal_path and not problems:
            try:
                os.unlink(self.journal_path)
            except FileNotFoundError:
                pass
        self.doc = {}
        return problems


class AffinityEnforcer(Enforcer):
    def start(self, tasks, default_cpus, cpus) -> None:
        self._record(tasks, default_cpus)
        self._journal()
        self.apply(cpus, tasks)

    def apply(self, cpus, tasks) -> list[str]:
        cpus = tuple(sorted(cpus))
        if cpus != self.cpus:
            self.cpus, self.bound = cpus, set()
        self.track(tasks)
        problems = []
        for tid in tasks:
            if tid in self.bound:
                continue
            try:
                os.sched_setaffinity(tid, cpus)
                self.bound.add(tid)
            except (ProcessLookupError, FileNotFoundError):
                pass
            except OSError as e:
                problems.append(f"task {tid}: sched_setaffinity({cpulist.format(cpus)}): {e.strerror}")
        self.bound &= set(tasks)
        return problems


class CgroupEnforcer(Enforcer):
    """A child cpuset group of our own; version 1 or 2."""

    def __init__(self, version: int, parent: str, **kw):
        super().__init__(**kw)
        self.version = version
        self.parent = parent
        self.kind = f"cgroup-v{version}"
        self.path = os.path.join(parent, f"tilewise-elastic-{os.getpid()}-{secrets.token_hex(3)}")

    def _tasks_file(self, d: str) -> str:
        return os.path.join(d, "tasks" if self.version == 1 else "cgroup.procs")

    def start(self, tasks, default_cpus, cpus) -> None:
        self._record(tasks, default_cpus)
        for info in self.doc["pids"].values():
            info["cgroup"] = self.parent
        self.doc["cgroup"] = {"version": self.version, "path": self.path, "parent": self.parent}
        self._journal()  # before mkdir: a crash after it still finds and removes the group
        try:
            os.mkdir(self.path)
            mems_file = "cpuset.effective_mems" if os.path.exists(os.path.join(self.parent, "cpuset.effective_mems")) else "cpuset.mems"
            mems = _read(os.path.join(self.parent, mems_file)).strip()
            if self.version == 1 or mems:
                _write(os.path.join(self.path, "cpuset.mems"), mems)
            self._set_cpus(cpus)
        except OSError as e:
            self.restore()
            raise TilewiseError(f"cannot set up cgroup {self.path}: {e.strerror}", "use --enforce affinity") from None
        self.apply(cpus, tasks)

    def _set_cpus(self, cpus) -> None:
        cpus = tuple(sorted(cpus))
        f = os.path.join(self.path, "cpuset.cpus")
        want = cpulist.format(cpus)
        _write(f, want)
        got = cpulist.parse(_read(f), what="cpuset.cpus", allow_empty=True)
        if got != cpus:
            raise OSError(5, f"cpuset.cpus reads back {cpulist.format(got)!r}, wrote {want!r}")
        self.cpus = cpus

    def apply(self, cpus, tasks) -> list[str]:
        problems = []
        if tuple(sorted(cpus)) != self.cpus:
            try:
                self._set_cpus(cpus)
            except OSError as e:
                problems.append(f"{self.path}/cpuset.cpus: {e.strerror or e}")
        self.track(tasks)
        # move the tasks we have not moved yet (first tick; new processes put into --cgroup PATH);
        # threads and children of moved tasks are born inside our group, the write is then a no-op
        ids = set(tasks) if self.version == 1 else set(tasks.values())
        for tid in sorted(ids - self.bound):
            try:
                _write(self._tasks_file(self.path), str(tid))
                self.bound.add(tid)
            except OSError as e:
                if e.errno != 3:
                    problems.append(f"could not move task {tid} into {self.path}: {e.strerror}")
        self.bound &= ids
        return problems


def choose(kind: str, target_pid: int | None, cgroup_path: str | None, proc: str = "/proc",
           mountinfo: str = "/proc/self/mountinfo", journal_dir: str | None = None) -> Enforcer:
    """auto: a cgroup of our own where we can create one, else affinity (with the reason)."""
    if kind == "affinity":
        if cgroup_path:
            raise TilewiseError("--cgroup needs cgroup enforcement", "drop --enforce affinity")
        return AffinityEnforcer(proc=proc, journal_dir=journal_dir, reason="requested")
    m = mounts(mountinfo)
    why = []
    for version, root in ((1, m["v1"]), (2, m["v2"])):
        if not root:
            why.append(f"no cgroup v{version} cpuset mount" if version == 1 else "no cgroup2 mount")
            continue
        if cgroup_path:
            parent = os.path.abspath(cgroup_path)
            if not (parent + "/").startswith(root.rstrip("/") + "/") and parent != root:
                continue
        else:
            rel = task_cgroup(target_pid, version, proc) if target_pid else None
            if rel is None:
                why.append(f"target has no v{version} cpuset group")
                continue
            parent = os.path.join(root, rel.lstrip("/"))
        if version == 2:
            try:
                sub = _read(os.path.join(parent, "cgroup.subtree_control")).split()
            except OSError:
                sub = []
            if "cpuset" not in sub:
                why.append(f"cgroup v2: cpuset is not delegated in {parent}/cgroup.subtree_control")
                continue
        if not os.access(parent, os.W_OK):
            why.append(f"{parent} is not writable (run as root)")
            continue
        return CgroupEnforcer(version, parent, proc=proc, journal_dir=journal_dir)
    if kind == "cgroup" or cgroup_path:
        raise TilewiseError("cannot use a cgroup cpuset here: " + "; ".join(why), "use --enforce affinity with --pid")
    return AffinityEnforcer(proc=proc, journal_dir=journal_dir, reason="; ".join(why) or "no cgroup cpuset")
