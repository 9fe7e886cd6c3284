"""One `tilewise elastic` session, as a use case: ``run(config, reporter) -> summary``.

What the command line used to do itself, here where tests call it directly:

- target selection: ``--pid`` (a process tree), ``--cgroup`` (a group's tasks), ``--instances``
  (the worker instances of the cluster `tilewise up` recorded);
- **admission** before anything is journaled or changed (tilewise.admission): a target whose tree
  is the whole machine is refused unless ``whole_machine``; every process of the tree must be one
  this caller may re-bind (its own, or CAP_SYS_NICE); a cgroup must be writable (root, or a
  delegated group). A refusal is one line naming the target, its owner, what is missing and the
  way out;
- journal recovery: what dead daemons (or tune runs) left is undone first, and only what was
  really put back is said (journals whose changes were already undone are dropped quietly);
- the loop (tilewise.elastic.daemon), its log (a results document of kind elastic.log), and the
  summary. A process that joins the tree later and may not be re-bound (another user's child) is
  said once, with the reason, and left alone; the rest stays controlled, and the run ends
  ``Partial`` (exit 3) with the summary saying which processes were not controlled.

``simulate`` runs the controller over a recorded trace (--dry-run --trace); ``replay`` summarises
(and draws) a log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tilewise import admission, cgroups, changes, cluster, signals, topology
from tilewise.elastic import daemon, modes, petri
from tilewise.elastic import enforce as enf
from tilewise.elastic.metrics import ProcFS, traffic_availability
from tilewise.errors import TilewiseError, UsageError
from tilewise.procs import ProcId
from tilewise.results import model
from tilewise.results.kinds import elastic_log
from tilewise.results.output import LineWriter


@dataclass
class Config:
    pid: int | None = None
    cgroup: str | None = None
    instances: bool = False
    cluster: str | None = None
    mode: str = "adaptive"
    metric: str = "cpu"
    th_min: float | None = None  # None: 10 %
    th_max: float | None = None  # None: 70 %
    interval: float = 0.1
    duration: float | None = None
    dry_run: bool = False
    trace: str | None = None
    log: str | None = None
    enforce: str = "auto"
    smt: bool = False
    pages_interval: float = 1.0
    topology_src: str | None = None
    whole_machine: bool = False  # admit a target whose tree is the whole machine (pid 1, a systemd manager)

    def thresholds(self) -> tuple[float, float]:
        lo = 10.0 if self.th_min is None else self.th_min
        hi = 70.0 if self.th_max is None else self.th_max
        if not (0 <= lo < hi <= 100):
            raise UsageError(f"thresholds must satisfy 0 <= th-min < th-max <= 100 (got {lo}, {hi})")
        return lo, hi


class Reporter:
    """What the session tells the user while it runs (the CLI renders it; tests record it)."""

    def record(self, rec: dict) -> None: ...  # a start, tick or event record, as it happens
    def note(self, text: str) -> None: ...  # before the first tick: recovery, enforcement fallbacks
    def done(self, summary: dict) -> None: ...  # the summary, also when the run is interrupted or partial


class Partial(TilewiseError):
    """The daemon ran, but some processes of the target were not its to control."""

    exit_code = 3

    def __init__(self, summary: dict):
        self.summary = summary
        n = len(summary.get("uncontrolled") or [])
        super().__init__(f"the run was partial: {n} process(es) of the target were not controlled "
                         f"(first: {summary['uncontrolled'][0]})",
                         "run tilewise as their owner or as root to control them all")


# ---- admission (pure decisions on facts read here) --------------------------------------------------

def admit(units: list[daemon.Unit], cfg: Config, *, caller: admission.Caller, proc: str = "/proc",
          mountinfo: str = "/proc/self/mountinfo") -> None:
    """Refuse (admission.Refused) before anything is journaled or changed: a whole-machine target
    without --whole-machine, or processes of the target this caller may not re-bind."""
    refusals: list[admission.Refusal] = []
    for u in units:
        t = u.target
        whole = None
        if cfg.whole_machine:
            pass
        elif isinstance(t, daemon.PidTarget):
            leader = admission.process(t.pid, proc)
            whole = admission.whole_machine_refusal(leader) if leader is not None else None
        elif _hierarchy_root(t.path, mountinfo) is not None:
            whole = admission.Refusal(
                "control", f"cgroup {t.path}", "root", "it is the root of the cgroup hierarchy: every process "
                "on the machine", "give the database's own group, or add --whole-machine if you mean it")
        if whole is not None:  # said first, without reading the whole machine's processes
            refusals.append(whole)
            continue
        pids = set(t.tasks().values()) if isinstance(t, daemon.PidTarget) else t.pids(t.tasks())
        refusals += admission.affinity_refusals(caller, admission.processes(pids, proc))
    admission.check(refusals)


def _hierarchy_root(path: str, mountinfo: str) -> str | None:
    m = cgroups.mounts(mountinfo)
    p = os.path.normpath(os.path.abspath(path))
    return next((r for r in (m["v1"], m["v2"]) if r and os.path.normpath(r) == p), None)


# ---- targets ----------------------------------------------------------------------------------------

def cluster_instances(name: str | None) -> list[tuple[str, int, tuple[int, ...] | None]]:
    """(name, pid, cpus) of the running cluster's worker instances (the state `tilewise up` records)."""
    names = cluster.names()
    if name is None:
        if not names:
            raise TilewiseError(f"no running cluster (no state file in {cluster.state_dir()})", "start one with `tilewise up`")
        if len(names) > 1:
            raise UsageError(f"several clusters are recorded: {', '.join(names)}", "pick one with --cluster NAME")
        name = names[0]
    st = cluster.load(name)
    if st is None:
        raise TilewiseError(f"no running cluster named {name!r}", f"recorded: {', '.join(names) or 'none'}")
    out = []
    for m in st.members:
        if m.get("role") != "worker" or not m.get("pid"):
            continue
        pid = int(m["pid"])
        ident = ProcId.recorded(pid, m.get("start"), m.get("create_time"))
        if ident is None or not ident.alive():
            continue
        cpus = (m.get("binding") or {}).get("cpus")
        out.append((f"{name}/{m.get('instance')}", pid, tuple(cpus) if cpus else None))
    if not out:
        raise TilewiseError(f"cluster {name!r} has no running worker instance", "check `tilewise status`")
    return out


def _units(cfg: Config, t, proc: ProcFS, net) -> list[daemon.Unit]:
    if sum(bool(x) for x in (cfg.pid, cfg.cgroup, cfg.instances)) != 1:
        raise UsageError("give exactly one target: --pid PID, --cgroup PATH or --instances",
                         "or --dry-run --trace FILE to simulate, or --replay LOG")
    if cfg.pid or cfg.cgroup:
        if cfg.pid and cfg.pid == os.getpid():
            raise UsageError("the daemon cannot manage itself")
        if cfg.pid and not proc.alive(cfg.pid):
            raise TilewiseError(f"no running process with pid {cfg.pid}", "check the pid (ps -e)")
        target = daemon.PidTarget(cfg.pid, proc) if cfg.pid else daemon.CgroupTarget(os.path.abspath(cfg.cgroup), proc)
        pool = modes.make_pool(t, target.allowed_cpus(), cfg.smt)
        return [daemon.Unit(target.name, pool, net(pool), cfg.mode, target)]
    out = []
    for name, ipid, cpus in cluster_instances(cfg.cluster):
        target = daemon.PidTarget(ipid, proc)
        pool = modes.make_pool(t, cpus or target.allowed_cpus(), cfg.smt)
        out.append(daemon.Unit(f"instance {name}", pool, net(pool), cfg.mode, target))
    return out


def recovery_notes(reports: list[changes.JournalReport]) -> list[str]:
    """What undoing dead runs' journals is worth saying: what was put back or could not be. A
    journal whose every item was already as recorded (its run had undone it, or it had failed
    before changing anything) is dropped in one line, not item by item."""
    notes, quiet = [], 0
    for r in reports:
        if r.state == "restored" and r.undo is not None and not r.undo.restored and not r.undo.failed:
            quiet += 1
        elif r.state in ("restored", "failed", "refused", "earlier-boot", "unreadable"):
            notes += r.lines()
    if quiet:
        notes.append(f"dropped {quiet} journal(s) of runs that had changed nothing still in place")
    return notes


# ---- the use cases ------------------------------------------------------------------------------------

def _open_log(path: str | None, topo, params: dict) -> LineWriter:
    """The --log file: a results document of kind elastic.log, written a line per record as the
    daemon runs (opened before the first tick: a bad path fails early)."""
    return LineWriter(path, model.new("elastic.log", topo=topo, params=params) if path else None)


def _check(cfg: Config) -> None:
    if cfg.metric == "traffic":
        ok, why = traffic_availability()
        if not ok:
            raise TilewiseError(f"--metric traffic: {why}", "use --metric cpu")
    if cfg.trace:
        if not cfg.dry_run:
            raise UsageError("--trace runs the controller on a recorded trace and changes nothing", "add --dry-run")
        if cfg.pid or cfg.cgroup or cfg.instances:
            raise UsageError("--trace replaces the target", "drop --pid/--cgroup/--instances")


def simulate(cfg: Config, reporter: Reporter | None = None) -> dict:
    """--dry-run --trace: the controller over a recorded load trace, on cfg.topology_src."""
    rep = reporter or Reporter()
    _check(cfg)
    th_min, th_max = cfg.thresholds()
    t = topology.load(cfg.topology_src)
    pool = modes.make_pool(t, None, cfg.smt)
    unit = daemon.Unit("trace", pool, petri.NetConfig(th_min, th_max, pool.n_total), cfg.mode)
    rows = daemon.load_trace(cfg.trace)
    params = {"source": cfg.trace, "topology": t.summary(), "mode": cfg.mode, "n_total": pool.n_total,
              "th_min": th_min, "th_max": th_max, "enforce": "simulated"}
    with _open_log(cfg.log, t, params) as sink:
        recs = daemon.simulate(rows, unit, sink)
        summary = elastic_log.summarize(elastic_log.records(recs), {**params, "log": cfg.log})
        ms = [r["tick_cpu_ms"] for r in recs if "tick_cpu_ms" in r]
        if ms:
            summary["stats"] = {"ticks": len(ms), "tick_cpu_ms": daemon.tick_cpu_stats(ms),
                                "daemon_cpu_s": round(sum(ms) / 1e3, 4), "wall_s": None, "daemon_cpu_pct_of_core": None}
        sink(elastic_log.end_record(t=recs[-1]["t"] if recs else None, stop_reason=None, stats=summary.get("stats")))
    rep.done(summary)
    return summary


def run(cfg: Config, reporter: Reporter | None = None, *, proc: ProcFS | None = None,
        caller: admission.Caller | None = None) -> dict:
    """A live session on cfg's target (or the trace simulation when cfg.trace). Returns the
    summary (also given to reporter.done). Raises admission.Refused before changing anything,
    Partial (after the summary) when processes joined that were not ours to control, and
    re-raises Ctrl-C/SIGTERM after restoring and summarising."""
    if cfg.trace:
        return simulate(cfg, reporter)
    rep = reporter or Reporter()
    _check(cfg)
    th_min, th_max = cfg.thresholds()
    t = topology.load(cfg.topology_src)
    if not topology.is_live(t):
        raise UsageError(f"the topology {t.source} is not this machine: a live target can only be driven on this machine's topology",
                         "drop --topology, or simulate with --dry-run --trace FILE")
    proc = proc or ProcFS()
    who = caller or admission.caller()
    units = _units(cfg, t, proc, lambda pool: petri.NetConfig(th_min, th_max, pool.n_total))
    notes: list[str] = []
    if not cfg.dry_run:
        admit(units, cfg, caller=who, proc=proc.root)  # before anything is journaled or changed
        for u in units:
            tree = set(u.target.tasks().values()) if isinstance(u.target, daemon.PidTarget) else None
            u.enforcer = enf.choose(cfg.enforce, getattr(u.target, "pid", None), getattr(u.target, "path", None),
                                    proc=proc.root, tree_pids=tree, caller=who)
            if u.enforcer.reason and cfg.enforce == "auto":
                notes.append(f"{u.name}: using sched_setaffinity ({u.enforcer.reason})")
        # undo first what daemons (or tune runs) killed hard left behind
        notes = recovery_notes(changes.restore_all()) + notes

    recs: list[dict] = []
    params = {"target": [u.name for u in units], "mode": cfg.mode, "metric": cfg.metric, "th_min": th_min,
              "th_max": th_max, "interval": cfg.interval, "duration": cfg.duration, "dry_run": cfg.dry_run,
              "enforce": cfg.enforce, "smt": cfg.smt, "pages_interval": cfg.pages_interval}
    with _open_log(cfg.log, t, params) as sink:
        def log(rec: dict) -> None:
            recs.append(rec)
            sink(rec)
            rep.record(rec)

        d = daemon.Daemon(units, interval=cfg.interval, dry_run=cfg.dry_run, pages_interval=cfg.pages_interval,
                          log=log, proc=proc)
        interrupted = None
        try:
            with d:
                for n in notes:
                    rep.note(n)
                d.run(duration=cfg.duration)
        except (KeyboardInterrupt, signals.Terminated) as e:  # restored by `with d`: report, then re-raise
            interrupted = e
            d.stop_reason = "stopped by signal"
        notes += [k for u in units if u.enforcer is not None for k in u.enforcer.kept]
        summary = elastic_log.summarize(elastic_log.records(recs), {
            "target": [u.name for u in units], "mode": cfg.mode, "th_min": th_min, "th_max": th_max,
            "interval": cfg.interval, "dry_run": cfg.dry_run, "log": cfg.log,
            "enforce": ["dry-run" if cfg.dry_run else u.enforcer.kind for u in units],
            "stop_reason": d.stop_reason, "restored": not d.problems, "problems": d.problems, "notes": notes,
            "uncontrolled": d.uncontrolled, "partial": bool(d.uncontrolled)})
        summary["stats"] = d.stats()
        sink(elastic_log.end_record(t=round(d.clock() - d.t0, 6), stop_reason=d.stop_reason, stats=summary["stats"],
                                    problems=d.problems, interrupted=interrupted is not None,
                                    uncontrolled=d.uncontrolled))
    rep.done(summary)
    if interrupted is not None:
        raise interrupted
    if d.uncontrolled:
        raise Partial(summary)
    return summary


def read_log(path: str) -> dict:
    """An elastic log of either format (a one-line error for anything else)."""
    try:
        doc = model.load(path)
    except model.NotResults as e:
        raise UsageError(f"{path} is not a tilewise elastic log ({e})") from None
    if doc.get("kind") != "elastic.log":
        raise UsageError(f"{path} is not a tilewise elastic log: it holds {doc.get('kind')} results",
                         "show it with tilewise report")
    return doc


@dataclass
class Replay:
    summary: dict
    show_stats: bool = False  # the log has an end record with the daemon's own cost


def replay(path: str, plot_path: str | None = None) -> Replay:
    """--replay LOG [--plot PNG]: the summary the run printed, read back (and drawn)."""
    doc = elastic_log.KIND.view(read_log(path))
    summary = elastic_log.replay_summary(doc, path)
    if plot_path:
        elastic_log.plot(doc, plot_path, title=os.path.basename(path))
        summary["plot"] = plot_path
    return Replay(summary, doc.end is not None)
