"""What the controller measures, read from /proc (through an injectable root, for tests).

- cpu: the average load u (percent) of the allocated cores caused by the target's threads:
  the CPU time all threads of the target's process tree ran during the interval, divided by
  (interval x allocated CPUs). Per-thread run time comes from /proc/PID/task/TID/schedstat
  (nanoseconds), or from utime+stime in .../stat (clock ticks) where schedstat is missing.
- pages: resident pages per NUMA node of the target's process tree, from /proc/PID/numa_maps
  (the adaptive mode's priority queue): private memory summed over the processes, shared memory
  (mapped by several processes of the tree) counted once.
- traffic: the remote/local memory traffic ratio needs memory-controller hardware counters
  (uncore IMC on Intel, DF/UMC on AMD). Where they are absent it is reported unavailable with
  the reason; it is never estimated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tilewise.errors import TilewiseError
from tilewise import procs
from tilewise.procs import read_text

CLK_TCK = procs.TICKS_PER_S


class OpenBudget:
    """How many files the FdCaches of this process may keep open together: by default half the
    soft RLIMIT_NOFILE, so the daemon never runs out of descriptors for its other work."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit if limit is not None else self._default()
        self.used = 0

    @staticmethod
    def _default() -> int:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            soft = 1024
        return max(0, (soft if soft != -1 else 65536) // 2)


SHARED_BUDGET = OpenBudget()


def _pread_all(fd: int) -> bytes:
    data = os.pread(fd, 4096, 0)
    if len(data) < 4096:
        return data
    chunks, off = [data], len(data)
    while True:
        b = os.pread(fd, 65536, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)


class FdCache:
    """/proc files kept open between ticks: one pread from offset 0 re-generates a /proc file, so a
    read costs one system call instead of open + read + read + close (a quarter of the time).

    A file whose task has exited fails with ESRCH; read() then reopens the path once (the id may
    name a new task now) and raises OSError when that fails too. sweep() closes the files not read
    since the previous sweep (threads that are gone). At most half the process's open-file limit
    is kept open over all caches; past that, reads fall back to open/read/close.
    """

    def __init__(self, budget: OpenBudget | None = None) -> None:
        self._fds: dict[str, int] = {}
        self._used: set[str] = set()
        self.budget = budget or SHARED_BUDGET

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str) -> bytes:
        fd = self._fds.get(path)
        if fd is not None:
            try:
                data = _pread_all(fd)
                self._used.add(path)
                return data
            except OSError:
                self._drop(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            data = _pread_all(fd)
        except BaseException:
            os.close(fd)
            raise
        if self.budget.used < self.budget.limit:
            self._fds[path] = fd
            self._used.add(path)
            self.budget.used += 1
        else:
            os.close(fd)
        return data

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self.budget.used -= 1
            try:
                os.close(fd)
            except OSError:
                pass

    def sweep(self) -> None:
        """Close what was not read since the last sweep."""
        if len(self._used) != len(self._fds):
            for path in [p for p in self._fds if p not in self._used]:
                self._drop(path)
        self._used = set()

    def close(self) -> None:
        for path in list(self._fds):
            self._drop(path)
        self._used = set()


@dataclass
class ProcFS:
    root: str = "/proc"
    schedstat: bool = True  # False once a kernel without per-task schedstat was seen

    def _read(self, path: str, cache: FdCache | None = None) -> str:
        if cache is not None:
            return cache.read(path).decode("ascii", "replace")
        return read_text(path)  # os-level read: a third of open()'s cost

    def alive(self, pid: int, cache: FdCache | None = None) -> bool:
        try:
            st = self._read(f"{self.root}/{pid}/stat", cache)
        except OSError:
            return False
        fields = procs.stat_fields(st)
        return bool(fields) and fields[procs.STATE] not in ("Z", "X")  # zombies and the dead are gone

    def tids(self, pid: int) -> list[int]:
        try:
            return [int(x) for x in os.listdir(f"{self.root}/{pid}/task") if x.isdigit()]
        except OSError:
            return []

    def children(self, pid: int, tid: int, cache: FdCache | None = None) -> list[int]:
        try:
            return [int(x) for x in self._read(f"{self.root}/{pid}/task/{tid}/children", cache).split()]
        except (OSError, ValueError):
            return []

    def tree(self, pid: int, cache: FdCache | None = None) -> dict[int, int]:
        """tid -> pid for every thread of pid and of all its descendants."""
        out: dict[int, int] = {}
        todo, seen = [pid], set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            for t in self.tids(p):
                out[t] = p
                todo.extend(self.children(p, t, cache))
        return out

    def times_ns(self, pid: int, tid: int, cache: FdCache | None = None) -> tuple[int, int] | None:
        """(ns run on a CPU, ns runnable but waiting in a run queue), cumulative, for one thread.

        The wait part comes from schedstat; where only .../stat exists it is 0 (not measured).
        """
        base = f"{self.root}/{pid}/task/{tid}"
        if self.schedstat:
            try:
                f = self._read(base + "/schedstat", cache).split()
                return int(f[0]), int(f[1])
            except FileNotFoundError:
                pass  # no schedstat here, or the task is gone: .../stat tells which
            except (OSError, ValueError, IndexError):
                return None
        try:
            ns = procs.cpu_ticks(procs.stat_fields(self._read(base + "/stat", cache))) * 1_000_000_000 // CLK_TCK, 0
        except (OSError, ValueError, IndexError):
            return None
        self.schedstat = False  # the task lives but has no schedstat: this kernel keeps none
        return ns

    def times(self, tasks: dict[int, int], cache: FdCache | None = None) -> dict[int, tuple[int, int]]:
        """times_ns of every thread in tasks (tid -> pid); threads that are gone are left out.
        With a cache, files stay open between calls and the ones of exited threads are closed."""
        out = {}
        if cache is None or not self.schedstat:
            for tid, pid in tasks.items():
                ns = self.times_ns(pid, tid, cache)
                if ns is not None:
                    out[tid] = ns
            if cache is not None:
                cache.sweep()
            return out
        # the hot loop of a tick (one pread per thread): inlined, slow cases go through times_ns
        fds, used, root, pread = cache._fds, cache._used, self.root, os.pread
        for tid, pid in tasks.items():
            path = f"{root}/{pid}/task/{tid}/schedstat"
            fd = fds.get(path)
            if fd is not None:
                try:
                    f = pread(fd, 256, 0).split()
                    out[tid] = (int(f[0]), int(f[1]))
                    used.add(path)
                    continue
                except (OSError, ValueError, IndexError):
                    pass
            ns = self.times_ns(pid, tid, cache)  # first read, a reused id, or a task that is gone
            if ns is not None:
                out[tid] = ns
        cache.sweep()
        return out

    def _read_all(self, path: str) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    return b"".join(chunks)
                chunks.append(b)
        except OSError:
            return None
        finally:
            os.close(fd)

    def cpu_ticks(self, pid: int, cache: FdCache | None = None) -> int | None:
        """utime + stime + cutime + cstime of a process (clock ticks): its threads, the exited ones
        included, and the children it has reaped. None when it is gone."""
        try:
            return procs.cpu_ticks(procs.stat_fields(self._read(f"{self.root}/{pid}/stat", cache)), reaped=True)
        except (OSError, ValueError, IndexError):
            return None

    def numa_pages(self, pid: int) -> dict[int, int]:
        """Pages per NUMA node summed over the mappings of /proc/PID/numa_maps ({} when it is gone)."""
        raw = self._read_all(f"{self.root}/{pid}/numa_maps")
        return {} if raw is None else procs.numa_page_counts(raw)

    def numa_mappings(self, pid: int) -> tuple[dict[int, int], dict[tuple, dict[int, int]]]:
        """procs.numa_mappings of /proc/PID/numa_maps: (own pages per node, {shared segment: pages per node})."""
        raw = self._read_all(f"{self.root}/{pid}/numa_maps")
        return ({}, {}) if raw is None else procs.numa_mappings(raw)

    def tree_pages(self, pids) -> dict[int, int]:
        """Resident pages per node of a process tree, each page counted once (tree_pages())."""
        return tree_pages([self.numa_mappings(p) for p in pids])


def tree_pages(per_process: list[tuple[dict[int, int], dict[tuple, dict[int, int]]]]) -> dict[int, int]:
    """Pages per NUMA node of a process tree (the adaptive mode's priority queue) from each
    process's (private, shared) pages (ProcFS.numa_mappings): private memory summed over the
    processes; a shared object (a postmaster's shared buffers that every backend maps, a library)
    counted once, with per node the most any one process has mapped (a lower bound of their
    union: numa_maps counts the pages in each process's own page tables, not which ones)."""
    total: dict[int, int] = {}
    objects: dict[tuple, dict[int, int]] = {}
    for private, shared in per_process:
        for n, c in private.items():
            total[n] = total.get(n, 0) + c
        for obj, nodes in shared.items():
            seen = objects.setdefault(obj, {})
            for n, c in nodes.items():
                if c > seen.get(n, 0):
                    seen[n] = c
    for nodes in objects.values():
        for n, c in nodes.items():
            total[n] = total.get(n, 0) + c
    return {n: c for n, c in sorted(total.items()) if c > 0}


def cgroup_tasks(path: str) -> list[int]:
    """Thread ids in a cgroup (v1 `tasks`, v2 `cgroup.threads`)."""
    for name in ("tasks", "cgroup.threads"):
        try:
            with open(os.path.join(path, name)) as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            continue
    raise TilewiseError(f"{path} is not a cgroup directory (no tasks or cgroup.threads)",
                        "give the cgroup's directory, e.g. /sys/fs/cgroup/cpuset/mydb")


@dataclass
class CpuMeter:
    """Turns cumulative per-thread times into the load of the allocated CPUs over an interval.

    busy: percent of the allocated CPUs' time the target's threads ran.
    demand: the same plus the time they were runnable but waited for a CPU (the run-queue
    part of a load average). On a core shared with other work a single busy thread shows
    busy 50 % but demand 100 %: it wants a core it does not get. The controller uses demand
    (clamped to 100); both are logged.
    """

    last: dict[int, tuple[int, int]] = field(default_factory=dict)
    last_t: float | None = None

    def sample(self, times: dict[int, tuple[int, int]], now: float, n_cpus: int) -> dict | None:
        """times: tid -> (run ns, wait ns), cumulative. None on the first call."""
        prev_t, self.last_t = self.last_t, now
        prev, self.last = self.last, times
        if prev_t is None or now <= prev_t:
            return None
        dt_ns = (now - prev_t) * 1e9
        run = wait = 0
        get = prev.get
        for tid, rw in times.items():
            before = get(tid)
            if before is None:  # a thread born during the interval lived at most the interval
                run += min(rw[0], dt_ns)
                wait += min(rw[1], dt_ns)
                continue
            dr, dw = rw[0] - before[0], rw[1] - before[1]
            if dr > 0:
                run += dr
            if dw > 0:
                wait += dw
        cap = dt_ns * max(1, n_cpus)
        return {"busy": 100.0 * run / cap, "demand": 100.0 * (run + wait) / cap, "threads": len(times)}


def traffic_availability(sysfs_root: str = "/sys") -> tuple[bool, str]:
    """Is the remote/local memory traffic metric measurable here? (False, reason) when it is not."""
    devdir = os.path.join(sysfs_root, "bus/event_source/devices")
    try:
        pmus = os.listdir(devdir)
    except OSError:
        return False, f"no perf event sources ({devdir} unreadable)"
    memctl = [p for p in pmus if p.startswith(("uncore_imc", "amd_df", "amd_umc", "uncore_upi", "arm_cmn"))]
    if not memctl:
        core = "cpu" in pmus or any(p.startswith(("cpu_core", "armv8")) for p in pmus)
        what = "no hardware performance counters at all" if not core else "core counters only"
        return False, (f"not measured: no memory-controller PMU (uncore_imc/amd_df/amd_umc) in {devdir}; "
                       f"{what} on this machine")
    return False, (f"not measured: memory-controller PMUs found ({', '.join(sorted(memctl)[:4])}) but reading "
                   "remote/local traffic from them is not implemented yet; use --metric cpu")


def tree_cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """CPU seconds a process tree has used so far, exited members included: for every live process
    of the tree (pid and its descendants) its own user + system time and its reaped children's
    (cutime + cstime: a postmaster that reaps a backend adds the backend's time to its own). None
    when pid is gone."""
    table = procs.scan(proc)
    if pid not in table:
        return None
    fs = ProcFS(proc)
    ticks = [fs.cpu_ticks(p) for p in [pid, *procs.descendants([pid], table)]]
    return sum(t for t in ticks if t is not None) / CLK_TCK  # one gone meanwhile: its parent has it once reaped
