"""`tilewise elastic`: hand a running DBMS only the cores its load needs (paper 002)."""

from __future__ import annotations

import os

import click

from tilewise import signals
from tilewise.cli.common import NON_NEGATIVE, PID, SECONDS, conflicts, console, emit_json, json_option, topology_option
from tilewise.errors import TilewiseError, UsageError
from tilewise.procs import ProcId
from tilewise.results import model
from tilewise.results.kinds import elastic_log
from tilewise.results.output import LineWriter


@click.command("elastic")
@click.option("--pid", type=PID, default=None, help="Manage this process and everything it spawns.")
@click.option("--cgroup", "cgroup_path", default=None, metavar="PATH",
              help="Manage the tasks of this cpuset cgroup (a child group of ours is created inside it).")
@click.option("--instances", "use_instances", is_flag=True, help="Manage each instance of the cluster `tilewise up` started.")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME", help="With --instances: which cluster (when several run).")
@click.option("--mode", type=click.Choice(["dense", "sparse", "adaptive"]), default="adaptive", show_default=True,
              help="Which core next: fill a node / round-robin over nodes / node with most of the target's pages.")
@click.option("--metric", type=click.Choice(["cpu", "traffic"]), default="cpu", show_default=True,
              help="cpu: load of the allocated cores; traffic: remote/local memory traffic (needs uncore counters).")
@click.option("--th-min", type=NON_NEGATIVE, default=None, help="Release a core at or below this (default 10 %; traffic 0.1).")
@click.option("--th-max", type=NON_NEGATIVE, default=None, help="Add a core at or above this (default 70 %; traffic 0.4).")
@click.option("--interval", type=SECONDS, default=0.1, show_default=True, help="Seconds between ticks.")
@click.option("--duration", type=SECONDS, default=None, metavar="S", help="Stop after S seconds (default: until the target exits or Ctrl-C).")
@click.option("--dry-run", is_flag=True, help="Measure and decide, change nothing (with --trace: simulate on --topology).")
@click.option("--trace", "trace_path", default=None, metavar="FILE", help="With --dry-run: a recorded load trace (CSV time,demand|load or JSON lines).")
@click.option("--log", "log_path", default=None, metavar="FILE",
              help="Write every tick's firings as they happen (a results document, JSON lines; `tilewise report FILE`).")
@click.option("--replay", "replay_path", default=None, metavar="LOG", help="Summarise (and with --plot draw) a --log file.")
@click.option("--plot", "plot_path", default=None, metavar="PNG", help="With --replay: load and allocated cores over time.")
@click.option("--enforce", type=click.Choice(["auto", "cgroup", "affinity"]), default="auto", show_default=True,
              help="auto: a cpuset cgroup of our own where possible, else sched_setaffinity on every thread.")
@click.option("--smt", is_flag=True, help="Hand out a core with all its hardware threads (default: one PU per core).")
@click.option("--pages-interval", type=SECONDS, default=1.0, show_default=True, help="adaptive: seconds between numa_maps reads.")
@click.option("--stats", "show_stats", is_flag=True, help="Print the controller's own CPU cost (per tick and in total).")
@click.option("--quiet", "-q", is_flag=True, help="Text mode: only the summary, not each core change.")
@topology_option
@json_option
def elastic(pid, cgroup_path, use_instances, cluster_name, mode, metric, th_min, th_max, interval, duration, dry_run, trace_path,
            log_path, replay_path, plot_path, enforce, smt, pages_interval, show_stats, quiet, topology_src, as_json):
    """Elastic core allocator: start the target at one core, add one when the load of its cores
    reaches --th-max, release one at --th-min (a Petri-net controller); restore everything on exit.

    \b
    tilewise elastic --pid 1234 --duration 60 --log el.jsonl
    tilewise elastic --replay el.jsonl --plot el.png
    tilewise elastic --dry-run --trace load.csv --topology synthetic:"Package:2 [NUMANode] L3Cache:8 Core:8 PU:2"
    """
    if replay_path:
        conflicts("--replay", ("pid", "cgroup_path", "use_instances", "cluster_name", "mode", "metric", "th_min", "th_max",
                               "interval", "duration", "dry_run", "trace_path", "log_path", "enforce", "smt",
                               "pages_interval", "show_stats", "quiet", "topology_src"),
                  "--replay only reads a log (and draws it with --plot)")
        return _replay(replay_path, plot_path, as_json)
    if plot_path:
        raise UsageError("--plot draws a log", "use it with --replay LOG")
    if cluster_name is not None and not use_instances:
        raise UsageError("--cluster picks the cluster for --instances", "add --instances, or drop --cluster")
    if mode != "adaptive":
        conflicts(f"--mode {mode}", ("pages_interval",), "--pages-interval is for --mode adaptive")
    if dry_run:
        conflicts("--dry-run", ("enforce",), "a dry run enforces nothing")
    if metric == "traffic":
        from tilewise.elastic.metrics import traffic_availability

        ok, why = traffic_availability()
        if not ok:
            raise TilewiseError(f"--metric traffic: {why}", "use --metric cpu")
    th_min = 10.0 if th_min is None else th_min
    th_max = 70.0 if th_max is None else th_max
    if not (0 <= th_min < th_max <= 100):
        raise UsageError(f"thresholds must satisfy 0 <= th-min < th-max <= 100 (got {th_min}, {th_max})")

    from tilewise import topology
    from tilewise.elastic import daemon, enforce as enf, modes, petri

    if trace_path:
        if not dry_run:
            raise UsageError("--trace runs the controller on a recorded trace and changes nothing", "add --dry-run")
        if pid or cgroup_path or use_instances:
            raise UsageError("--trace replaces the target", "drop --pid/--cgroup/--instances")
        t = topology.load(topology_src)
        pool = modes.make_pool(t, None, smt)
        unit = daemon.Unit("trace", pool, petri.NetConfig(th_min, th_max, pool.n_total), mode)
        rows = daemon.load_trace(trace_path)
        params = {"source": trace_path, "topology": t.summary(), "mode": mode, "n_total": pool.n_total,
                  "th_min": th_min, "th_max": th_max, "enforce": "simulated"}
        with _log(log_path, t, params) as sink:
            recs = daemon.simulate(rows, unit, sink)
            summary = elastic_log.summarize(elastic_log.records(recs), {**params, "log": log_path})
            ms = [r["tick_cpu_ms"] for r in recs if "tick_cpu_ms" in r]
            if ms:
                summary["stats"] = {"ticks": len(ms), "tick_cpu_ms": daemon.tick_cpu_stats(ms),
                                    "daemon_cpu_s": round(sum(ms) / 1e3, 4), "wall_s": None, "daemon_cpu_pct_of_core": None}
            sink(elastic_log.end_record(t=recs[-1]["t"] if recs else None, stop_reason=None, stats=summary.get("stats")))
        return _report(summary, as_json, quiet, show_stats)

    if sum(bool(x) for x in (pid, cgroup_path, use_instances)) != 1:
        raise UsageError("give exactly one target: --pid PID, --cgroup PATH or --instances",
                         "or --dry-run --trace FILE to simulate, or --replay LOG")
    t = topology.load(topology_src)
    if not topology.is_live(t):
        raise UsageError(f"the topology {t.source} is not this machine: a live target can only be driven on this machine's topology",
                         "drop --topology, or simulate with --dry-run --trace FILE")

    proc = daemon.ProcFS()
    cfg_for = lambda pool: petri.NetConfig(th_min, th_max, pool.n_total)  # noqa: E731
    units = []
    notes = []
    if not dry_run:  # undo first what daemons (or tune runs) killed hard left behind
        from tilewise import changes

        for r in changes.restore_all():
            if r.state in ("restored", "failed", "earlier-boot", "unreadable"):
                notes += r.lines()
    if pid or cgroup_path:
        target = daemon.PidTarget(pid, proc) if pid else daemon.CgroupTarget(os.path.abspath(cgroup_path), proc)
        if pid and pid == os.getpid():
            raise UsageError("the daemon cannot manage itself")
        if pid and not proc.alive(pid):
            raise TilewiseError(f"no running process with pid {pid}", "check the pid (ps -e)")
        allowed = target.allowed_cpus()
        pool = modes.make_pool(t, allowed, smt)
        units.append(daemon.Unit(target.name, pool, cfg_for(pool), mode, target))
    else:
        for name, ipid, cpus in _cluster_instances(cluster_name):
            target = daemon.PidTarget(ipid, proc)
            pool = modes.make_pool(t, cpus or target.allowed_cpus(), smt)
            units.append(daemon.Unit(f"instance {name}", pool, cfg_for(pool), mode, target))
    for u in units:
        if not dry_run:
            tree = set(u.target.tasks().values()) if isinstance(u.target, daemon.PidTarget) else None
            u.enforcer = enf.choose(enforce, getattr(u.target, "pid", None), getattr(u.target, "path", None),
                                    tree_pids=tree)
            if u.enforcer.reason and enforce == "auto":
                notes.append(f"{u.name}: using sched_setaffinity ({u.enforcer.reason})")

    out = console(stderr=True)
    live = not as_json and not quiet

    def show(rec: dict) -> None:
        if rec.get("event"):
            if live and rec["event"] == "start":
                out.print(f"{rec['unit']}: start with 1 of {rec['n_total']} cores (OS cpus {rec['cpus']}), mode {rec['mode']}, "
                          f"enforcement {rec['enforce']}", markup=False)
            elif live:
                out.print(f"{rec['unit']}: {rec['event']} at {rec['t']:.2f}s", markup=False)
            return
        if live and rec.get("action") != "none":
            out.print(f"{rec['t']:8.2f}s {rec['unit']}: u={rec['u']:5.1f}% {','.join(rec['transitions'])} "
                      f"{rec['action']} -> {rec['n_alloc']} cores (OS cpus {rec['cpus']})", markup=False)

    recs: list[dict] = []
    params = {"target": [u.name for u in units], "mode": mode, "metric": metric, "th_min": th_min, "th_max": th_max,
              "interval": interval, "duration": duration, "dry_run": dry_run, "enforce": enforce, "smt": smt,
              "pages_interval": pages_interval}
    with _log(log_path, t, params) as sink:
        def log(rec: dict) -> None:
            recs.append(rec)
            sink(rec)
            show(rec)

        d = daemon.Daemon(units, interval=interval, dry_run=dry_run, pages_interval=pages_interval, log=log, proc=proc)
        interrupted = None
        try:
            with d:
                for n in notes:
                    if not as_json:
                        out.print(f"note: {n}", markup=False)
                d.run(duration=duration)
        except (KeyboardInterrupt, signals.Terminated) as e:  # restored by `with d`: report, then re-raise
            interrupted = e
            d.stop_reason = "stopped by signal"
        notes += [k for u in units if u.enforcer is not None for k in u.enforcer.kept]
        summary = elastic_log.summarize(elastic_log.records(recs), {
            "target": [u.name for u in units], "mode": mode, "th_min": th_min, "th_max": th_max, "interval": interval,
            "dry_run": dry_run, "log": log_path, "enforce": ["dry-run" if dry_run else u.enforcer.kind for u in units],
            "stop_reason": d.stop_reason, "restored": not d.problems, "problems": d.problems, "notes": notes})
        summary["stats"] = d.stats()
        sink(elastic_log.end_record(t=round(d.clock() - d.t0, 6), stop_reason=d.stop_reason, stats=summary["stats"],
                                    problems=d.problems, interrupted=interrupted is not None))
    _report(summary, as_json, quiet, show_stats)
    if interrupted is not None:
        raise interrupted


def _cluster_instances(name: str | None):
    """(name, pid, cpus) of the running cluster's worker instances (the state `tilewise up` records)."""
    try:
        from tilewise import cluster
    except ImportError:
        raise TilewiseError("no running cluster: this tilewise has no `tilewise up`", "use --pid PID of a DBMS process") from None
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


def _log(path: str | None, topo, params: dict) -> LineWriter:
    """The --log file: a results document of kind elastic.log, written a line per record as the
    daemon runs (opened before the first tick: a bad path fails early)."""
    return LineWriter(path, model.new("elastic.log", topo=topo, params=params) if path else None)


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


def _report(summary: dict, as_json: bool, quiet: bool, show_stats: bool) -> None:
    if as_json:
        emit_json(summary)
        return
    out = console()
    elastic_log.print_summary(summary, out, show_stats=show_stats)
    if summary.get("log"):
        out.print(f"log: {summary['log']} (draw it: tilewise elastic --replay {summary['log']} --plot elastic.png; "
                  f"show it: tilewise report {summary['log']})", markup=False)


def _replay(path: str, plot_path: str | None, as_json: bool) -> None:
    doc = elastic_log.KIND.view(read_log(path))
    summary = elastic_log.replay_summary(doc, path)
    if plot_path:
        elastic_log.plot(doc, plot_path, title=os.path.basename(path))
        summary["plot"] = plot_path
    if as_json:
        emit_json(summary)
        return
    _report(summary, False, False, doc.end is not None)
    if plot_path:
        console().print(f"plot: {plot_path}", markup=False)
