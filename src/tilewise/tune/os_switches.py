"""OS switches the in-memory analytics study (paper 003) tunes: Transparent Hugepages and AutoNUMA.

Every switch is one value in a sysfs/procfs file, read through an injected root directory (tests
use a fake one), and every change goes through the one change-and-undo layer (tilewise.changes):
the old value is read first (what cannot be read is not changed), a switch already at the wanted
value records nothing, the journal is on disk before the write, the write is read back, undo runs
in reverse order past failures with signals held, and each switch file is locked for the run: a
second `--apply-os` run refuses, naming the first. What a killed run left, `tilewise restore`
undoes (and so does the next run that takes the same switch).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from tilewise import admission, changes
from tilewise.errors import TilewiseError, UsageError
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


@dataclass
class SwitchState:
    key: str
    path: str
    value: str | None  # None: could not be read
    shown: str
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


class OsSwitches:
    """Read, change and restore THP and AutoNUMA under `root` ("/" for this machine)."""

    def __init__(self, root: str = "/"):
        self.root = root
        self.session: changes.Session | None = None

    # ---- reading ---------------------------------------------------------------------------
    def path(self, key: str) -> str:
        import os

        return os.path.join(self.root, SWITCHES[key].rel_path)

    def target(self, key: str) -> changes.FileValue:
        sw = SWITCHES[key]
        return changes.FileValue(self.path(key), "bracketed" if key == "thp" else "plain", sw.description)

    def read(self, key: str) -> str:
        sw = SWITCHES[key]
        try:
            return self.target(key).get("value")
        except (OSError, changes.Gone) as e:
            raise TilewiseError(f"cannot read {sw.description} at {self.path(key)}: {getattr(e, 'strerror', None) or e}") from None

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

    # ---- planning and applying -------------------------------------------------------------
    def desired(self, desired: dict[str, str]) -> dict[str, str]:
        out = {}
        for key, value in desired.items():
            if key not in SWITCHES:
                raise UsageError(f"unknown OS switch {key!r}", f"choose from {', '.join(SWITCHES)}")
            out[key] = SWITCHES[key].normalise(value)
        return out

    def plan(self, desired: dict[str, str]) -> list[changes.Change]:
        """The changes needed to reach `desired`; no-ops record nothing; unreadable -> refuse."""
        out = []
        for key, new in self.desired(desired).items():
            c = changes.plan(self.target(key), "value", new)
            if c is not None:
                out.append(c)
        return out

    def check_permission(self, keys=None, caller: admission.Caller | None = None) -> None:
        """Admission: every switch file to be changed (default: all) must be writable (root, and a
        /sys and /proc not mounted read-only); else one line naming the file, its owner, what is
        missing and the way out, before anything is journaled or changed."""
        keys = list(keys) if keys is not None else list(SWITCHES)
        admission.check(admission.switch_refusals(
            caller or admission.caller(),
            [(SWITCHES[k].description, admission.access(self.path(k))) for k in keys if k in SWITCHES]))

    @contextmanager
    def controlling(self, keys, purpose: str) -> Iterator[OsSwitches]:
        """Hold the locks of these switches for the whole block (several applied() inside it)."""
        self.check_permission(keys)
        if self.session is not None:
            yield self
            return
        self.session = changes.Session(purpose)
        try:
            for key in keys:
                self.session.lock(self.target(key), f"{SWITCHES[key].description} ({self.path(key)})")
            for note in self.session.notes:
                _stderr().write(f"tilewise: {note}\n")
            with self.session:
                yield self
        finally:
            self.session = None

    @contextmanager
    def applied(self, desired: dict[str, str], purpose: str = "OS switches for a run") -> Iterator[list[changes.Change]]:
        """Apply `desired` for the duration of the block; always restore, also on errors/Ctrl-C."""
        want = self.desired(desired)
        with self.controlling(want, purpose):
            s = self.session
            made: list[changes.Change] = []
            try:
                for key, new in want.items():
                    c = s.change(self.target(key), "value", new)
                    if c is not None:
                        made.append(c)
                yield made
            finally:
                rep = s.undo()
                if not rep.ok:
                    raise TilewiseError("OS switches not restored: " + "; ".join(o.line() for o in rep.failed),
                                        f"run `tilewise restore` as root (journal {s.journal.path})")


def _stderr():
    import sys

    return sys.stderr
