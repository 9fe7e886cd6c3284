"""The elastic loop: measure, step the net, pick a core, enforce, log; with a clock you can fake.

One ``Unit`` is one managed target (a process tree, a cgroup, or one instance of a cluster) with
its own net, pool of cores and enforcer. ``Daemon`` ticks every unit on a fixed schedule
(absolute deadlines, so ticks do not drift), stops when the duration is over or every target has
exited, and always restores on the way out (``close``; use it as a context manager).

Everything with side effects is injected: clock, sleep, /proc root, enforcer, log sink. The pure
decision (``Unit.decide``) is shared with the trace simulator (``simulate``), so a recorded load
trace on a machine we do not have runs the very same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tilewise import cpulist, userfiles
from tilewise.elastic import modes, petri
from tilewise.elastic.enforce import Enforcer
from tilewise.elastic.metrics import CLK_TCK, CpuMeter, FdCache, ProcFS, cgroup_tasks
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import stats as S

LOG_VERSION = 1


# ---- targets ---------------------------------------------------------------------------------

@dataclass
class PidTarget:
    """A process and everything it spawns (a server's whole process tree: a postmaster, its
    backends and parallel workers). Every tick re-lists the threads of the processes already known
    and reads the ``children`` file of each one's main thread, so a process forked from a main
    thread (a process-per-connection server forks its backends and workers there) is part of the
    tree at the first tick after its birth: measured, and re-bound, within one tick. A full scan
    (every rescan_s: each thread's children file) finds children forked by other threads, which
    are counted from then on (they inherit the CPUs and the cgroup of their parent at fork, so
    enforcement holds in between)."""

    pid: int
    proc: ProcFS = field(default_factory=ProcFS)
    rescan_s: float = 1.0
    _fds: FdCache = field(default_factory=FdCache, repr=False)
    _tree: dict | None = field(default=None, repr=False)
    _next_scan: float = 0.0

    @property
    def name(self) -> str:
        return f"pid {self.pid}"

    def alive(self) -> bool:
        return self.proc.alive(self.pid, self._fds)

    def tasks(self, now: float | None = None) -> dict[int, int]:
        """tid -> pid of the tree; now=None forces a full scan. The dict is the caller's to read, not change."""
        if not self.alive():
            self._tree = None
            return {}
        if self._tree is None or now is None or now >= self._next_scan:
            self._tree = self.proc.tree(self.pid, self._fds)
            self._fds.sweep()
            self._next_scan = (now if now is not None else 0.0) + self.rescan_s
        else:
            known = set(self._tree.values())
            tree = {t: p for p in known for t in self.proc.tids(p)}
            for p in set(tree.values()):  # the live ones: one read each of the main thread's children
                for child in self.proc.children(p, p, self._fds):
                    if child not in known:  # born since: with everything it has spawned already
                        sub = self.proc.tree(child, self._fds)
                        tree.update(sub)
                        known.update(sub.values())
            self._tree = tree
        return self._tree

    @property
    def fds(self) -> FdCache:
        return self._fds

    def close(self) -> None:
        self._fds.close()

    def allowed_cpus(self) -> tuple[int, ...]:
        try:
            return tuple(sorted(os.sched_getaffinity(self.pid)))
        except ProcessLookupError:
            raise TilewiseError(f"no process with pid {self.pid}", "check the pid (ps -e)") from None
        except PermissionError:
            raise TilewiseError(f"not allowed to read the affinity of pid {self.pid}", "run as root") from None

    def pids(self, tasks: dict[int, int]) -> set[int]:
        return set(tasks.values())


@dataclass
class CgroupTarget:
    path: str
    proc: ProcFS = field(default_factory=ProcFS)
    extra: list = field(default_factory=list)  # our own child group, once created

    @property
    def name(self) -> str:
        return f"cgroup {self.path}"

    def tasks(self, now: float | None = None) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in [self.path, *self.extra]:
            try:
                tids = cgroup_tasks(d)
            except TilewiseError:
                if d == self.path:
                    raise
                continue
            for tid in tids:
                out[tid] = tid  # /proc/TID works for any thread; runtime is per thread anyway
        return out

    def alive(self) -> bool:
        return bool(self.tasks())

    def allowed_cpus(self) -> tuple[int, ...]:
        for name in ("cpuset.effective_cpus", "cpuset.cpus.effective", "cpuset.cpus"):
            try:
                with open(os.path.join(self.path, name)) as f:
                    return cpulist.parse(f.read(), what=name)
            except FileNotFoundError:
                continue
        raise TilewiseError(f"{self.path} is not a cpuset cgroup", "give a directory under the cpuset hierarchy")

    def pids(self, tasks: dict[int, int]) -> set[int]:
        out = set()
        for tid in tasks:
            try:
                with open(f"{self.proc.root}/{tid}/status") as f:
                    for line in f:
                        if line.startswith("Tgid:"):
                            out.add(int(line.split()[1]))
                            break
            except OSError:
                pass
        return out


# ---- one managed target ------------------------------------------------------------------------

@dataclass
class Unit:
    name: str
    pool: modes.Pool
    cfg: petri.NetConfig
    mode: str = "dense"
    target: object = None  # PidTarget | CgroupTarget | None (simulation)
    enforcer: Enforcer | None = None
    state: petri.State = None  # type: ignore[assignment]
    allocated: list = field(default_factory=list)
    pages: dict = field(default_factory=dict)
    pages_t: float | None = None
    meter: CpuMeter = field(default_factory=CpuMeter)
    fds: FdCache = field(default_factory=FdCache, repr=False)  # its threads' schedstat files, open between ticks
    _cpus_of: tuple = field(default=(None, (), ""), repr=False)  # (allocation, its CPUs, as text)
    done: str | None = None  # why this unit stopped

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = petri.initial(self.cfg)

    def begin(self, pages: dict | None = None) -> None:
        self.pages = dict(pages or {})
        self.allocated = [modes.first_core(self.pool, self.mode, self.pages)]

    @property
    def cpus(self) -> tuple[int, ...]:
        """The CPUs of the allocated cores (sorted), recomputed only when the allocation changed."""
        key = tuple(self.allocated)
        if key != self._cpus_of[0]:
            cpus = self.pool.cpus(key)
            self._cpus_of = (key, cpus, cpulist.format(cpus))
        return self._cpus_of[1]

    @property
    def cpus_text(self) -> str:
        self.cpus  # noqa: B018 - refreshes the cache
        return self._cpus_of[2]

    def decide(self, u: float, pages=None) -> petri.StepResult:
        """The pure part of a tick: step the net with u, apply its action to the allocation.

        pages: {node: resident pages} for the adaptive mode, or a function returning them, called
        only when the net allocates or releases a core (reading numa_maps of a large process costs
        milliseconds, far more than the rest of a tick).
        """
        res = petri.step(self.cfg, self.state, min(max(u, 0.0), 100.0))
        self.state = res.state
        if callable(pages):
            pages = pages() if res.action else None
        if pages is not None:
            self.pages = dict(pages)
        if res.action > 0:
            cid = modes.choose_allocate(self.pool, self.allocated, self.mode, self.pages)
            if cid is not None:
                self.allocated.append(cid)
        elif res.action < 0:
            cid = modes.choose_release(self.pool, self.allocated, self.mode, self.pages)
            if cid is not None:
                self.allocated.remove(cid)
        assert len(self.allocated) == self.state.n_alloc, (self.allocated, self.state)
        return res

    def record(self, t: float, u: float, res: petri.StepResult) -> dict:
        rec = {"t": round(t, 6), "unit": self.name, "u": round(u, 3),
               "transitions": list(res.transitions), "marking": res.state.marking(),
               "action": {1: "allocate", -1: "release", 0: "none"}[res.action],
               "n_alloc": res.state.n_alloc, "cores": sorted(self.allocated), "cpus": self.cpus_text}
        rec["marking"]["Checks"] = round(u, 3)
        if self.mode == "adaptive":
            rec["pages"] = {str(k): v for k, v in sorted(self.pages.items())}
        return rec


# ---- the loop ----------------------------------------------------------------------------------

@dataclass
class Daemon:
    units: list
    interval: float = 0.1
    dry_run: bool = False
    pages_interval: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    thread_time: Callable[[], float] = time.thread_time
    log: Callable[[dict], None] | None = None
    proc: ProcFS = field(default_factory=ProcFS)
    t0: float = 0.0
    ticks: int = 0
    tick_cpu: list = field(default_factory=list)  # seconds of CPU per tick (this thread)
    problems: list = field(default_factory=list)
    uncontrolled: list = field(default_factory=list)  # processes left alone, each said once (why)
    restored: list = field(default_factory=list)
    stop_reason: str = ""
    stopped: bool = False  # set from another thread to end run() after the current tick
    _started: bool = False
    _closed: bool = False
    cpu_s: float = 0.0  # CPU time of start() and run(), measured in the thread that ran them
    _wall0: float = 0.0

    # -- lifecycle --
    def start(self) -> None:
        c0 = time.thread_time()
        try:
            self._start()
        finally:
            self.cpu_s += time.thread_time() - c0

    def _start(self) -> None:
        self.t0 = self.clock()
        self._wall0 = time.monotonic()
        self._started = True
        for u in self.units:
            tasks = u.target.tasks(self.t0)
            if not tasks:
                raise TilewiseError(f"{u.target.name} has no running task", "is it still running?")
            u.begin(self._pages(u, tasks, self.t0, force=True))
            if not self.dry_run and u.enforcer is not None:
                allowed = u.target.allowed_cpus() if hasattr(u.target, "allowed_cpus") else u.pool.cpus([c.id for c in u.pool.cores])
                u.enforcer.start(tasks, allowed, u.cpus)
                if u.enforcer.path and isinstance(u.target, CgroupTarget):
                    u.target.extra.append(u.enforcer.path)  # our own group: its tasks are still the target's
            u.meter.sample(self._runtimes(u, tasks), self.clock(), len(u.cpus))
            if self.log:
                self.log({"t": 0.0, "unit": u.name, "event": "start", "n_alloc": 1, "cores": sorted(u.allocated),
                          "cpus": u.cpus_text, "n_total": u.pool.n_total, "mode": u.mode,
                          "enforce": "dry-run" if self.dry_run or u.enforcer is None else u.enforcer.kind,
                          "marking": u.state.marking()})

    def _runtimes(self, u: Unit, tasks: dict[int, int]) -> dict[int, tuple[int, int]]:
        return self.proc.times(tasks, u.fds)

    def _release_files(self, u: Unit) -> None:
        u.fds.close()
        close = getattr(u.target, "close", None)
        if close is not None:
            close()

    def _pages(self, u: Unit, tasks, now: float, force: bool = False) -> dict | None:
        if u.mode != "adaptive":
            return None
        if not force and u.pages_t is not None and now - u.pages_t < self.pages_interval:
            return None
        u.pages_t = now
        return self.proc.tree_pages(sorted(u.target.pids(tasks)))

    def tick(self) -> list[dict]:
        c0 = self.thread_time()
        now = self.clock()
        out = []
        for u in self.units:
            if u.done:
                continue
            tasks = u.target.tasks(now)
            if not tasks:
                u.done = "target exited"
                out.append({"t": round(now - self.t0, 6), "unit": u.name, "event": "target exited"})
                self._release_files(u)
                self._restore(u)
                continue
            m = u.meter.sample(self._runtimes(u, tasks), now, len(u.cpus))
            if m is None:
                continue
            load = m["demand"]
            res = u.decide(load, lambda: self._pages(u, tasks, now))
            if not self.dry_run and u.enforcer is not None:
                probs = u.enforcer.apply(u.cpus, tasks)
                if probs:
                    denied = set(u.enforcer.denied.values())
                    for line in probs:
                        if line in denied:  # once per process, with the reason; the rest stays controlled
                            self.uncontrolled.append(f"{u.name}: {line}")
                            out.append({"t": round(now - self.t0, 6), "unit": u.name, "event": "not controlled",
                                        "detail": line})
                        else:
                            self.problems.append(line)
            rec = u.record(now - self.t0, load, res)
            rec["busy"] = round(m["busy"], 3)
            rec["threads"] = m["threads"]
            if isinstance(u.target, PidTarget):  # a server's tree: its backends and workers come and go
                pids = set(tasks.values())
                rec["processes"] = len(pids)
                # the tree's CPU so far, threads and children that ended included (clock ticks), beside
                # u (per-thread schedstat: precise, but blind to a task born and gone within a tick)
                rec["cpu_s"] = round(sum(self.proc.cpu_ticks(p, u.target.fds) or 0 for p in pids) / CLK_TCK, 3)
            out.append(rec)
        self.ticks += 1
        cost = self.thread_time() - c0
        self.tick_cpu.append(cost)
        for rec in out:
            rec["tick_cpu_ms"] = round(cost * 1e3, 4)
            if self.log:
                self.log(rec)
        return out

    def run(self, duration: float | None = None, max_ticks: int | None = None) -> str:
        if not self._started:
            self.start()
        c0 = time.thread_time()
        try:
            return self._run(duration, max_ticks)
        finally:
            self.cpu_s += time.thread_time() - c0

    def _run(self, duration: float | None, max_ticks: int | None) -> str:
        next_t = last = self.clock()
        while True:
            # fixed schedule (no drift); after a late tick the next one still waits half an interval,
            # and a daemon that fell far behind resynchronises instead of bursting
            now = self.clock()
            next_t = max(next_t + self.interval, last + self.interval / 2, now - self.interval)
            delay = next_t - now
            if delay > 0:
                self.sleep(delay)
            last = self.clock()
            if self.stopped:
                self.stop_reason = "stopped"
                break
            self.tick()
            if all(u.done for u in self.units):
                self.stop_reason = "every target exited" if len(self.units) > 1 else "target exited"
                break
            if duration is not None and self.clock() - self.t0 >= duration - 1e-9:
                self.stop_reason = "duration reached"
                break
            if max_ticks is not None and self.ticks >= max_ticks:
                self.stop_reason = "tick limit reached"
                break
        return self.stop_reason

    def _restore(self, u: Unit) -> None:
        if u.enforcer is not None and not self.dry_run:
            probs = u.enforcer.restore()
            self.problems.extend(probs)
            self.restored.append(u.name)

    def close(self) -> None:
        """Restore every target (reverse order), keep going on failures. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for u in self.units:
            self._release_files(u)
        for u in reversed(self.units):
            if u.enforcer is not None and u.enforcer.active:
                try:
                    self._restore(u)
                except Exception as e:  # noqa: BLE001 - keep undoing the others
                    self.problems.append(f"{u.name}: restore failed: {e}")

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        ms = [c * 1e3 for c in self.tick_cpu]
        wall = time.monotonic() - self._wall0 if self._started else 0.0
        cpu = self.cpu_s
        return {
            "ticks": self.ticks,
            "tick_cpu_ms": tick_cpu_stats(ms),
            "daemon_cpu_s": round(cpu, 4), "wall_s": round(wall, 3),
            "daemon_cpu_pct_of_core": round(100 * cpu / wall, 3) if wall > 0 else None,
        }


def tick_cpu_stats(ms: list[float]) -> dict:
    """mean, median, p99 and max of per-tick CPU milliseconds (None without ticks), as logged."""
    return S.rounded(S.summarize(ms, percentiles=(99,)), ("mean", "median", "p99", "max"))


# ---- trace simulation (--dry-run --trace) ------------------------------------------------------------

def load_trace(path: str) -> list[dict]:
    """CSV with a header (time and demand or load, optional pages_N columns) or JSON lines.

    demand: cores' worth of CPU the workload wants (3.5 = three and a half busy cores); the
    simulated load of n allocated cores is min(demand, n) / n x 100. load: the measured u in
    percent, used as is (open loop, e.g. replaying a log). pages: {node: pages} (JSON) or
    pages_0, pages_1, ... columns (CSV) for the adaptive mode.
    """
    import csv

    text = userfiles.read_text(path, "trace", "give a CSV (time,demand or time,load) or an elastic log")
    rows: list[dict] = []
    stripped = text.lstrip()
    if stripped.startswith("{"):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            d = userfiles.parse_json(line, path, "trace", line=i)
            if not isinstance(d, dict):
                raise UsageError(f"trace {path}:{i}: not a JSON object")
            if d.get("event") or d.get("format"):  # an elastic log: its header and events are no ticks
                continue
            rows.append(_trace_row(path, i, d.get("time", d.get("t")), d.get("demand"), d.get("load", d.get("u")),
                                   d.get("pages"), rows[-1]["time"] if rows else None))
    else:
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "time" not in reader.fieldnames or not ({"demand", "load"} & set(reader.fieldnames)):
            raise UsageError(f"trace {path}: the CSV header needs time and demand or load",
                             "e.g. time,demand then 0,0.5 per line")
        for i, r in enumerate(reader, 2):
            pages = {k[6:]: r[k] for k in r if k and k.startswith("pages_") and r[k] not in (None, "")}
            rows.append(_trace_row(path, i, r.get("time"), r.get("demand") or None, r.get("load") or None, pages or None,
                                   rows[-1]["time"] if rows else None))
    if not rows:
        raise UsageError(f"trace {path} has no rows")
    return rows


def _trace_row(path, i, t, demand, load, pages, previous: float | None = None) -> dict:
    """One tick of a trace, its values checked: finite, time never running backwards, demand and pages
    not negative (a measured load may pass 100 %: the engine's other threads count too)."""
    where = f"trace {path}:{i}"
    try:
        row = {"time": float(t)}
        if demand is not None:
            row["demand"] = float(demand)
        elif load is not None:
            row["load"] = float(load)
        else:
            raise ValueError
        if pages:
            row["pages"] = {int(k): float(v) for k, v in pages.items()}
    except (TypeError, ValueError, AttributeError):
        raise UsageError(f"{where}: needs a number for time and for demand or load (and pages per node)") from None
    for name, v in (("time", row["time"]), ("demand", row.get("demand", 0.0)), ("load", row.get("load", 0.0)),
                    *((f"pages of node {k}", v) for k, v in row.get("pages", {}).items())):
        if v != v or v in (float("inf"), float("-inf")):
            raise UsageError(f"{where}: {name} is {v}, not a finite number")
        if v < 0 and name != "time":
            raise UsageError(f"{where}: {name} is {v:g}; it cannot be negative")
    if previous is not None and row["time"] < previous:
        raise UsageError(f"{where}: time runs backwards ({row['time']:g} after {previous:g})",
                         "sort the trace by time")
    if "pages" in row:
        row["pages"] = {k: int(v) for k, v in row["pages"].items()}
    return row


def simulate(rows: list[dict], unit: Unit, log: Callable[[dict], None] | None = None) -> list[dict]:
    """Run the controller over a trace: each row is one tick."""
    first_pages = next((r["pages"] for r in rows if "pages" in r), None)
    unit.begin(first_pages)
    out = [{"t": rows[0]["time"], "unit": unit.name, "event": "start", "n_alloc": 1, "cores": sorted(unit.allocated),
            "cpus": cpulist.format(unit.cpus), "n_total": unit.pool.n_total, "mode": unit.mode, "enforce": "simulated",
            "marking": unit.state.marking()}]
    if log:
        log(out[0])
    for r in rows:
        n = len(unit.allocated)
        u = r["load"] if "load" in r else 100.0 * min(r["demand"], n) / n
        c0 = time.thread_time()
        res = unit.decide(u, r.get("pages"))
        rec = unit.record(r["time"], u, res)
        rec["tick_cpu_ms"] = round((time.thread_time() - c0) * 1e3, 4)
        if "demand" in r:
            rec["demand"] = r["demand"]
        out.append(rec)
        if log:
            log(rec)
    return out
