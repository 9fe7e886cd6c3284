"""The elastic controller's own cost: the real ``Daemon.tick`` against a synthetic or a real /proc.

synthetic: a temp /proc (elastic.synthetic_proc) for a target with many threads on a topology this
machine does not have (e.g. 256 CPUs). A fake clock advances one interval per tick and the load
follows three phases: every core wanted (the net allocates one core per tick up to the whole
pool), then half of them (stable), then almost none (it releases one per tick). The controller
runs dry (no enforcement: the threads are not real); the adaptive mode reads numa_maps as it
would (on a core change, at most every pages_interval). Per-tick CPU time is the daemon thread's
CPU clock around ``tick()``, as ``tilewise elastic --stats`` reports it.

real: a child process with busy threads on this machine, managed by the real daemon (real clock,
real enforcement unless --dry-run) for a duration; besides per-tick CPU it reports the daemon's CPU
time over the wall time (share of one core).

`tilewise bench elastic-tick` is ``run(config, reporter)``: the elastic.tick results document.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilewise import dirs, launch, procs, topology
from tilewise.elastic import daemon, modes, petri
from tilewise.elastic import enforce as enf
from tilewise.elastic.metrics import ProcFS
from tilewise.elastic.synthetic_proc import SyntheticProc
from tilewise.errors import UsageError
from tilewise.results import model
from tilewise.results import stats as S
from tilewise.results.output import Writer

KIND = "elastic.tick"  # its results kind (results.kinds.elastic_tick); before it, "tilewise-elastic-tick/1"
DEFAULT_SYNTHETIC = "synthetic:Package:2 [NUMANode] L3Cache:16 Core:8 PU:1"  # 256 CPUs
BUDGET_CORE_PCT = 1.0  # DESIGN.md: the daemon takes under 1 % of one core


def budget_ms(cpus: int) -> float:
    """Issue 14: under 1 ms per tick at 16 CPUs, under 2 ms at 256 (between: the 256-CPU budget)."""
    return 1.0 if cpus <= 16 else 2.0


def verdict(st: dict, budget: float) -> str:
    """met: even the 99th percentile tick is under budget; met on average: the mean is, p99 is not."""
    if st.get("mean") is None:
        return "not measured"
    if st["p99"] < budget:
        return "met"
    return "met on average" if st["mean"] < budget else "missed"


class _FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def tick_stats(ms: list[float], interval_s: float) -> dict:
    """mean/median/p99/max of per-tick CPU ms, and the share of one core at this tick interval."""
    mean = S.summarize(ms)["mean"]
    return {"ticks": len(ms), **daemon.tick_cpu_stats(ms),
            "core_pct_at_interval": None if mean is None else round(100 * mean / (interval_s * 1e3), 3)}


def auto_ticks(n_total: int) -> int:
    """Enough ticks for each third of the profile to walk the whole pool (one core per tick)."""
    return 3 * (n_total + 10)


def demand_profile(i: int, ticks: int, n_total: int) -> float:
    """Cores wanted at tick i: all (ramp up), then half (stable), then a twentieth of one (ramp down)."""
    third = max(1, ticks // 3)
    if i < third:
        return float(n_total)
    if i < 2 * third:
        return n_total / 2
    return 0.05


def run_synthetic(topology_src: str, *, threads: int | None = None, processes: int = 1, mode: str = "adaptive",
                  ticks: int | None = None, interval: float = 0.1, pages_interval: float = 1.0, mappings: int = 500,
                  th_min: float = 10.0, th_max: float = 70.0, workdir: str | None = None) -> dict:
    t = topology.load(topology_src)
    pool = modes.make_pool(t, None, smt=False)
    n_threads = threads or len(t.pus)  # a DBMS sizes its pool from the CPUs it may use
    ticks = ticks or auto_ticks(pool.n_total)
    with tempfile.TemporaryDirectory(prefix="tilewise-synproc-", dir=workdir or dirs.memory_base()) as tmp:
        sp = SyntheticProc(Path(tmp), threads=n_threads, processes=processes,
                           nodes=max(1, len(t.cpu_nodes)), mappings=mappings)
        proc = ProcFS(tmp)
        clock = _FakeClock()
        unit = daemon.Unit("synthetic", pool, petri.NetConfig(th_min, th_max, pool.n_total), mode,
                           daemon.PidTarget(sp.pid, proc))
        d = daemon.Daemon([unit], interval=interval, dry_run=True, pages_interval=pages_interval, clock=clock,
                          sleep=clock.sleep, proc=proc)
        actions, most = [], 0
        with d:
            d.start()
            for i in range(ticks):
                sp.advance(interval, demand_profile(i, ticks, pool.n_total), len(unit.cpus))
                clock.sleep(interval)
                recs = d.tick()
                actions.append(next((r["action"] for r in recs if "action" in r), "none"))
                most = max(most, len(unit.allocated))
        ms = [c * 1e3 for c in d.tick_cpu]
    with_action = [m for m, a in zip(ms, actions) if a != "none"]
    without = [m for m, a in zip(ms, actions) if a == "none"]
    st = tick_stats(ms, interval)
    return {
        "proc": "synthetic", "topology": t.summary(), "cpus": len(t.pus), "cores_in_pool": pool.n_total,
        "threads": n_threads * processes, "processes": processes, "mode": mode, "interval_s": interval,
        "pages_interval_s": pages_interval, "numa_maps_lines": mappings, "enforce": "none (dry run)",
        "tick_cpu_ms": st, "ticks_ms": [round(m, 4) for m in ms],
        "tick_cpu_ms_with_core_change": tick_stats(with_action, interval),
        "tick_cpu_ms_without_core_change": tick_stats(without, interval),
        "max_cores_allocated": most,
        "budget_ms": budget_ms(len(t.pus)), "verdict": verdict(st, budget_ms(len(t.pus))),
    }


# ---- a real target on this machine ------------------------------------------------------------

_BURNER = r"""
import os, sys, threading, time
n, busy = int(sys.argv[1]), float(sys.argv[2])
def work():
    while True:  # busy for `busy` of every 100 ms
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.1 * busy:
            pass
        time.sleep(0.1 * (1 - busy))
for _ in range(n):
    threading.Thread(target=work, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def run_real(*, threads: int = 16, busy: float = 0.5, mode: str = "adaptive", duration: float = 10.0,
             interval: float = 0.1, pages_interval: float = 1.0, enforce: str = "auto", dry_run: bool = False,
             th_min: float = 10.0, th_max: float = 70.0) -> dict:
    """Spawn a target with `threads` threads, each busy `busy` of the time, and run the daemon on it."""
    t = topology.load(None)

    child = launch.spawn([sys.executable, "-c", _BURNER, str(threads), str(busy)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the load generator did not start")
        proc = ProcFS()
        target = daemon.PidTarget(child.pid, proc)
        pool = modes.make_pool(t, target.allowed_cpus(), smt=False)
        unit = daemon.Unit(f"pid {child.pid}", pool, petri.NetConfig(th_min, th_max, pool.n_total), mode, target)
        notes = []
        if not dry_run:
            unit.enforcer = enf.choose(enforce, child.pid, None)
            if unit.enforcer.reason and enforce == "auto":
                notes.append(f"using sched_setaffinity ({unit.enforcer.reason})")
        d = daemon.Daemon([unit], interval=interval, dry_run=dry_run, pages_interval=pages_interval, proc=proc)
        with d:
            d.run(duration=duration)
        st = d.stats()
        ms = [c * 1e3 for c in d.tick_cpu]
        tst = tick_stats(ms, interval)
        v = verdict(tst, budget_ms(len(t.pus)))
        if v != "not measured" and (st["daemon_cpu_pct_of_core"] or 0) >= BUDGET_CORE_PCT:
            v = "missed (share of a core)"
        return {
            "proc": "real", "topology": t.summary(), "cpus": len(t.pus), "cores_in_pool": pool.n_total,
            "threads": threads + 1, "busy": busy, "mode": mode, "interval_s": interval, "pages_interval_s": pages_interval,
            "enforce": "none (dry run)" if dry_run else unit.enforcer.kind, "duration_s": duration,
            "tick_cpu_ms": tst, "ticks_ms": [round(m, 4) for m in ms], "daemon_cpu_s": st["daemon_cpu_s"],
            "wall_s": st["wall_s"],
            "daemon_cpu_pct_of_core": st["daemon_cpu_pct_of_core"], "problems": d.problems, "notes": notes,
            "budget_ms": budget_ms(len(t.pus)), "budget_core_pct": BUDGET_CORE_PCT, "verdict": v,
        }
    finally:
        procs.stop(child, grace=0)
        for f in (child.stdin, child.stdout):
            try:
                f.close()
            except OSError:
                pass


# ---- the use case: `tilewise bench elastic-tick` -----------------------------------------------

@dataclass
class Config:
    proc: str = "synthetic"  # synthetic: a generated /proc on topology_src; real: a target on this machine
    topology_src: str | None = None  # synthetic: default DEFAULT_SYNTHETIC; real: this machine only
    modes: str = "dense,sparse,adaptive"
    threads: int | None = None  # the target's (synthetic: one per CPU; real: 16)
    processes: int = 1  # synthetic
    ticks: int | None = None  # synthetic (default: auto_ticks)
    mappings: int = 500  # synthetic: lines of each numa_maps
    duration: float = 10.0  # real: seconds per mode
    busy: float = 0.5  # real
    enforce: str = "auto"  # real: auto, cgroup, affinity, none (measure and decide only)
    interval: float = 0.1
    pages_interval: float = 1.0
    out: str | None = None  # also write results.json (and results.csv) here


class Reporter:
    def message(self, text: str) -> None: ...


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """Every mode; returns the results document (rewritten in cfg.out after each mode and when
    interrupted: a late failure loses nothing)."""
    rep = reporter or Reporter()
    chosen = [m.strip() for m in cfg.modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in modes.MODES]
    if bad or not chosen:
        raise UsageError(f"unknown mode {bad[0] if bad else cfg.modes!r}", f"choose from {', '.join(modes.MODES)}")
    src = cfg.topology_src
    if cfg.proc == "real":
        if src:
            raise UsageError("--proc real runs on this machine's topology", "drop --topology")
        topo = topology.load(None)
    else:
        src = src or DEFAULT_SYNTHETIC
        topo = topology.load(src)
    writer = Writer(cfg.out, plots=False)  # a bad --out fails before anything runs
    doc = model.new(KIND, topo=topo, params={
        "proc": cfg.proc, "modes": chosen, "threads": cfg.threads, "processes": cfg.processes, "ticks": cfg.ticks,
        "mappings": cfg.mappings, "duration": cfg.duration, "busy": cfg.busy, "enforce": cfg.enforce,
        "interval": cfg.interval, "pages_interval": cfg.pages_interval})
    doc.update({"proc": cfg.proc, "cases": []})
    try:
        for m in chosen:
            rep.message(f"{cfg.proc} /proc, {m}: ...")
            if cfg.proc == "synthetic":
                doc["cases"].append(run_synthetic(src, threads=cfg.threads, processes=cfg.processes, mode=m,
                                                  ticks=cfg.ticks, interval=cfg.interval,
                                                  pages_interval=cfg.pages_interval, mappings=cfg.mappings))
            else:
                doc["cases"].append(run_real(threads=cfg.threads or 16, busy=cfg.busy, mode=m, duration=cfg.duration,
                                             interval=cfg.interval, pages_interval=cfg.pages_interval,
                                             enforce="auto" if cfg.enforce == "none" else cfg.enforce,
                                             dry_run=cfg.enforce == "none"))
            writer.write(doc)  # after each mode: a late failure loses nothing
    except BaseException as e:
        model.stopped(doc, e)
        writer.write(doc)
        raise
    model.finish(doc, complete=True)
    writer.write(doc)
    return doc
