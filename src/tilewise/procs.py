"""Processes as /proc shows them (identity, groups, descendants, environment tokens), and the
one way tilewise stops them (whole trees).

A process is named by (pid, start time): the start time is field 22 of /proc/PID/stat (clock
ticks since boot), so a pid the kernel reused for another process never matches. This is the one
process identity in tilewise (``ProcId``): nothing compares psutil's create_time or pids alone.
Everything reads through an injectable /proc root.

Stopping (``stop``), as systemd's KillMode=control-group: take the set of processes (the group,
every descendant, every process carrying the token) BEFORE signalling; SIGTERM the group and the
strays that left it; wait a grace period; SIGKILL what is left; then check again and report what
was stopped and what survived. A single process is signalled through a pidfd after its start
time was checked, so a reused pid is never signalled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tilewise import signals

SPAWN_VAR = "TILEWISE_SPAWN"  # colon-separated tokens of every tilewise spawn a process descends from
GRACE_S = 5.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the kernel to finish them
TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # the unit of /proc/PID/stat's start time
CREATE_TIME_SLACK_S = 1.0  # see ProcId.recorded


@dataclass(frozen=True, order=True)
class ProcId:
    """One process, for good: its pid and its start time (clock ticks since boot)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int, proc: str = "/proc") -> ProcId | None:
        st = stat(pid, proc)
        return None if st is None else cls(pid, st.start)

    def alive(self, proc: str = "/proc") -> bool:
        """Still running (same pid, same start time, not a zombie)."""
        st = stat(self.pid, proc)
        return st is not None and st.start == self.start and st.state not in "ZX"

    def exists(self, proc: str = "/proc") -> bool:
        """Still in the process table (zombies included): its pid cannot have been reused."""
        st = stat(self.pid, proc)
        return st is not None and st.start == self.start

    def wall_clock(self, proc: str = "/proc") -> float | None:
        """When it started, in seconds since the epoch (what psutil calls create_time): boot time
        plus its start ticks. None when the boot time cannot be read."""
        boot = boot_time(proc)
        return None if boot is None else boot + self.start / TICKS_PER_S

    @classmethod
    def recorded(cls, pid: int, start: int | None = None, create_time: float | None = None,
                 proc: str = "/proc") -> ProcId | None:
        """The process a record names. Records carry (pid, start); records written before start
        times were kept carry only a wall-clock create time (psutil's, seconds since the epoch):
        such a record names the process now at pid if it started within CREATE_TIME_SLACK_S of it
        (both are boot time + start ticks, and the kernel's boot time moves when the clock is
        stepped), else nothing (None: that process is gone). A record with neither names nothing."""
        if start is not None:
            return cls(int(pid), int(start))
        if create_time is None:
            return None
        now = cls.of(int(pid), proc)
        wall = now.wall_clock(proc) if now else None
        return now if wall is not None and abs(wall - float(create_time)) <= CREATE_TIME_SLACK_S else None

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, d: dict) -> ProcId:
        return cls(int(d["pid"]), int(d["start"]))


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int

    @property
    def id(self) -> ProcId:
        return ProcId(self.pid, self.start)


def read_text(path: str) -> str:
    """A whole small /proc or /sys file, with os-level calls (a third of open()'s cost)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


# /proc/PID/stat's fields after the command name, counted from 0 (proc(5) numbers them from 1: STATE
# is its field 3, STARTTIME its field 22). Times are in clock ticks (TICKS_PER_S).
STATE, PPID, PGRP, SESSION, FLAGS, UTIME, STIME, CUTIME, CSTIME, STARTTIME = 0, 1, 2, 3, 6, 11, 12, 13, 14, 19


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc/PID/stat (or .../task/TID/stat) text after the command name, which sits
    in parentheses and may itself contain ') '; [] when the text has no command name."""
    rp = text.rfind(")")
    return text[rp + 2:].split() if rp >= 0 else []


def cpu_ticks(fields: list[str], *, reaped: bool = False) -> int:
    """utime + stime of stat_fields (clock ticks); reaped: plus the children it has waited for."""
    ticks = int(fields[UTIME]) + int(fields[STIME])
    return ticks + (int(fields[CUTIME]) + int(fields[CSTIME]) if reaped else 0)


def parse_stat(pid: int, text: str) -> Stat | None:
    lp = text.find("(")
    rest = stat_fields(text)
    if lp < 0 or not rest:
        return None
    try:
        return Stat(pid, text[lp + 1:text.rfind(")")], rest[STATE], int(rest[PPID]), int(rest[PGRP]),
                    int(rest[SESSION]), int(rest[STARTTIME]))
    except (IndexError, ValueError):
        return None


def stat(pid: int, proc: str = "/proc") -> Stat | None:
    try:
        return parse_stat(pid, read_text(f"{proc}/{pid}/stat"))
    except OSError:
        return None


def status(pid, proc: str = "/proc") -> dict[str, str]:
    """/proc/PID/status as key -> value (pid may be "self"); OSError when it cannot be read."""
    out = {}
    with open(f"{proc}/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def start_time(pid: int, proc: str = "/proc") -> int | None:
    st = stat(pid, proc)
    return None if st is None else st.start


def boot_time(proc: str = "/proc") -> float | None:
    """The kernel's boot time in seconds since the epoch (btime in /proc/stat)."""
    try:
        for line in read_text(f"{proc}/stat").splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def boot_id(proc: str = "/proc") -> str | None:
    try:
        return read_text(f"{proc}/sys/kernel/random/boot_id").strip() or None
    except OSError:
        return None


def command(pid: int, proc: str = "/proc", limit: int = 80) -> str:
    """The command line (shortened), else the name from stat, else '?'."""
    try:
        cmd = read_text(f"{proc}/{pid}/cmdline").replace("\0", " ").strip()
    except OSError:
        cmd = ""
    if not cmd:
        st = stat(pid, proc)
        cmd = f"[{st.comm}]" if st else "?"
    return shorten(cmd, limit)


def shorten(text: str, limit: int = 80) -> str:
    """Keep the start and the end (the program and its last arguments say the most)."""
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[len(text) - (limit - 3 - head):]


def describe(pid: int, proc: str = "/proc") -> str:
    st = stat(pid, proc)
    return f"pid {pid} ({st.comm})" if st else f"pid {pid}"


def scan(proc: str = "/proc") -> dict[int, Stat]:
    """One pass over the process table: pid -> Stat (processes that vanish meanwhile are skipped)."""
    out = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = stat(int(name), proc)
            if st is not None:
                out[st.pid] = st
    return out


def cmdline(pid: int, proc: str = "/proc") -> list[str]:
    """The process's arguments; [] when it is gone (or a kernel thread)."""
    try:
        return read_text(f"{proc}/{pid}/cmdline").rstrip("\0").split("\0")
    except OSError:
        return []


def tree_of(pid: int, proc: str = "/proc", table: dict[int, Stat] | None = None) -> list[int]:
    """pid and every live descendant of it, from one scan of the process table."""
    table = scan(proc) if table is None else table
    return sorted({pid} | descendants([pid], table)) if pid in table else []


def descendants(roots, table: dict[int, Stat]) -> set[int]:
    """Pids of every descendant of `roots` (not the roots themselves), from one scan's parent links."""
    kids: dict[int, list[int]] = {}
    for st in table.values():
        kids.setdefault(st.ppid, []).append(st.pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for k in kids.get(todo.pop(), ()):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def _env_value(env: bytes, var: str) -> bytes | None:
    key = var.encode() + b"="
    if env.startswith(key):
        i = 0
    else:
        i = env.find(b"\0" + key)
        if i < 0:
            return None
        i += 1
    return env[i + len(key):].split(b"\0", 1)[0]


def carrying(var: str, tokens, table: dict[int, Stat], proc: str = "/proc") -> dict[str, set[int]]:
    """token -> pids of live processes in `table` whose environment carries it (one read per process)."""
    tokens = set(tokens)
    out: dict[str, set[int]] = {t: set() for t in tokens}
    me = os.getpid()
    for pid, st in table.items():
        if pid == me or st.state in "ZX":
            continue
        try:
            with open(f"{proc}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        value = _env_value(env, var)
        if value is None:
            continue
        for t in value.decode("ascii", "replace").split(":"):
            if t in out:
                out[t].add(pid)
    return out


# ---- where a process's pages are (/proc/PID/numa_maps) ---------------------------------------------

_NODE_RE = re.compile(rb" N(\d+)=(\d+)")  # tokens are space-separated; the first is an address
# a line of numa_maps mapping shared memory: anonymous shared (/dev/zero), System V (/SYSV...), POSIX
# (/dev/shm/...) or a memfd: (address, file, the rest of the line)
_SHM_LINE_RE = re.compile(rb"^([0-9a-f]+) \S+ file=(/dev/zero\S*|/SYSV\S*|/dev/shm/\S*|/memfd:\S*)( [^\n]*)$", re.M)


def numa_page_counts(raw: bytes) -> dict[int, int]:
    """Pages per NUMA node summed over the mappings of a numa_maps text (pages of each mapping's own
    size: the N<node>=<pages> counts)."""
    sums: dict[bytes, int] = {}
    # findall on the raw bytes: a quarter of a match loop's time on a large process's maps
    for node, pages in _NODE_RE.findall(raw):
        sums[node] = sums.get(node, 0) + int(pages)
    return dict(sorted((int(n), c) for n, c in sums.items()))


def numa_mappings(raw: bytes) -> tuple[dict[int, int], dict[tuple, dict[int, int]]]:
    """A numa_maps text split in two: (the pages per node of the process's own memory, {segment: its
    pages per node} for each shared-memory mapping (a PostgreSQL server's shared buffers, POSIX and
    System V segments, memfds), which several processes of a tree map). A segment is named by its
    address and file: a server maps its shared memory before it forks, so its children map it at the
    same address. (Libraries' pages are shared too, but small next to a database's memory: they stay
    with each process, which keeps this to one pass over the file.)"""
    private = numa_page_counts(raw)  # everything, then the shared segments taken out
    shared: dict[tuple, dict[int, int]] = {}
    for start, file, rest in _SHM_LINE_RE.findall(raw):
        nodes = shared.setdefault((int(start, 16), file.decode(errors="replace")), {})
        for n, c in numa_page_counts(rest).items():
            nodes[n] = nodes.get(n, 0) + c
            private[n] -= c
    return private, shared


def numa_pages(pid: int, proc: str = "/proc") -> dict[int, int]:
    """Where a process's pages are now: numa_page_counts of /proc/PID/numa_maps. OSError when it
    cannot be read."""
    with open(f"{proc}/{pid}/numa_maps", "rb") as f:
        return numa_page_counts(f.read())


# ---- process trees, and stopping them --------------------------------------------------------------

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


def members(trees: Sequence[Tree], proc: str = "/proc") -> dict[ProcId, Stat]:
    """The live processes of the trees now: groups, token carriers, and all their descendants."""
    table = scan(proc)
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
        for pids in carrying(var, toks, table, proc).values():
            roots |= pids
    found = roots | descendants(roots, table)
    out = {}
    for pid in found:
        st = table.get(pid)
        if st is not None and pid != me and st.state not in "ZX":
            out[st.id] = st
    return out


def send(pid_id: ProcId, sig: int, proc: str = "/proc") -> None:
    """Signal exactly this process (never another that took its pid); never raises."""
    _signal(pid_id, sig, proc)


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
        if start_time(pid_id.pid, proc) == pid_id.start:
            signal.pidfd_send_signal(fd, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        os.close(fd)


def _reap(trees: Sequence[Tree]) -> None:
    for t in trees:
        if t.popen is not None:
            t.popen.poll()


def stop(trees, grace: float = GRACE_S, *, kill_wait: float = KILL_WAIT_S, proc: str = "/proc") -> StopReport:
    """Stop one or more process trees (Tree, anything with a ``tree()`` method such as launch's
    Child and Started, a Popen started in a session of its own, or a list of them); never raises.

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
    first = members(trees, proc)
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
        if sig == signal.SIGTERM:  # a stopped process (SIGSTOP) acts on SIGTERM only once it runs again
            for i, st in live.items():
                if st.state in ("T", "t"):
                    _signal(i, signal.SIGCONT, proc)
        deadline = time.monotonic() + wait
        next_scan = time.monotonic() + 0.2
        while True:
            _reap(trees)
            live = {i: s for i, s in live.items() if i.alive(proc)}
            if time.monotonic() >= next_scan or not live:  # newcomers (forked while dying)
                for i, s in members(trees, proc).items():
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
    left = {i for i in set(first) | set(live) if i.alive(proc)} | set(members(trees, proc))
    rep = StopReport()
    for i in sorted(set(first) | set(by) | left):
        item = {"pid": i.pid, "start": i.start, "name": names.get(i, "?"), "by": by.get(i, "exited")}
        (rep.survived if i in left else rep.stopped).append(item)
    return rep
