"""Processes as /proc shows them: identity, groups, descendants, environment tokens.

A process is named by (pid, start time): the start time is field 22 of /proc/PID/stat (clock
ticks since boot), so a pid the kernel reused for another process never matches. Everything here
reads through an injectable /proc root and never signals anything (that is launch.stop's job).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


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


def parse_stat(pid: int, text: str) -> Stat | None:
    """/proc/PID/stat: the command name is in parentheses and may itself contain ') '."""
    lp, rp = text.find("("), text.rfind(")")
    if lp < 0 or rp < lp:
        return None
    rest = text[rp + 2:].split()
    try:
        # fields after comm: 3 state, 4 ppid, 5 pgrp, 6 session, ... 22 starttime
        return Stat(pid, text[lp + 1:rp], rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def stat(pid: int, proc: str = "/proc") -> Stat | None:
    try:
        return parse_stat(pid, read_text(f"{proc}/{pid}/stat"))
    except OSError:
        return None


def start_time(pid: int, proc: str = "/proc") -> int | None:
    st = stat(pid, proc)
    return None if st is None else st.start


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


def environ_has(pid: int, var: str, token: str, proc: str = "/proc") -> bool:
    """Whether the process was started with `var` containing `token` (colon-separated list)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            value = _env_value(f.read(), var)
    except OSError:
        return False
    return value is not None and token.encode() in value.split(b":")


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
