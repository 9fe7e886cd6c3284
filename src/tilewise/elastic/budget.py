"""The background core budget: the cores of a deployment its own work leaves idle, by the elastic
allocator's decision (paper 002), for background work such as cracking (tilewise.layout.crack).

The allocator's net (petri.step) finds the local optimum number of cores of a target from the
load u of the cores it holds (Idle below th_min releases one, Overload above th_max takes one).
Here the net runs passively over the deployment's processes (its servers or workers, measured with
the daemon's own meter, never the background work's): it decides, it enforces nothing. The cores
it would give the deployment are the deployment's; the others of the deployment's CPUs are the
background budget (``background``, pure). When the deployment is busy on every core the budget is
empty: the background work then runs on one thread at idle priority (SCHED_IDLE), which the kernel
runs only on a CPU nothing else wants, so the queries never wait for it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from tilewise.elastic import modes, petri
from tilewise.elastic.metrics import CpuMeter, ProcFS


def background(pool: modes.Pool, allocated) -> tuple[int, ...]:
    """The CPUs of the pool's cores the allocation does not hold (pure)."""
    held = set(allocated)
    return pool.cpus([c.id for c in pool.cores if c.id not in held])


@dataclass
class Budget:
    """Measure the deployment's load, step the net, and say which CPUs are the background's now."""

    pool: modes.Pool
    pids: list[int]
    cfg: petri.NetConfig = None  # type: ignore[assignment]
    mode: str = "dense"
    proc: ProcFS = field(default_factory=ProcFS)
    clock: object = time.monotonic
    state: petri.State = None  # type: ignore[assignment]
    allocated: list = field(default_factory=list)
    meter: CpuMeter = field(default_factory=CpuMeter)
    last_u: float | None = None
    log: list = field(default_factory=list)  # (t, u, n_alloc, background cpus), the last ones

    def __post_init__(self) -> None:
        if self.cfg is None:
            self.cfg = petri.NetConfig(n_total=self.pool.n_total)
        if self.state is None:
            self.state = petri.initial(self.cfg)
            self.allocated = [modes.first_core(self.pool, self.mode)]
        self._lock = threading.Lock()

    def tick(self) -> tuple[int, ...]:
        """One measurement and one step of the net; the background CPUs after it."""
        tasks: dict[int, int] = {}
        for pid in self.pids:
            tasks.update(self.proc.tree(pid))
        now = self.clock()
        with self._lock:
            n_cpus = len(self.pool.cpus(self.allocated))
            s = self.meter.sample(self.proc.times(tasks), now, n_cpus)
            if s is not None:
                u = min(100.0, s["demand"])
                self.last_u = u
                res = petri.step(self.cfg, self.state, u)
                self.state = res.state
                if res.action > 0:
                    cid = modes.choose_allocate(self.pool, self.allocated, self.mode)
                    if cid is not None:
                        self.allocated.append(cid)
                elif res.action < 0:
                    cid = modes.choose_release(self.pool, self.allocated, self.mode)
                    if cid is not None:
                        self.allocated.remove(cid)
            cpus = background(self.pool, self.allocated)
            self.log = (self.log + [(round(now, 3), self.last_u, len(self.allocated), cpus)])[-20:]
            return cpus

    def cpus(self) -> tuple[int, ...]:
        with self._lock:
            return background(self.pool, self.allocated)


class Ticker:
    """Ticks a Budget every interval in a daemon thread, and keeps this process's threads on the
    background CPUs (all of them: DuckDB's pool threads too), at idle priority on the deployment's
    CPUs while the budget is empty."""

    def __init__(self, budget: Budget, interval_s: float = 0.5) -> None:
        self.budget, self.interval_s = budget, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-budget", daemon=True)
        self.current: tuple[int, ...] = ()

    def __enter__(self) -> Ticker:
        idle_priority()
        self.apply(self.budget.tick())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.apply(self.budget.tick())
            except Exception:  # noqa: BLE001 - a failed measurement keeps the last budget
                continue

    def threads(self) -> int:
        """How many threads the background work may use now (at least one)."""
        return max(1, len(self.current))

    def apply(self, cpus: tuple[int, ...]) -> None:
        """Every thread of this process onto the background CPUs (the whole pool when there are none:
        at idle priority that takes only what the deployment leaves)."""
        self.current = tuple(cpus)
        target = set(cpus) or set(self.budget.pool.cpus([c.id for c in self.budget.pool.cores]))
        for tid in _tids():
            try:
                os.sched_setaffinity(tid, target)
            except OSError:
                continue


def idle_priority() -> None:
    """SCHED_IDLE for this process (its threads from now on): it runs only on CPUs nothing else wants."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        try:
            os.nice(19)
        except OSError:
            pass


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
