"""One change-and-undo layer for everything tilewise changes outside itself, in the way TuneD's
plugins work, with the undo record on disk.

A change is (target, key, old, new). A target knows how to ``get`` and ``set`` one value and how
to name itself; targets are OS switch files, the CPU masks of a process's threads, cgroups, and
processes tilewise started. The rules:

- read the old value before every write; refuse to change what cannot be read back;
- a change to the value already there records nothing (re-applying never records our own value
  as the "original");
- the journal (versioned JSON; temp file, fsync, rename; owner pid + start time + boot id) is
  written BEFORE each change; the change is then applied and verified by reading it back;
- undo runs in reverse order, one item at a time, keeps going when one fails, and keeps what
  failed in the journal; SIGINT/SIGTERM/SIGHUP are held while undoing;
- a lock per target (a process by pid + start time, a cgroup path, a sysfs file): a second
  controller of the same target refuses with one line naming the holder;
- after ``kill -9`` at any point, ``tilewise restore`` (``restore_all``) undoes what dead owners
  left; a new controller of a target undoes its dead predecessor's journal first.

State lives in ``dirs.state_dir()`` ($TILEWISE_STATE_DIR, /run/tilewise for root, ...): journals/
and locks/.
"""

from __future__ import annotations

import abc
import errno
import fcntl
import hashlib
import importlib
import itertools
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tilewise import admission, cpulist, procs, signals
from tilewise.dirs import state_dir
from tilewise.errors import TilewiseError
from tilewise.fsutil import atomic_write_json
from tilewise.procs import ProcId

FORMAT = "tilewise-journal"
VERSION = 1
LOCK_FORMAT = "tilewise-lock"


class Gone(Exception):
    """The target no longer exists (a process exited, a group was removed): nothing to undo."""


class Kept(Exception):
    """Undoing this now would break someone else's use of it: left as it is (not a failure)."""


class Busy(TilewiseError):
    """Another live controller holds the target."""


# ---- targets -------------------------------------------------------------------------------------

class Target(abc.ABC):
    """Something with values tilewise may change. Subclasses register with @kind."""

    kind: ClassVar[str] = ""

    @abc.abstractmethod
    def lock_key(self) -> str:
        """What a second controller must not touch at the same time."""

    @abc.abstractmethod
    def describe(self, key: str) -> str: ...

    @abc.abstractmethod
    def get(self, key: str) -> Any:
        """The current value (JSON-able); raises Gone or OSError."""

    @abc.abstractmethod
    def set(self, key: str, value: Any) -> None:
        """Write a value; raises Gone or OSError."""

    def same(self, key: str, current: Any, wanted: Any) -> bool:
        return current == wanted

    def verify(self, key: str, wanted: Any) -> tuple[bool, Any]:
        cur = self.get(key)
        return self.same(key, cur, wanted), cur

    def show(self, value: Any) -> str:
        return str(value)

    def needs(self, key: str, value: Any) -> Needs:
        """What writing value takes (for admission before an undo): files it writes, and
        processes whose CPU affinity it sets. Default: nothing beyond our own files."""
        return Needs()

    @abc.abstractmethod
    def to_json(self) -> dict: ...

    @classmethod
    def from_json(cls, d: dict) -> Target:
        return cls(**d)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Needs:
    """What one change writes: paths (files or directories to create entries in) and the pids of
    processes it re-binds (tilewise.admission decides whether this caller may)."""

    writes: tuple[str, ...] = ()
    rebinds: tuple[int, ...] = ()


KINDS: dict[str, type[Target]] = {}
# kinds defined in other modules, imported when a journal names them
KIND_MODULES = {"cgroup-dir": "tilewise.cgroups", "cgroup-member": "tilewise.cgroups",
                "cgroup-controller": "tilewise.cgroups", "cgroup-cpus": "tilewise.cgroups"}


def kind(cls: type[Target]) -> type[Target]:
    KINDS[cls.kind] = cls
    return cls


def target_from_json(d: dict) -> Target:
    name = d.get("kind", "")
    if name not in KINDS and name in KIND_MODULES:
        importlib.import_module(KIND_MODULES[name])
    if name not in KINDS:
        raise TilewiseError(f"unknown kind of change {name!r} in a journal", "restore it with the tilewise that wrote it")
    body = {k: v for k, v in d.items() if k != "kind"}
    return KINDS[name].from_json(body)


def _read_file(path: str) -> str:
    with open(path) as f:
        return f.read()


@kind
@dataclass(frozen=True)
class FileValue(Target):
    """One value in a sysfs/procfs/cgroup file. style: plain (first word), bracketed (THP's
    'always [madvise] never'), cpulist (a CPU/node list; '' allowed), or raw (whole text)."""

    kind: ClassVar[str] = "file"
    path: str
    style: str = "plain"
    label: str = ""

    def lock_key(self) -> str:
        return "file:" + os.path.realpath(self.path)

    def describe(self, key: str) -> str:
        return f"{self.label} ({self.path})" if self.label else self.path

    def parse(self, text: str) -> str:
        text = text.strip()
        if self.style == "bracketed" and "[" in text:
            a, b = text.find("["), text.find("]")
            if b <= a:
                raise ValueError(f"malformed value {text!r}")
            return text[a + 1:b]
        if self.style == "cpulist":
            return cpulist.format(cpulist.parse(text, what=self.path, allow_empty=True))
        if self.style == "raw":
            return text
        if not text:
            raise ValueError("empty value")
        return text.split()[0]

    def get(self, key: str) -> str:
        try:
            text = _read_file(self.path)
        except FileNotFoundError:
            raise Gone(f"{self.path} does not exist") from None
        try:
            return self.parse(text)
        except (ValueError, TilewiseError) as e:
            raise OSError(5, f"cannot parse {self.path}: {e}") from None

    def needs(self, key: str, value: Any) -> Needs:
        return Needs(writes=(self.path,))

    def set(self, key: str, value: str) -> None:
        with open(self.path, "w") as f:
            f.write(f"{value}\n")

    def to_json(self) -> dict:
        return {"path": self.path, "style": self.style, "label": self.label}


@kind
@dataclass(frozen=True)
class ProcessAffinity(Target):
    """The CPU masks of every thread of one process (named by pid + start time).

    Value: a CPU list (every thread gets it), or {"threads": {tid: cpus}, "default": cpus} (what
    get returns; set gives each live thread its own mask, threads born since then the default).
    """

    kind: ClassVar[str] = "affinity"
    pid: int
    start: int
    proc: str = "/proc"

    @classmethod
    def of(cls, pid: int, proc: str = "/proc") -> ProcessAffinity:
        st = procs.start_time(pid, proc)
        if st is None:
            raise Gone(f"no process {pid}")
        return cls(pid, st, proc)

    def lock_key(self) -> str:
        return f"process:{self.pid}:{self.start}"

    def describe(self, key: str) -> str:
        return f"CPUs of pid {self.pid}"

    def _tids(self) -> list[int]:
        if not ProcId(self.pid, self.start).alive(self.proc):
            raise Gone(f"pid {self.pid} exited")
        try:
            return sorted(int(x) for x in os.listdir(f"{self.proc}/{self.pid}/task") if x.isdigit())
        except OSError:
            raise Gone(f"pid {self.pid} exited") from None

    def get(self, key: str) -> dict:
        threads = {}
        for tid in self._tids():
            try:
                threads[str(tid)] = sorted(os.sched_getaffinity(tid))
            except (ProcessLookupError, FileNotFoundError):
                continue
        if not threads:
            raise Gone(f"pid {self.pid} exited")
        default = threads.get(str(self.pid)) or next(iter(threads.values()))
        return {"threads": threads, "default": default}

    def set(self, key: str, value) -> None:
        errors = []
        for tid in self._tids():
            want = _mask_for(value, tid)
            if not want:
                continue
            try:
                os.sched_setaffinity(tid, want)
            except (ProcessLookupError, FileNotFoundError):
                continue
            except OSError as e:
                errors.append(f"task {tid}: {e.strerror}")
        if errors:
            raise OSError(1, f"sched_setaffinity({self.show(value)}): " + "; ".join(errors[:3]))

    def needs(self, key: str, value: Any) -> Needs:
        return Needs(rebinds=(self.pid,)) if ProcId(self.pid, self.start).alive(self.proc) else Needs()

    def same(self, key: str, current, wanted) -> bool:
        threads = (current or {}).get("threads", {})
        return bool(threads) and all(sorted(m) == sorted(_mask_for(wanted, int(t)) or m) for t, m in threads.items())

    def show(self, value) -> str:
        if isinstance(value, dict):
            masks = {cpulist.format(m) for m in value.get("threads", {}).values()}
            return ", ".join(sorted(masks)) or cpulist.format(value.get("default") or ())
        return cpulist.format(value or ())

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start, "proc": self.proc}


def boot_ticks() -> int:
    """Now, in the unit of /proc/PID/stat's start time (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * procs.TICKS_PER_S)


@kind
@dataclass(frozen=True)
class BornSince(Target):
    """The CPU masks of the processes a process tree gained since a moment: every live descendant
    of the root (pid + start time) whose own start time is at or after `since` (clock ticks since
    boot). A server forks backends and parallel workers all the time; they are born with the mask
    the controller gave their parent, so one journal entry covers all of them (none per process):
    undoing it gives each of them, every thread, the value (the root's original CPU list).
    Value: a CPU list (what set gives every one of them); get returns the distinct masks they have
    now, sorted (an empty list: there are none)."""

    kind: ClassVar[str] = "affinity-born-since"
    pid: int
    start: int
    since: int
    proc: str = "/proc"

    def lock_key(self) -> str:
        return f"born-since:{self.pid}:{self.start}"

    def describe(self, key: str) -> str:
        return f"CPUs of the processes pid {self.pid} spawned while controlled"

    def members(self) -> list[int]:
        """The live processes born since, that this caller may re-bind: one that is not (a child that
        became another user) was never ours to bind and keeps what it has (said during the run)."""
        if not ProcId(self.pid, self.start).alive(self.proc):
            raise Gone(f"pid {self.pid} exited")
        table = procs.scan(self.proc)
        born = [p for p in procs.descendants([self.pid], table) if table[p].start >= self.since]
        who = admission.caller()
        return sorted(p.pid for p in admission.processes(born, self.proc) if admission.may_set_affinity(who, p) is None)

    def get(self, key: str) -> list[list[int]]:
        masks = set()
        for p in self.members():
            try:
                masks.add(tuple(sorted(os.sched_getaffinity(p))))
            except OSError:
                continue
        return [list(m) for m in sorted(masks)]

    def same(self, key: str, current, wanted) -> bool:
        if current and isinstance(current[0], list):  # what get returned: every member's mask
            return all(sorted(m) == sorted(wanted or ()) for m in current)
        return sorted(current or ()) == sorted(wanted or ())

    def set(self, key: str, value) -> None:
        errors = []
        for p in self.members():
            try:
                tids = [int(x) for x in os.listdir(f"{self.proc}/{p}/task") if x.isdigit()]
            except OSError:
                continue
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, list(value or ()))
                except (ProcessLookupError, FileNotFoundError):
                    continue
                except OSError as e:
                    if e.errno == errno.EPERM:  # it changed its user meanwhile: no longer ours
                        break
                    errors.append(f"pid {p} task {tid}: {e.strerror}")
        if errors:
            raise OSError(1, f"sched_setaffinity({self.show(value)}): " + "; ".join(errors[:3]))

    def verify(self, key: str, wanted) -> tuple[bool, Any]:
        return True, wanted  # processes come and go: each was set above or is gone

    def needs(self, key: str, value: Any) -> Needs:
        try:
            return Needs(rebinds=tuple(self.members()))
        except Gone:
            return Needs()

    def show(self, value) -> str:
        if value and isinstance(value[0], list):
            return ", ".join(cpulist.format(m) for m in value)
        return cpulist.format(value or ())

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start, "since": self.since, "proc": self.proc}


def _mask_for(value, tid: int) -> list[int]:
    if isinstance(value, dict):
        return list(value.get("threads", {}).get(str(tid)) or value.get("default") or ())
    return list(value or ())


@kind
@dataclass(frozen=True)
class StartedProcess(Target):
    """A process tree tilewise started: its leader (pid + start time, when known) and its token,
    which the leader and every descendant carry in their environment (so it can be journaled
    before the process exists). Undoing its start stops the tree. Value: "running" / "stopped"."""

    kind: ClassVar[str] = "process"
    pid: int | None = None
    start: int | None = None
    token: str | None = None
    var: str = procs.SPAWN_VAR
    name: str = ""

    def lock_key(self) -> str:
        return f"process:{self.pid}:{self.start}" if self.pid else f"spawn:{self.token}"

    def describe(self, key: str) -> str:
        return f"{self.name or 'process'} ({f'pid {self.pid}' if self.pid else f'token {self.token}'})"

    def _tree(self) -> procs.Tree:
        leader = ProcId(self.pid, self.start) if self.pid and self.start is not None else None
        return procs.Tree(leader, self.token, self.var)

    def get(self, key: str) -> str:
        return "running" if procs.members([self._tree()]) else "stopped"

    def set(self, key: str, value: str) -> None:
        if value == "running":
            raise OSError(22, "a stopped process cannot be started again by undo")
        rep = procs.stop(self._tree())
        if not rep.ok:
            raise OSError(16, rep.summary())

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start, "token": self.token, "var": self.var, "name": self.name}


@kind
@dataclass(frozen=True)
class CreatedDirectory(Target):
    """A directory tilewise created for a run (a server's data directories): undoing its creation
    removes it with everything in it. Journaled before it is made, so `tilewise restore` removes
    what a killed run left. Value: "present" / "absent"."""

    kind: ClassVar[str] = "directory"
    path: str = ""
    name: str = ""

    def lock_key(self) -> str:
        return f"directory:{self.path}"

    def describe(self, key: str) -> str:
        return f"{self.name or 'directory'} {self.path}"

    def get(self, key: str) -> str:
        return "present" if os.path.lexists(self.path) else "absent"

    def set(self, key: str, value: str) -> None:
        if value == "present":
            raise OSError(22, "a removed directory cannot be brought back by undo")
        if not os.path.isabs(self.path) or os.path.realpath(self.path) == "/":
            raise OSError(22, f"refusing to remove {self.path!r}")
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)

    def needs(self, key: str, value: Any) -> Needs:
        return Needs(writes=(os.path.dirname(self.path.rstrip("/")) or "/",))

    def to_json(self) -> dict:
        return {"path": self.path, "name": self.name}


# ---- changes and owners --------------------------------------------------------------------------

@dataclass
class Change:
    target: Target
    key: str
    old: Any
    new: Any

    def describe(self) -> str:
        return self.target.describe(self.key)

    def to_json(self) -> dict:
        return {"target": {"kind": self.target.kind, **self.target.to_json()}, "key": self.key,
                "old": self.old, "new": self.new}

    @classmethod
    def from_json(cls, d: dict) -> Change:
        return cls(target_from_json(d["target"]), d["key"], d.get("old"), d.get("new"))


def _own_command(limit: int = 80) -> str:
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) == "tilewise":
        cmd = shlex.join(["tilewise", *argv[1:]])
    else:
        cmd = procs.command(os.getpid(), limit=limit)
    return procs.shorten(cmd, limit)


@dataclass(frozen=True)
class Owner:
    pid: int
    start: int
    boot_id: str | None
    command: str
    since: float

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, procs.start_time(pid) or -1, procs.boot_id(), _own_command(), time.time())

    def same_process(self, other: Owner) -> bool:
        return (self.pid, self.start, self.boot_id) == (other.pid, other.start, other.boot_id)

    def alive(self, proc: str = "/proc") -> bool:
        here = procs.boot_id(proc)
        if self.boot_id and here and self.boot_id != here:
            return False
        return ProcId(self.pid, self.start).alive(proc)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} ({self.command}) since {when}"

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start, "boot_id": self.boot_id, "command": self.command,
                "since": self.since}

    @classmethod
    def from_json(cls, d: dict) -> Owner:
        return cls(int(d["pid"]), int(d["start"]), d.get("boot_id"), str(d.get("command", "?")), float(d.get("since", 0)))


@dataclass
class Outcome:
    change: Change
    result: str  # restored | unchanged | gone | kept | failed
    detail: str = ""

    def line(self) -> str:
        c = self.change
        t = c.target
        if self.result == "restored":
            new = t.show(c.new)
            return f"restored {c.describe()} to {t.show(c.old)}" + (f" (was set to {new})" if new else "")
        if self.result == "unchanged":
            return f"{c.describe()} already at {t.show(c.old)}"
        if self.result == "gone":
            return f"{c.describe()}: {self.detail or 'gone'}, nothing to restore"
        if self.result == "kept":
            return f"{c.describe()}: {self.detail}"
        return f"could not restore {c.describe()} to {t.show(c.old)}: {self.detail}"

    def to_json(self) -> dict:
        return {"change": self.change.to_json(), "result": self.result, "detail": self.detail, "line": self.line()}


@dataclass
class UndoReport:
    outcomes: list[Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _of(self, result: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == result]

    @property
    def restored(self) -> list[Outcome]:
        return self._of("restored")

    @property
    def failed(self) -> list[Outcome]:
        return self._of("failed")

    @property
    def ok(self) -> bool:
        return not self.failed

    def lines(self) -> list[str]:
        return [o.line() for o in self.outcomes] + self.notes

    def to_json(self) -> dict:
        return {"ok": self.ok, "outcomes": [o.to_json() for o in self.outcomes], "notes": self.notes}


def undo_one(c: Change) -> Outcome:
    """Put one change back (never raises)."""
    try:
        cur = c.target.get(c.key)
        if c.target.same(c.key, cur, c.old):
            return Outcome(c, "unchanged")
        c.target.set(c.key, c.old)
        ok, got = c.target.verify(c.key, c.old)
        if not ok:
            return Outcome(c, "failed", f"reads back as {c.target.show(got)}")
        return Outcome(c, "restored")
    except Gone as e:
        return Outcome(c, "gone", str(e))
    except Kept as e:
        return Outcome(c, "kept", str(e))
    except (OSError, TilewiseError, ValueError) as e:
        return Outcome(c, "failed", getattr(e, "strerror", None) or str(e))


# ---- the journal ---------------------------------------------------------------------------------

@dataclass
class Journal:
    path: Path
    owner: Owner
    purpose: str
    changes: list[Change] = field(default_factory=list)
    locks: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "owner": self.owner.to_json(), "purpose": self.purpose,
                "changes": [c.to_json() for c in self.changes], "locks": self.locks, "updated": time.time()}

    def save(self) -> None:
        try:
            atomic_write_json(self.path, self.to_json(), indent=None, mode=0o600)
        except OSError as e:
            raise TilewiseError(f"cannot write the undo journal {self.path}: {e.strerror or e}",
                                "set TILEWISE_STATE_DIR to a writable directory; nothing was changed") from None

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    @classmethod
    def load(cls, path: Path) -> Journal:
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as e:
            raise TilewiseError(f"cannot read the undo journal {path}: {e}",
                                "undo what it names by hand, then delete it") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise TilewiseError(f"{path} is not a tilewise undo journal")
        if doc.get("version") != VERSION:
            raise TilewiseError(f"undo journal {path} has version {doc.get('version')!r}; this tilewise reads {VERSION}",
                                "restore with the tilewise that wrote it")
        try:
            return cls(Path(path), Owner.from_json(doc["owner"]), str(doc.get("purpose", "")),
                       [Change.from_json(c) for c in doc.get("changes", [])], list(doc.get("locks", [])))
        except (KeyError, TypeError, ValueError) as e:
            raise TilewiseError(f"undo journal {path} is malformed ({e})", "undo what it names by hand, then delete it") from None


def _undo_journaled(j: Journal) -> UndoReport:
    """Undo a journal's changes newest first; after each item the journal keeps only what is left
    (and what failed), so a crash in the middle loses nothing. Signals are held meanwhile."""
    rep = UndoReport()
    with signals.deferred():
        remaining, failed = list(j.changes), []
        while remaining:
            c = remaining.pop()
            out = undo_one(c)
            rep.outcomes.append(out)
            if out.result == "failed":
                failed.insert(0, c)
            j.changes = remaining + failed  # chronological: what is left, then what failed (newer)
            if remaining:
                _save_quietly(j, rep)
        if failed:
            _save_quietly(j, rep)
        else:
            j.remove()
    return rep


def _save_quietly(j: Journal, rep: UndoReport) -> None:
    try:
        j.save()
    except TilewiseError as e:  # keep undoing; say the record may be stale
        if str(e) not in rep.notes:
            rep.notes.append(str(e))


# ---- locks ---------------------------------------------------------------------------------------

def _lock_dir(base: Path) -> Path:
    return base / "locks"


def _lock_path(base: Path, key: str) -> Path:
    return _lock_dir(base) / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".json")


@contextmanager
def _mutex(base: Path) -> Iterator[None]:
    """Short critical section for lock bookkeeping (the kernel drops it if we die)."""
    d = _lock_dir(base)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".mutex", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TilewiseError(f"cannot use the state directory {base}: {e.strerror or e}",
                            "set TILEWISE_STATE_DIR to a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_lock(base: Path, key: str) -> dict | None:
    try:
        d = json.loads(_lock_path(base, key).read_text())
        return d if isinstance(d, dict) and d.get("format") == LOCK_FORMAT else None
    except (OSError, ValueError):
        return None


def holder(base: Path, key: str) -> Owner | None:
    """The live owner of a target's lock, if any."""
    d = read_lock(base, key)
    if not d:
        return None
    try:
        o = Owner.from_json(d["owner"])
    except (KeyError, TypeError, ValueError):
        return None
    return o if o.alive() else None


def plan(target: Target, key: str, new: Any) -> Change | None:
    """What setting target's key to new would record, without writing (None: already there).
    Refuses what cannot be read: a value that cannot be read back cannot be restored."""
    try:
        cur = target.get(key)
    except (Gone, OSError) as e:
        raise TilewiseError(f"refusing to change {target.describe(key)}: cannot read it ({_why(e)})",
                            "a value that cannot be read back cannot be restored") from None
    return None if target.same(key, cur, new) else Change(target, key, cur, new)


# ---- a controller's session ----------------------------------------------------------------------

_seq = itertools.count(1)


class Session:
    """One controller's changes: locks its targets, journals, applies, verifies, undoes.

    with changes.Session("tune --apply-os") as s:
        s.change(FileValue("/sys/kernel/mm/transparent_hugepage/enabled", "bracketed"), "value", "never")
        ...                                   # restored here, also on errors, Ctrl-C and SIGTERM
    """

    def __init__(self, purpose: str, *, base: str | Path | None = None):
        self.base = Path(base) if base is not None else state_dir()
        self.owner = Owner.current()
        self.purpose = purpose
        self.id = f"{self.owner.pid}-{self.owner.start}-{next(_seq)}"
        self.journal = Journal(self.base / "journals" / f"{self.id}.json", self.owner, purpose)
        self.notes: list[str] = []  # what was recovered from dead predecessors
        self.closed = False

    @property
    def changes(self) -> list[Change]:
        return self.journal.changes

    # -- locks --
    def lock(self, target: Target | str, what: str | None = None) -> None:
        """Take the target's lock, or refuse naming the live holder. A dead holder's journal is
        undone first (its changes to this target, and the rest of that journal with them)."""
        key = target if isinstance(target, str) else target.lock_key()
        if key in self.journal.locks:
            return
        what = what or (target.describe("") if isinstance(target, Target) else key)
        stale_journal = None
        with _mutex(self.base):
            d = read_lock(self.base, key)
            if d:
                try:
                    o = Owner.from_json(d["owner"])
                except (KeyError, TypeError, ValueError):
                    o = None
                if o is not None and o.alive():
                    mine = o.same_process(self.owner)
                    raise Busy(f"{what} is already controlled by "
                               + ("another part of this run" if mine else o.describe()),
                               "stop that run first, or wait for it to end")
                stale_journal = d.get("journal")
            if not stale_journal:
                self._write_lock(key, what)
        if stale_journal:
            jr = restore_one(Path(stale_journal))
            if jr.state == "refused":
                raise TilewiseError(f"what a dead run left on {what} is not ours to undo: {jr.detail}",
                                    "run `tilewise restore` as root first")
            rep = jr.undo if jr.state in ("restored", "failed") else None
            if rep is not None:
                self.notes += [f"undid what a run that did not exit cleanly left: {line}" for line in rep.lines()]
                if not rep.ok:
                    raise TilewiseError(f"could not undo what a dead run left on {what}: "
                                        + "; ".join(o.line() for o in rep.failed),
                                        f"fix it by hand, then delete {stale_journal}")
            with _mutex(self.base):
                d = read_lock(self.base, key)
                if d and d.get("journal") != stale_journal:
                    o = Owner.from_json(d["owner"])
                    if o.alive():
                        raise Busy(f"{what} is already controlled by {o.describe()}", "stop that run first")
                self._write_lock(key, what)
        self.journal.locks.append(key)
        if self.journal.changes:
            self.journal.save()

    def _write_lock(self, key: str, what: str) -> None:
        atomic_write_json(_lock_path(self.base, key),
                          {"format": LOCK_FORMAT, "key": key, "what": what, "owner": self.owner.to_json(),
                           "session": self.id, "journal": str(self.journal.path)}, indent=None, mode=0o600)

    def release_locks(self) -> None:
        with _mutex(self.base):
            for key in self.journal.locks:
                d = read_lock(self.base, key)
                if d and d.get("session") == self.id:
                    try:
                        _lock_path(self.base, key).unlink()
                    except FileNotFoundError:
                        pass
        self.journal.locks = []

    # -- changes --
    def find(self, target: Target, key: str) -> Change | None:
        for c in self.journal.changes:
            if c.target == target and c.key == key:
                return c
        return None

    def plan(self, target: Target, key: str, new: Any) -> Change | None:
        return plan(target, key, new)

    def change(self, target: Target, key: str, new: Any, *, origin: Any = None, lock: bool = True) -> Change | None:
        """Set target's key to new: lock, read the old value, journal, write, read back.

        origin: the value to restore when the current one is itself an effect of ours (a process
        born inside our group inherited our mask). Returns the Change, or None when the value was
        already there (nothing recorded).
        """
        if lock:
            self.lock(target)
        c = self.find(target, key)
        if c is None:
            planned = self.plan(target, key, new)
            if planned is None and origin is None:
                return None
            c = Change(target, key, planned.old if planned else new, new)
            if origin is not None:
                c.old = origin
            self.journal.changes.append(c)
            self.journal.save()  # BEFORE the write
        else:
            c.new = new
        self._write(c, new)
        return c

    def record(self, target: Target, key: str, old: Any, new: Any, *, lock: bool = True) -> Change:
        """Journal a change the caller is about to make itself (e.g. creating a group), before it."""
        if lock:
            self.lock(target)
        c = Change(target, key, old, new)
        self.journal.changes.append(c)
        self.journal.save()
        return c

    def drop(self, which) -> None:
        """Forget the journaled changes for which `which(change)` is true: changes that never
        happened (a process whose start failed). An empty journal is removed."""
        kept = [c for c in self.journal.changes if not which(c)]
        if len(kept) == len(self.journal.changes):
            return
        self.journal.changes = kept
        if kept or self.journal.locks:
            self.journal.save()
        else:
            self.journal.remove()

    def protect(self, target: Target, key: str, *, origin: Any = None, lock: bool = False) -> Change | None:
        """Journal the current value of something our next change may disturb as a side effect
        (moving a task between cpusets resets its CPU mask), so undo puts it back."""
        if lock:
            self.lock(target)
        if self.find(target, key) is not None:
            return None
        try:
            cur = target.get(key) if origin is None else origin
        except (Gone, OSError) as e:
            raise TilewiseError(f"cannot read {target.describe(key)} ({_why(e)})",
                                "a value that cannot be read back cannot be restored") from None
        return self.record(target, key, cur, None, lock=False)

    def _write(self, c: Change, value: Any) -> None:
        try:
            c.target.set(c.key, value)
            ok, got = c.target.verify(c.key, value)
        except (Gone, OSError) as e:
            raise TilewiseError(f"cannot set {c.describe()} to {c.target.show(value)}: {_why(e)}") from None
        if not ok:
            raise TilewiseError(f"{c.describe()} reads back as {c.target.show(got)} after writing {c.target.show(value)}")

    # -- ending --
    def undo(self) -> UndoReport:
        """Undo every change, newest first, one at a time, past failures; signals held meanwhile."""
        return _undo_journaled(self.journal)

    def commit(self) -> None:
        """Keep the changes (e.g. a cluster left running on purpose): forget them, release locks."""
        self.journal.changes = []
        self.journal.remove()
        self.release_locks()
        self.closed = True

    def close(self) -> UndoReport:
        """Undo, then release the locks (kept on targets whose undo failed). Idempotent."""
        if self.closed:
            return UndoReport()
        rep = self.undo()
        if rep.ok:
            self.release_locks()
        self.closed = True
        return rep

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        rep = self.close()
        if not rep.ok and exc_type is None:
            raise TilewiseError(f"{self.purpose}: not restored: " + "; ".join(o.line() for o in rep.failed),
                                f"run `tilewise restore` (journal {self.journal.path})")


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


# ---- restoring what dead owners left -------------------------------------------------------------

@dataclass
class JournalReport:
    path: str
    state: str  # restored | failed | refused | running | earlier-boot | busy | unreadable
    owner: Owner | None = None
    purpose: str = ""
    undo: UndoReport | None = None
    detail: str = ""

    def lines(self) -> list[str]:
        who = f"{self.purpose or 'a run'} ({self.owner.describe()})" if self.owner else self.path
        head = {"restored": f"undid what {who} left",
                "failed": f"could not undo all that {who} left (journal kept: {self.path})",
                "running": f"left alone: {who} is still running",
                "earlier-boot": f"discarded {self.path}: written before the last reboot, which reset everything it recorded",
                "busy": f"left alone: {self.path} is being restored by another tilewise",
                "refused": f"left alone (journal kept: {self.path}): {self.detail}",
                "unreadable": f"cannot use {self.path}: {self.detail}"}[self.state]
        return [head] + [f"  {line}" for line in (self.undo.lines() if self.undo else [])]

    def to_json(self) -> dict:
        return {"journal": self.path, "state": self.state, "owner": self.owner.to_json() if self.owner else None,
                "purpose": self.purpose, "detail": self.detail, "undo": self.undo.to_json() if self.undo else None}


@contextmanager
def _claim(path: Path) -> Iterator[bool]:
    """One restorer per journal at a time (the kernel drops the claim if the restorer dies)."""
    claim = path.with_name(path.name + ".claim")
    fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            try:
                claim.unlink()
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)


def _remove_locks_of(base: Path, j: Journal) -> None:
    with _mutex(base):
        for key in j.locks:
            d = read_lock(base, key)
            if d and d.get("journal") == str(j.path):
                try:
                    _lock_path(base, key).unlink()
                except FileNotFoundError:
                    pass


def restore_one(path: Path, base: Path | None = None) -> JournalReport:
    base = base or path.parent.parent
    try:
        j = Journal.load(path)
    except FileNotFoundError:
        return JournalReport(str(path), "restored", detail="already gone")
    except TilewiseError as e:
        return JournalReport(str(path), "unreadable", detail=str(e))
    if j.owner.alive():
        return JournalReport(str(path), "running", j.owner, j.purpose)
    here = procs.boot_id()
    if j.owner.boot_id and here and j.owner.boot_id != here:
        j.remove()
        _remove_locks_of(base, j)
        return JournalReport(str(path), "earlier-boot", j.owner, j.purpose)
    with _claim(path) as mine:
        if not mine:
            return JournalReport(str(path), "busy", j.owner, j.purpose)
        try:
            j = Journal.load(path)  # as it is now that it is ours
        except FileNotFoundError:
            return JournalReport(str(path), "restored", j.owner, j.purpose, UndoReport())
        except TilewiseError as e:
            return JournalReport(str(path), "unreadable", detail=str(e))
        refused = undo_refusals(j.changes)
        if refused:  # admission: nothing of it is undone (not half of it), the journal stays
            return JournalReport(str(path), "refused", j.owner, j.purpose, detail=str(admission.Refused(refused)))
        undo = _undo_journaled(j)
        if undo.ok:
            _remove_locks_of(base, j)
        return JournalReport(str(path), "restored" if undo.ok else "failed", j.owner, j.purpose, undo)


def undo_refusals(items: list[Change], caller: admission.Caller | None = None) -> list[admission.Refusal]:
    """Admission before undoing: for every change not already back at its old value, may this
    caller write what the undo writes and re-bind the processes it re-binds?"""
    who = caller or admission.caller()
    way_out = "run `tilewise restore` as root (sudo tilewise restore), or as the user whose run it was"
    out: list[admission.Refusal] = []
    for c in items:
        try:
            if c.target.same(c.key, c.target.get(c.key), c.old):
                continue
        except (Gone, OSError, TilewiseError, ValueError):
            continue  # gone, or unreadable: undo_one says so item by item
        n = c.target.needs(c.key, c.old)
        for path in n.writes:
            r = admission.write_refusal(who, admission.access(path), c.describe(), way_out)
            if r is not None:
                out.append(r)
        for p in admission.processes(n.rebinds, getattr(c.target, "proc", "/proc")):
            why = admission.may_set_affinity(who, p)
            if why is not None:
                out.append(admission.Refusal("restore the CPUs of", p.label(), p.owner, why, way_out))
    return out


def restore_all(base: Path | None = None) -> list[JournalReport]:
    """Undo everything left by owners that are no longer running (oldest journal first)."""
    base = base or state_dir()
    d = base / "journals"
    try:
        paths = sorted((p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith(".")),
                       key=lambda p: p.stat().st_mtime)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise TilewiseError(f"cannot read {d}: {e.strerror or e}") from None
    return [restore_one(p, base) for p in paths]


def pending(base: Path | None = None) -> list[Journal]:
    """Journals present now (any owner), for status displays."""
    base = base or state_dir()
    out = []
    for p in sorted((base / "journals").glob("*.json")):
        try:
            out.append(Journal.load(p))
        except (TilewiseError, FileNotFoundError):
            continue
    return out
