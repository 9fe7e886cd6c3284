"""The daemon loop with a fake clock, a fake /proc and a recording enforcer (no processes)."""

from tilewise import topology
from tilewise.elastic import daemon, modes, petri
from tilewise.elastic.enforce import Enforcer
from tilewise.elastic.metrics import CpuMeter, ProcFS


class FakeClock:
    def __init__(self):
        self.t = 100.0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(round(s, 6))
        self.t += s


class FakeProc(ProcFS):
    """One process, one thread; its busy fraction per unit of time follows `demand(t)` (in cores)."""

    def __init__(self, clock, demand, dies_at=None):
        super().__init__("/nonexistent")
        self.clock, self.demand, self.dies_at = clock, demand, dies_at
        self.run_ns = 0.0
        self.last = clock()
        self.cores = 1

    def _advance(self):
        now = self.clock()
        if now > self.last:
            d = self.demand(self.last)
            self.run_ns += min(d, self.cores) * (now - self.last) * 1e9
            self.wait_ns = getattr(self, "wait_ns", 0.0) + max(0.0, d - self.cores) * (now - self.last) * 1e9
            self.last = now

    def alive(self, pid, cache=None):
        return self.dies_at is None or self.clock() < self.dies_at

    def tree(self, pid, cache=None):
        return {pid: pid} if self.alive(pid) else {}

    def tids(self, pid):
        return [pid] if self.alive(pid) else []

    def times_ns(self, pid, tid, cache=None):
        self._advance()
        return int(self.run_ns), int(getattr(self, "wait_ns", 0.0))


class RecordingEnforcer(Enforcer):
    def __init__(self, proc):
        super().__init__()
        self.fake = proc
        self.applied = []
        self.restored = 0

    def start(self, tasks, default_cpus, cpus):
        self.active = True
        self.applied.append(tuple(cpus))

    def apply(self, cpus, tasks):
        if not self.applied or self.applied[-1] != tuple(cpus):
            self.applied.append(tuple(cpus))
        self.fake._advance()
        self.fake.cores = len(cpus)
        return []

    def restore(self):
        self.restored += 1
        self.active = False
        return []


class FakeTarget(daemon.PidTarget):
    def allowed_cpus(self):
        return (0, 1, 2, 3)


def make(demand, dies_at=None):
    clock = FakeClock()
    proc = FakeProc(clock, demand, dies_at)
    t = topology.load("synthetic:Package:1 [NUMANode] L3Cache:1 Core:4 PU:1")
    pool = modes.make_pool(t)
    unit = daemon.Unit("fake", pool, petri.NetConfig(10, 70, pool.n_total), "dense", FakeTarget(7, proc),
                       meter=CpuMeter())
    enf = RecordingEnforcer(proc)
    unit.enforcer = enf
    recs = []
    d = daemon.Daemon([unit], interval=0.1, clock=clock, sleep=clock.sleep, log=recs.append, proc=proc)
    return d, unit, enf, recs, clock


def test_load_step_with_a_fake_clock():
    # idle for 0.5 s, then wants 2.5 cores until 1.5 s, then idle
    d, unit, enf, recs, clock = make(lambda t: 2.5 if 100.45 <= t < 101.45 else 0.0)
    with d:
        reason = d.run(duration=2.5)
    assert reason == "duration reached"
    ticks = [r for r in recs if "transitions" in r]
    assert all(abs(s - 0.1) < 1e-9 for s in clock.sleeps)  # a fixed 100 ms schedule
    first_up = next(r for r in ticks if r["action"] == "allocate")
    assert abs(first_up["t"] - 0.6) < 1e-6  # the first tick after the step
    assert max(r["n_alloc"] for r in ticks) == 4  # 2.5 cores of demand: 2.5/3 = 83 % -> 4 (62 %)
    assert ticks[-1]["n_alloc"] == 1
    assert enf.applied[0] == (0,) and (0, 1, 2, 3) in enf.applied
    assert enf.restored == 1  # restored on exit


def test_target_death_ends_the_loop_and_restores():
    d, unit, enf, recs, clock = make(lambda t: 1.0, dies_at=100.45)
    with d:
        reason = d.run(duration=10)
    assert reason == "target exited"
    assert recs[-1]["event"] == "target exited"
    assert enf.restored == 1
    assert d.ticks == 5
