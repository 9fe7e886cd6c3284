"""A synthetic /proc for a target with many threads: what the elastic daemon reads, in a temp tree.

Used by `tilewise bench elastic-tick` (the controller's cost at 256 CPUs, which this machine does
not have) and by the tests. It writes, for each process P of the target and each of its threads T:

    P/stat  P/status  P/numa_maps  P/task/T/{stat,schedstat,status,children}

in the kernel's formats (stat: 52 fields, state after the ")" closing comm; schedstat:
"run_ns wait_ns timeslices"; numa_maps: one line per mapping with N<node>=<pages>). /proc/stat is
not written: the daemon does not read it.

With schedstat=False no schedstat file is written (a kernel without schedstats) and advance()
updates utime/stime in each thread's stat instead; otherwise stat keeps the times it was created
with. Counters are updated in place (same inode, rewritten from offset 0 and truncated), as the kernel's
files behave for a reader that keeps them open. Thread ids start at 10,000,000, above any pid_max,
so no tid can name a real task of this machine even if a caller forgets it is synthetic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import procs

FIRST_ID = 10_000_000
CLK_TCK = procs.TICKS_PER_S


@dataclass
class _Task:
    pid: int
    tid: int
    run_ns: int = 0
    wait_ns: int = 0
    slices: int = 0


@dataclass
class SyntheticProc:
    """A process tree: ``processes`` x ``threads`` each; the first process is the target's root,
    the others are its children (spawned by its main thread)."""

    root: Path
    threads: int = 16
    processes: int = 1
    nodes: int = 1
    mappings: int = 500  # lines in each numa_maps (a large DBMS has hundreds to thousands)
    schedstat: bool = True  # False: a kernel without per-task schedstat (readers fall back to stat)
    comm: str = "tw-synthetic"
    start_ticks: int = 123456
    pids: list[int] = field(default_factory=list)
    tasks: dict[int, _Task] = field(default_factory=dict)  # tid -> task
    count: dict[int, int] = field(default_factory=dict)  # pid -> threads
    pages: dict[int, int] = field(default_factory=dict)  # node -> resident pages of the whole tree

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.threads < 1 or self.processes < 1 or self.nodes < 1:
            raise ValueError("threads, processes and nodes must be >= 1")
        nid = FIRST_ID
        for _ in range(self.processes):
            pid = nid
            self.pids.append(pid)
            for k in range(self.threads):
                self.tasks[nid] = _Task(pid, nid)
                nid += 1
            self.count[pid] = self.threads
        if not self.pages:
            self.pages = {n: 262144 * (n + 1) for n in range(self.nodes)}
        for pid in self.pids:
            self._write_process(pid)
        for t in self.tasks.values():
            self._write_task(t)

    # ---- what the tree holds -----------------------------------------------------------------
    @property
    def pid(self) -> int:
        """The target's root process."""
        return self.pids[0]

    def tids(self, pid: int | None = None) -> list[int]:
        return [t.tid for t in self.tasks.values() if pid is None or t.pid == pid]

    # ---- changing it -------------------------------------------------------------------------
    def advance(self, dt_s: float, demand: float, cores: int) -> None:
        """dt_s seconds pass with `demand` cores' worth of runnable threads on `cores` CPUs: the
        running part (min(demand, cores)) and the waiting part are shared evenly by the threads."""
        n = len(self.tasks)
        run = min(demand, cores) * dt_s * 1e9 / n
        wait = max(0.0, demand - cores) * dt_s * 1e9 / n
        for t in self.tasks.values():
            t.run_ns += int(run)
            t.wait_ns += int(wait)
            t.slices += 1 if run > 0 else 0
            if self.schedstat:  # what a reader uses; stat keeps its times from creation
                _rewrite(self._p(t.pid, "task", str(t.tid), "schedstat"), f"{t.run_ns} {t.wait_ns} {t.slices}\n")
            else:
                self._write_task(t, full=False)

    def add_thread(self, pid: int | None = None) -> int:
        pid = self.pid if pid is None else pid
        tid = max(self.tasks) + 1
        self.tasks[tid] = _Task(pid, tid)
        self.count[pid] += 1
        self._write_task(self.tasks[tid])
        self._write_process(pid)
        return tid

    def remove_thread(self, tid: int) -> None:
        t = self.tasks.pop(tid)
        self.count[t.pid] -= 1
        d = self.root / str(t.pid) / "task" / str(tid)
        for name in os.listdir(d):
            os.truncate(d / name, 0)  # a reader holding it open reads nothing, as from an exited task
            os.unlink(d / name)
        os.rmdir(d)
        self._write_process(t.pid)

    # ---- the files ---------------------------------------------------------------------------
    def _p(self, pid: int, *parts: str) -> Path:
        return self.root.joinpath(str(pid), *parts)

    def _write_process(self, pid: int) -> None:
        (self._p(pid, "task")).mkdir(parents=True, exist_ok=True)
        n = self.count[pid]
        ppid = 1 if pid == self.pid else self.pid
        _rewrite(self._p(pid, "stat"), _stat(pid, self.comm, ppid, 0, 0, n, self.start_ticks))
        _rewrite(self._p(pid, "status"), _status(pid, pid, ppid, self.comm, n))
        _rewrite(self._p(pid, "numa_maps"), self._numa_maps(pid))

    def _write_task(self, t: _Task, full: bool = True) -> None:
        d = self._p(t.pid, "task", str(t.tid))
        if full:
            d.mkdir(parents=True, exist_ok=True)
            ppid = 1 if t.pid == self.pid else self.pid
            _rewrite(d / "status", _status(t.tid, t.pid, ppid, self.comm, self.count[t.pid]))
            kids = [p for p in self.pids[1:]] if t.tid == self.pid else []
            _rewrite(d / "children", "".join(f"{k} " for k in kids))
        ticks = t.run_ns * CLK_TCK // 1_000_000_000
        _rewrite(d / "stat", _stat(t.tid, self.comm, 1 if t.pid == self.pid else self.pid, ticks - ticks // 10,
                                   ticks // 10, self.count[t.pid], self.start_ticks))
        if self.schedstat:
            _rewrite(d / "schedstat", f"{t.run_ns} {t.wait_ns} {t.slices}\n")

    def _numa_maps(self, pid: int) -> str:
        """`mappings` lines whose N<node>= counts add up to this process's share of self.pages."""
        share = {n: p // len(self.pids) for n, p in self.pages.items()}
        lines = []
        base = 0x7F0000000000
        m = self.mappings
        for i in range(m):
            counts = {n: c // m + (1 if i < c % m else 0) for n, c in share.items()}
            total = sum(counts.values())
            nodes = " ".join(f"N{n}={c}" for n, c in sorted(counts.items()) if c)
            lines.append(f"{base + i * 0x200000:x} default anon={total} dirty={total} active=0 "
                         f"{nodes} kernelpagesize_kB=4".replace("  ", " "))
        lines.append("55d4c0a00000 default file=/usr/bin/python3.11 mapped=800 mapmax=2 N0=800 kernelpagesize_kB=4")
        return "\n".join(lines) + "\n"


def _stat(tid: int, comm: str, ppid: int, utime: int, stime: int, threads: int, start: int) -> str:
    # fields 1..52 of /proc/PID/stat (proc(5)); unneeded ones are plausible constants
    f = [str(tid), f"({comm})", "R", str(ppid), str(ppid), str(ppid), "0", "-1", "4194304", "1000", "0", "0", "0",
         str(utime), str(stime), "0", "0", "20", "0", str(threads), "0", str(start), "1073741824", "262144",
         "18446744073709551615"] + ["0"] * 27
    return " ".join(f) + "\n"


def _status(tid: int, tgid: int, ppid: int, comm: str, threads: int) -> str:
    return (f"Name:\t{comm}\nState:\tR (running)\nTgid:\t{tgid}\nNgid:\t0\nPid:\t{tid}\nPPid:\t{ppid}\n"
            f"TracerPid:\t0\nThreads:\t{threads}\nCpus_allowed_list:\t0-255\nMems_allowed_list:\t0-7\n")


def _rewrite(path: Path, text: str) -> None:
    """Replace a file's content in place (same inode: a reader keeping it open sees the new text)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
