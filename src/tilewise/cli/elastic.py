"""`tilewise elastic`: hand a running DBMS only the cores its load needs (paper 002)."""

from __future__ import annotations

import click

from tilewise.cli.common import NON_NEGATIVE, OUTPUT_FILE, PID, SECONDS, conflicts, console, emit_json, json_option, topology_option
from tilewise.errors import UsageError
from tilewise.results.kinds import elastic_log


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
@click.option("--log", "log_path", default=None, type=OUTPUT_FILE,
              help="Write every tick's firings as they happen (a results document, JSON lines; `tilewise report FILE`).")
@click.option("--replay", "replay_path", default=None, metavar="LOG", help="Summarise (and with --plot draw) a --log file.")
@click.option("--plot", "plot_path", default=None, type=OUTPUT_FILE, metavar="PNG", help="With --replay: load and allocated cores over time.")
@click.option("--enforce", type=click.Choice(["auto", "cgroup", "affinity"]), default="auto", show_default=True,
              help="auto: a cpuset cgroup of our own where possible, else sched_setaffinity on every thread.")
@click.option("--smt", is_flag=True, help="Hand out a core with all its hardware threads (default: one PU per core).")
@click.option("--pages-interval", type=SECONDS, default=1.0, show_default=True, help="adaptive: seconds between numa_maps reads.")
@click.option("--stats", "show_stats", is_flag=True, help="Print the controller's own CPU cost (per tick and in total).")
@click.option("--quiet", "-q", is_flag=True, help="Text mode: only the summary, not each core change.")
@click.option("--whole-machine", is_flag=True,
              help="Admit a target whose tree is the whole machine (pid 1, a systemd manager, a container's init, "
                   "the root cgroup); refused without it.")
@topology_option
@json_option
def elastic(pid, cgroup_path, use_instances, cluster_name, mode, metric, th_min, th_max, interval, duration, dry_run, trace_path,
            log_path, replay_path, plot_path, enforce, smt, pages_interval, show_stats, quiet, whole_machine, topology_src,
            as_json):
    """Elastic core allocator: start the target at one core, add one when the load of its cores
    reaches --th-max, release one at --th-min (a Petri-net controller); restore everything on exit.

    Before changing anything it checks that it may (the target's processes are yours, or you
    have CAP_SYS_NICE; a cgroup is writable or delegated to you) and otherwise refuses in one
    line. Exit 3: the run was partial (processes that joined later were not yours to control).

    \b
    tilewise elastic --pid 1234 --duration 60 --log el.jsonl
    tilewise elastic --replay el.jsonl --plot el.png
    tilewise elastic --dry-run --trace load.csv --topology synthetic:"Package:2 [NUMANode] L3Cache:8 Core:8 PU:2"
    """
    from tilewise.elastic import session

    if replay_path:
        conflicts("--replay", ("pid", "cgroup_path", "use_instances", "cluster_name", "mode", "metric", "th_min", "th_max",
                               "interval", "duration", "dry_run", "trace_path", "log_path", "enforce", "smt",
                               "pages_interval", "show_stats", "quiet", "whole_machine", "topology_src"),
                  "--replay only reads a log (and draws it with --plot)")
        r = session.replay(replay_path, plot_path)
        if as_json:
            return emit_json(r.summary)
        _report(r.summary, r.show_stats)
        if plot_path:
            console().print(f"plot: {plot_path}", markup=False)
        return
    if plot_path:
        raise UsageError("--plot draws a log", "use it with --replay LOG")
    if cluster_name is not None and not use_instances:
        raise UsageError("--cluster picks the cluster for --instances", "add --instances, or drop --cluster")
    if mode != "adaptive":
        conflicts(f"--mode {mode}", ("pages_interval",), "--pages-interval is for --mode adaptive")
    if dry_run:
        conflicts("--dry-run", ("enforce", "whole_machine"), "a dry run enforces nothing")
    cfg = session.Config(pid=pid, cgroup=cgroup_path, instances=use_instances, cluster=cluster_name, mode=mode,
                         metric=metric, th_min=th_min, th_max=th_max, interval=interval, duration=duration,
                         dry_run=dry_run, trace=trace_path, log=log_path, enforce=enforce, smt=smt,
                         pages_interval=pages_interval, topology_src=topology_src, whole_machine=whole_machine)
    session.run(cfg, _Reporter(as_json, quiet, show_stats))


class _Reporter:
    """Core changes and notes on stderr as they happen (text mode), the summary at the end."""

    def __init__(self, as_json: bool, quiet: bool, show_stats: bool) -> None:
        self.as_json, self.show_stats = as_json, show_stats
        self.live = not as_json and not quiet
        self.err = console(stderr=True)

    def note(self, text: str) -> None:
        if not self.as_json:
            self.err.print(f"note: {text}", markup=False)

    def record(self, rec: dict) -> None:
        if not self.live:
            return
        ev = rec.get("event")
        if ev == "start":
            self.err.print(f"{rec['unit']}: start with 1 of {rec['n_total']} cores (OS cpus {rec['cpus']}), mode {rec['mode']}, "
                           f"enforcement {rec['enforce']}", markup=False)
        elif ev == "not controlled":
            self.err.print(f"{rec['unit']}: {rec['detail']}", markup=False)
        elif ev:
            self.err.print(f"{rec['unit']}: {ev} at {rec['t']:.2f}s", markup=False)
        elif rec.get("action") != "none":
            self.err.print(f"{rec['t']:8.2f}s {rec['unit']}: u={rec['u']:5.1f}% {','.join(rec['transitions'])} "
                           f"{rec['action']} -> {rec['n_alloc']} cores (OS cpus {rec['cpus']})", markup=False)

    def done(self, summary: dict) -> None:
        if self.as_json:
            emit_json(summary)
        else:
            _report(summary, self.show_stats)


def _report(summary: dict, show_stats: bool) -> None:
    out = console()
    elastic_log.print_summary(summary, out, show_stats=show_stats)
    if summary.get("log"):
        out.print(f"log: {summary['log']} (draw it: tilewise elastic --replay {summary['log']} --plot elastic.png; "
                  f"show it: tilewise report {summary['log']})", markup=False)
