"""`tilewise bench elastic-tick`: the elastic controller's CPU cost per tick (synthetic or real /proc)."""

from __future__ import annotations

import click

from tilewise.cli.common import (AT_LEAST_1, SECONDS, Messages, Number, conflicts, console, emit_json, json_option,
                                 topology_option)


@click.command("elastic-tick")
@click.option("--proc", "proc_kind", type=click.Choice(["synthetic", "real"]), default="synthetic", show_default=True,
              help="synthetic: a generated /proc for a target on --topology (any size); real: a target on this machine.")
@topology_option
@click.option("--modes", "mode_list", default="dense,sparse,adaptive", show_default=True, help="Allocation modes to run.")
@click.option("--threads", type=AT_LEAST_1, default=None,
              help="Threads of the target (default: synthetic, one per CPU of the topology; real: 16).")
@click.option("--processes", type=AT_LEAST_1, default=1, show_default=True, help="synthetic: processes in the target's tree.")
@click.option("--ticks", type=AT_LEAST_1, default=None, help="synthetic: ticks per mode (default: 3 x (cores + 10)).")
@click.option("--mappings", type=AT_LEAST_1, default=500, show_default=True, help="synthetic: lines of each numa_maps.")
@click.option("--duration", type=SECONDS, default=10.0, show_default=True, help="real: seconds per mode.")
@click.option("--busy", type=Number(min=0, max=1), default=0.5, show_default=True, help="real: busy fraction of each target thread.")
@click.option("--enforce", type=click.Choice(["auto", "cgroup", "affinity", "none"]), default="auto", show_default=True,
              help="real: how cores are handed out (none: measure and decide only).")
@click.option("--interval", type=SECONDS, default=0.1, show_default=True, help="Seconds between ticks.")
@click.option("--pages-interval", type=SECONDS, default=1.0, show_default=True, help="adaptive: seconds between numa_maps reads.")
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="Also write DIR/results.json (kind elastic.tick; `tilewise report DIR`) and results.csv.")
@json_option
def bench_tick(proc_kind, topology_src, mode_list, threads, processes, ticks, mappings, duration, busy, enforce, interval,
               pages_interval, out_dir, as_json):
    """Per-tick CPU time of the elastic daemon (mean/median/p99/max) and its share of one core.

    \b
    tilewise bench elastic-tick                       # 256 CPUs, synthetic /proc
    tilewise bench elastic-tick --topology synthetic:"Package:1 [NUMANode] L3Cache:2 Core:8 PU:1"
    tilewise bench elastic-tick --proc real --threads 16 --duration 10
    """
    from tilewise.elastic import tickbench as tb
    from tilewise.results import report

    if proc_kind == "real":
        conflicts("--proc real", ("processes", "ticks", "mappings"), "--processes, --ticks and --mappings shape the synthetic /proc")
    else:
        conflicts("--proc synthetic", ("duration", "busy", "enforce"), "--duration, --busy and --enforce are for --proc real")
    cfg = tb.Config(proc_kind, topology_src, mode_list, threads, processes, ticks, mappings, duration, busy, enforce,
                    interval, pages_interval, out_dir)
    doc = tb.run(cfg, Messages(quiet=as_json))
    if as_json:
        emit_json(doc)
        return
    c = console()
    c.width = max(c.width, 120)
    report.render(doc, c)
