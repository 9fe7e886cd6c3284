"""What the controller measures, read from /proc (through an injectable root, for tests).

- cpu: the average load u (percent) of the allocated cores caused by the target's threads:
  the CPU time all threads of the target's process tree ran during the interval, divided by
  (interval x allocated CPUs). Per-thread run time comes from /proc/PID/task/TID/schedstat
  (nanoseconds), or from utime+stime in .../stat (clock ticks) where schedstat is missing.
- pages: resident pages per NUMA node of the target's processes, from /proc/PID/numa_maps
  (the adaptive mode's priority queue).
- traffic: the remote/local memory traffic ratio needs memory-controller hardware counters
  (uncore IMC on Intel, DF/UMC on AMD). Where they are absent it is reported unavailable with
  the reason; it is never estimated.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from tilewise.errors import TilewiseError

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProcFS:
    root: str = "/proc"

    def _read(self, path: str) -> str:
        # os-level read: a third of open()'s cost, and a tick is mostly these small reads
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
        return b"".join(chunks).decode("ascii", "replace")

    def alive(self, pid: int) -> bool:
        try:
            st = self._read(f"{self.root}/{pid}/stat")
        except OSError:
            return False
        # state is the field after the ")" closing comm; Z (zombie) and X (dead) are gone
        state = st[st.rfind(")") + 2:st.rfind(")") + 3]
        return state not in ("Z", "X")

    def tids(self, pid: int) -> list[int]:
        try:
            return [int(x) for x in os.listdir(f"{self.root}/{pid}/task") if x.isdigit()]
        except OSError:
            return []

    def children(self, pid: int, tid: int) -> list[int]:
        try:
            return [int(x) for x in self._read(f"{self.root}/{pid}/task/{tid}/children").split()]
        except OSError:
            return []

    def tree(self, pid: int) -> dict[int, int]:
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
                todo.extend(self.children(p, t))
        return out

    def times_ns(self, pid: int, tid: int) -> tuple[int, int] | None:
        """(ns run on a CPU, ns runnable but waiting in a run queue), cumulative, for one thread.

        The wait part comes from schedstat; where only .../stat exists it is 0 (not measured).
        """
        base = f"{self.root}/{pid}/task/{tid}"
        try:
            f = self._read(base + "/schedstat").split()
            return int(f[0]), int(f[1])
        except (OSError, ValueError, IndexError):
            pass
        try:
            st = self._read(base + "/stat")
            fields = st[st.rfind(")") + 2:].split()
            return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // CLK_TCK, 0
        except (OSError, ValueError, IndexError):
            return None

    def numa_pages(self, pid: int) -> dict[int, int]:
        """Pages per NUMA node summed over the mappings of /proc/PID/numa_maps."""
        out: dict[int, int] = {}
        try:
            text = self._read(f"{self.root}/{pid}/numa_maps")
        except OSError:
            return out
        for m in _NODE_RE.finditer(text):
            n = int(m.group(1))
            out[n] = out.get(n, 0) + int(m.group(2))
        return out


_NODE_RE = re.compile(r"\bN(\d+)=(\d+)")


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
        run = wait = 0.0
        for tid, (r, w) in times.items():
            before = prev.get(tid)
            if before is None:  # a thread born during the interval lived at most the interval
                dr, dw = min(r, dt_ns), min(w, dt_ns)
            else:
                dr, dw = r - before[0], w - before[1]
            run += max(0.0, dr)
            wait += max(0.0, dw)
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
