"""Measuring one query on one layout: its time, the bytes its deployment read from storage, and the
CPU-seconds it spent (the local analogue of the thesis's cost: query services bill the bytes scanned,
a machine pays in CPU time and I/O).

- **time**: the engine's own time for the query (QueryResult.elapsed_s).
- **bytes read**: the difference of ``read_bytes`` in /proc/<pid>/io, summed over the deployment's
  processes (servers, workers, executors: Runtime.processes()): what the block layer read for them.
  It means "from storage" only when the files are not in the page cache, so before every run the
  page cache is dropped: per file with posix_fadvise(POSIX_FADV_DONTNEED) over every file of the
  layout (``files``: any user may, and nothing else on the machine is disturbed), or system-wide
  (``system``: sync, then 1 > /proc/sys/vm/drop_caches; root only, and every other process loses
  its cache too), or not at all (``none``: a warm cache, bytes read then near zero; ``rchar``, the
  bytes the processes asked for, still says how much they read). Results say which.
- **CPU-seconds**: the difference of the time the processes' threads ran, summed over the same
  processes: /proc/<pid>/task/<tid>/schedstat (nanoseconds; the same source the elastic allocator
  reads), else utime + stime of /proc/<pid>/stat (clock ticks of 10 ms: too coarse for queries of
  a few milliseconds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tilewise import procs
from tilewise.errors import UsageError

DROPS = ("files", "system", "none")
DESCRIBE = {
    "files": "page cache dropped before every run, per file of the layout (posix_fadvise DONTNEED)",
    "system": "page cache dropped before every run, system-wide (sync; /proc/sys/vm/drop_caches)",
    "none": "warm page cache (not dropped): bytes read from storage are near zero, bytes requested still count",
}


def check_drop(mode: str, *, euid: int | None = None) -> str:
    if mode not in DROPS:
        raise UsageError(f"unknown --drop {mode!r}", f"use one of {', '.join(DROPS)}")
    if mode == "system" and (os.geteuid() if euid is None else euid) != 0:
        raise UsageError("--drop system writes /proc/sys/vm/drop_caches, which needs root",
                         "run as root, or use --drop files (per file, any user)")
    return mode


def drop_cache(files, mode: str) -> None:
    """Evict the files' pages (mode files) or the whole page cache (mode system) before a run."""
    if mode == "files":
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    elif mode == "system":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")


@dataclass(frozen=True)
class Counters:
    read_bytes: int = 0
    rchar: int = 0
    cpu_ns: int = 0
    readable: bool = True  # every process's counters could be read

    def __sub__(self, o: Counters) -> Counters:
        return Counters(self.read_bytes - o.read_bytes, self.rchar - o.rchar, self.cpu_ns - o.cpu_ns,
                        self.readable and o.readable)


def _cpu_ns(proc: str, pid: int) -> int:
    """Nanoseconds the process's live threads ran (schedstat), else its utime + stime in ns."""
    total, found = 0, False
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
                found = True
        except (OSError, ValueError, IndexError):
            continue
    if found:
        return total
    return procs.cpu_ticks(procs.stat_fields(procs.read_text(f"{proc}/{pid}/stat"))) * 1_000_000_000 // procs.TICKS_PER_S


def counters(pids, proc: str = "/proc") -> Counters:
    """Summed I/O and CPU counters of the processes (a process that is gone counts nothing)."""
    rb = rc = ns = 0
    ok = True
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/io") as f:
                io = {k: int(v) for k, v in (ln.split(":") for ln in f if ":" in ln)}
            cpu = _cpu_ns(proc, pid)
        except FileNotFoundError:
            continue
        except (PermissionError, ValueError):
            ok = False
            continue
        rb += io.get("read_bytes", 0)
        rc += io.get("rchar", 0)
        ns += cpu
    return Counters(rb, rc, ns, ok)


@dataclass
class Sample:
    time_s: float
    bytes_read: int
    bytes_requested: int
    cpu_s: float


def run(runtime, sql: str, *, files, drop: str, timeout_s: float | None = None):
    """One measured run: drop the cache, read the counters, run, read them again.
    Returns (QueryResult, Sample)."""
    drop_cache(files, drop)
    pids = runtime.processes()
    before = counters(pids)
    r = runtime.run_query(sql, timeout_s=timeout_s)
    after = counters(runtime.processes())
    d = after - before
    return r, Sample(r.elapsed_s, max(0, d.read_bytes), max(0, d.rchar), max(0, d.cpu_ns) / 1e9)
