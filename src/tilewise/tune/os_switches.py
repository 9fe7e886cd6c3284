"""OS switches the in-memory analytics study (paper 003) tunes: Transparent Hugepages and AutoNUMA.

Every switch is a get/set pair read through an injected root directory (tests use a fake one).
A change is a `Change(key, path, old, new)`. The rules (after TuneD, done safer):

- read the current value before every write, and refuse to change what cannot be read back;
- a change to the value a switch already has records nothing (re-applying never records our own
  value as the "original");
- every old value goes to a versioned JSON journal on disk BEFORE the write (temp file, fsync,
  rename), so a crash of tilewise loses nothing: on start-up `recover()` undoes what a crashed run
  left, and `tilewise tune --restore` does it explicitly;
- undo runs in reverse order, one change at a time, and keeps going when one fails; what could not
  be undone stays in the journal.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from tilewise.fsutil import atomic_write_json
from tilewise.errors import TilewiseError, UsageError

JOURNAL_FORMAT = "tilewise-os-journal"
JOURNAL_VERSION = 1
JOURNAL_REL = "run/tilewise/os-journal.json"  # under the root: /run is reset at boot, like the switches


@dataclass(frozen=True)
class Switch:
    key: str
    rel_path: str  # relative to the root directory
    choices: tuple[str, ...]
    description: str

    def parse(self, text: str) -> str:
        """The current value from the file's text (THP shows "always [madvise] never")."""
        text = text.strip()
        if "[" in text:
            start, end = text.find("["), text.find("]")
            if end <= start:
                raise ValueError(f"malformed {self.key} value {text!r}")
            return text[start + 1:end]
        if not text:
            raise ValueError(f"empty {self.key} value")
        return text.split()[0]

    def normalise(self, value: str) -> str:
        v = str(value).strip().lower()
        if self.key == "autonuma":
            v = {"on": "1", "off": "0", "true": "1", "false": "0", "yes": "1", "no": "0"}.get(v, v)
        if v not in self.choices:
            raise UsageError(f"{self.key} cannot be set to {value!r}", f"choose one of {', '.join(self.display_choices())}")
        return v

    def display_choices(self) -> tuple[str, ...]:
        return ("on", "off") if self.key == "autonuma" else self.choices

    def display(self, value: str | None) -> str:
        if value is None:
            return "unknown"
        if self.key == "autonuma":
            return {"0": "off", "1": "on", "2": "on (tiering)", "3": "on (+tiering)"}.get(value, value)
        return value


SWITCHES: dict[str, Switch] = {
    "thp": Switch("thp", "sys/kernel/mm/transparent_hugepage/enabled", ("always", "madvise", "never"),
                  "Transparent Hugepages"),
    "autonuma": Switch("autonuma", "proc/sys/kernel/numa_balancing", ("0", "1"), "AutoNUMA balancing"),
}


@dataclass(frozen=True)
class Change:
    key: str
    path: str  # absolute path under the root
    old: str
    new: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class SwitchState:
    key: str
    path: str
    value: str | None  # None: could not be read
    shown: str
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class UndoReport:
    restored: list[Change] = field(default_factory=list)
    unchanged: list[Change] = field(default_factory=list)  # already had the old value
    failed: list[tuple[Change, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def lines(self) -> list[str]:
        out = [f"restored {c.key} ({c.path}) to {c.old} (was set to {c.new})" for c in self.restored]
        out += [f"{c.key} already back at {c.old}" for c in self.unchanged]
        out += [f"could not restore {c.key} ({c.path}) to {c.old}: {e}" for c, e in self.failed]
        return out + self.notes


class OsSwitches:
    """Read, change and restore THP and AutoNUMA under `root` ("/" for this machine)."""

    def __init__(self, root: str = "/", journal_path: str | None = None):
        self.root = root
        self.journal_path = journal_path or os.path.join(root, JOURNAL_REL)

    # ---- reading ---------------------------------------------------------------------------
    def path(self, key: str) -> str:
        return os.path.join(self.root, SWITCHES[key].rel_path)

    def read(self, key: str) -> str:
        sw = SWITCHES[key]
        p = self.path(key)
        try:
            with open(p) as f:
                return sw.parse(f.read())
        except OSError as e:
            raise TilewiseError(f"cannot read {sw.description} at {p}: {e.strerror or e}") from None
        except ValueError as e:
            raise TilewiseError(f"cannot parse {p}: {e}") from None

    def state(self) -> dict[str, SwitchState]:
        """Every switch's current value (shown always, whether or not anything is changed)."""
        out = {}
        for key, sw in SWITCHES.items():
            try:
                v = self.read(key)
                out[key] = SwitchState(key, self.path(key), v, sw.display(v))
            except TilewiseError as e:
                out[key] = SwitchState(key, self.path(key), None, "unknown", str(e))
        return out

    def boot_id(self) -> str | None:
        try:
            with open(os.path.join(self.root, "proc/sys/kernel/random/boot_id")) as f:
                return f.read().strip() or None
        except OSError:
            return None

    # ---- planning and applying -------------------------------------------------------------
    def plan(self, desired: dict[str, str]) -> list[Change]:
        """The changes needed to reach `desired`; no-ops record nothing; unreadable -> refuse."""
        changes = []
        for key, value in desired.items():
            if key not in SWITCHES:
                raise UsageError(f"unknown OS switch {key!r}", f"choose from {', '.join(SWITCHES)}")
            new = SWITCHES[key].normalise(value)
            try:
                old = self.read(key)
            except TilewiseError as e:
                raise TilewiseError(f"refusing to change {key}: {e}", "a value that cannot be read cannot be restored") from None
            if old != new:
                changes.append(Change(key, self.path(key), old, new))
        return changes

    def check_permission(self) -> None:
        if os.path.abspath(self.root) == "/" and os.geteuid() != 0:
            raise UsageError("changing THP or AutoNUMA needs root", "re-run as root, or drop --apply-os")

    def _write(self, c: Change, value: str) -> None:
        try:
            with open(c.path, "w") as f:
                f.write(value + "\n")
        except OSError as e:
            raise TilewiseError(f"cannot write {value} to {c.path}: {e.strerror or e}") from None
        got = _read_path(c)
        if got != value:
            raise TilewiseError(f"wrote {value} to {c.path} but it reads back as {got}")

    def apply(self, changes: list[Change], journal: Journal) -> None:
        """Journal each change (on disk) before writing it. On a failed write, the caller undoes."""
        self.check_permission()
        for c in changes:
            journal.add(c)
            self._write(c, c.new)

    def undo(self, changes: list[Change]) -> UndoReport:
        """Restore old values in reverse order; keep going past failures."""
        rep = UndoReport()
        for c in reversed(changes):
            try:
                cur = _read_path(c)
                if cur == c.old:
                    rep.unchanged.append(c)
                    continue
                self._write(c, c.old)
                rep.restored.append(c)
            except TilewiseError as e:
                rep.failed.append((c, str(e)))
        return rep

    # ---- the journal's life cycle --------------------------------------------------------------
    def recover(self) -> UndoReport | None:
        """Undo what a crashed run left in the journal; None when there was no journal."""
        j = Journal.load(self.journal_path)
        if j is None:
            return None
        if j.pid != os.getpid() and _alive(j.pid):
            raise UsageError(f"another tilewise run (pid {j.pid}) has OS switches changed (journal {self.journal_path})",
                             "wait for it to finish, or stop it and run `tilewise tune --restore`")
        here = self.boot_id()
        if j.boot_id and here and j.boot_id != here:
            j.remove()
            rep = UndoReport()
            rep.notes.append(f"discarded a journal from an earlier boot ({self.journal_path}): "
                             "the kernel reset the switches when it rebooted")
            return rep
        rep = self.undo(j.changes)
        j.keep_only([c for c, _ in rep.failed])
        return rep

    @contextmanager
    def applied(self, desired: dict[str, str]) -> Iterator[list[Change]]:
        """Apply `desired` for the duration of the block; always restore, also on errors/Ctrl-C."""
        self.check_permission()
        leftover = self.recover()
        if leftover and (leftover.restored or leftover.failed):
            for line in leftover.lines():
                print(f"tilewise: recovered a crashed run: {line}", flush=True, file=_stderr())
            if leftover.failed:
                raise TilewiseError("could not undo what a crashed run left: " + "; ".join(e for _, e in leftover.failed),
                                    f"fix it by hand, then delete {self.journal_path}")
        changes = self.plan(desired)
        journal = Journal.create(self.journal_path, self.boot_id())
        report: UndoReport | None = None
        try:
            self.apply(changes, journal)
            yield changes
        finally:
            report = self.undo(journal.changes)
            journal.keep_only([c for c, _ in report.failed])
            if report.failed:
                raise TilewiseError("OS switches not restored: " + "; ".join(e for _, e in report.failed),
                                    f"run `tilewise tune --restore` as root (journal {self.journal_path})")


def _read_path(c: Change) -> str:
    sw = SWITCHES[c.key]
    try:
        with open(c.path) as f:
            return sw.parse(f.read())
    except (OSError, ValueError) as e:
        raise TilewiseError(f"cannot read {c.path}: {e}") from None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a recycled pid that is not tilewise does not hold the journal
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"tilewise" in f.read()
    except OSError:
        return False


def _stderr():
    import sys

    return sys.stderr


class Journal:
    """The on-disk undo record: written (temp file, fsync, rename) before every switch write."""

    def __init__(self, path: str, pid: int, boot_id: str | None, changes: list[Change], created: float):
        self.path = path
        self.pid = pid
        self.boot_id = boot_id
        self.changes = changes
        self.created = created

    @classmethod
    def create(cls, path: str, boot_id: str | None) -> Journal:
        return cls(path, os.getpid(), boot_id, [], time.time())

    @classmethod
    def load(cls, path: str) -> Journal | None:
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            raise TilewiseError(f"cannot read the OS switch journal {path}: {e}",
                                "restore THP/AutoNUMA by hand, then delete it") from None
        if not isinstance(doc, dict) or doc.get("format") != JOURNAL_FORMAT:
            raise TilewiseError(f"{path} is not a tilewise OS switch journal")
        if doc.get("version") != JOURNAL_VERSION:
            raise TilewiseError(f"OS switch journal {path} has version {doc.get('version')}; this tilewise reads {JOURNAL_VERSION}",
                                "restore with the tilewise that wrote it")
        try:
            changes = [Change(c["key"], c["path"], c["old"], c["new"]) for c in doc["changes"]]
            for c in changes:
                if c.key not in SWITCHES:
                    raise KeyError(c.key)
        except (KeyError, TypeError) as e:
            raise TilewiseError(f"OS switch journal {path} is malformed ({e})") from None
        return cls(path, int(doc.get("pid", 0)), doc.get("boot_id"), changes, float(doc.get("created", 0)))

    def to_json(self) -> dict:
        return {"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION, "pid": self.pid, "boot_id": self.boot_id,
                "created": self.created, "changes": [c.to_json() for c in self.changes]}

    def add(self, c: Change) -> None:
        self.changes.append(c)
        self.save()

    def save(self) -> None:
        try:
            atomic_write_json(self.path, self.to_json(), mode=0o600)
        except OSError as e:
            raise TilewiseError(f"cannot write the OS switch journal {self.path}: {e.strerror or e}",
                                "nothing was changed") from None

    def keep_only(self, changes: list[Change]) -> None:
        """After an undo: drop the journal, or keep just what could not be restored."""
        if changes:
            self.changes = list(changes)
            self.save()
        else:
            self.remove()

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        d = os.path.dirname(self.path)
        if os.path.basename(d) == "tilewise":  # our own directory goes too when empty
            try:
                os.rmdir(d)
            except OSError:
                pass
