"""`tilewise tune`: find the best application-agnostic configuration (allocator, memory policy,
thread placement, OS switches) for a workload, a running engine (`--engine`, paper 003's TPC-H
study) or an arbitrary command on this machine."""

from __future__ import annotations

import click

from tilewise import benchmarks
from tilewise.cli.common import AT_LEAST_1, INDEX, PERCENT, SECONDS, conflicts, console, emit_json, explicit, json_option
from tilewise.cli.engines import EngineChoice
from tilewise.cli.workload import make_params, os_options, workload_options
from tilewise.errors import UsageError
from tilewise.tune import workloads as wl


@click.command("tune", context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("--workload", "-w", "workload_name", metavar="W", help="W1, W2, W3, W4 or alloc (or --engine E, or -- CMD ...).")
@workload_options
@click.option("--engine", "-e", "engine", default=None, type=EngineChoice(),
              help="Tune a running engine: started through its runtime per configuration, queried (paper 003's W5).")
@click.option("--benchmark", "-b", "benchmark", type=click.Choice(benchmarks.names()), default=None,
              help="With --engine: whose queries (default tpch).")
@click.option("--sf", default=None, help="With --engine: scale factor (default 0.1).")
@click.option("--queries", "query_list", default=None, metavar="LIST", help="With --engine: e.g. 1,6,10-12 (default: all).")
@click.option("--policy", default=None, metavar="POLICY", help="With --engine: the deployment (default wim; see tilewise plan).")
@click.option("--cores", type=AT_LEAST_1, default=None,
              help="With --engine and --placements dense/sparse: the CPUs the instance gets, in that order.")
@click.option("--data-dir", default=None, metavar="DIR", help="With --engine: the data cache (default ~/.cache/tilewise/<benchmark>).")
@click.option("--min-gain", type=PERCENT, default=None,
              help="With --engine: the smallest mean gain (%) worth recommending a change (default 2).")
@click.option("--max-slowdown", type=PERCENT, default=None,
              help="With --engine: a query slower than this (%, significantly) rules a configuration out (default 5).")
@click.option("--allocators", "alloc_list", default=None, metavar="LIST",
              help="Allocators to try (default: every one installed): system,jemalloc,tcmalloc,mimalloc,tbbmalloc.")
@click.option("--mem", "mem_list", default="first-touch,interleave", show_default=True, metavar="LIST",
              help="Memory policies: first-touch, interleave[:NODES], local, preferred[:N], membind[:NODES].")
@click.option("--placements", default="none", show_default=True, metavar="LIST", help="none, sparse, dense.")
@click.option("--repeat", "-r", type=AT_LEAST_1, default=3, show_default=True, help="Measured runs per configuration.")
@click.option("--warmup", type=INDEX, default=None,
              help="Unmeasured runs per configuration first (default 0; with --engine 1: the cold run is dropped).")
@click.option("--out", "out_dir", default="tune-results", show_default=True, metavar="DIR",
              help="results.json, results.csv, fig6.png (--engine: change.csv, fig8.png), tuned.json go here.")
@os_options
@click.option("--restore", is_flag=True, help="Only undo what runs killed hard left changed (same as `tilewise restore`), then exit.")
@click.option("--timeout", type=SECONDS, default=600, show_default=True,
              help="Seconds per run (--engine: per query) before it is stopped.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def tune_cmd(workload_name, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale,
             engine, benchmark, sf, query_list, policy, cores, data_dir, min_gain, max_slowdown,
             alloc_list, mem_list, placements, repeat, warmup, out_dir, apply_os, thp, autonuma, os_root, restore,
             timeout, as_json, command):
    """Sweep a grid of configurations, repeat runs, report the best one with its speedup over the
    default (system allocator, first-touch, no placement) and the spread, write results and a plot,
    and write the winner as a configuration file (for `exec --config`, `workload --config`).

    With --engine, the engine is started through its runtime for each allocator, memory policy and
    placement (OS switches apply while it runs), runs the benchmark's queries, and the result is
    every query's latency change per configuration against the default with 95 % intervals (paper
    003's Fig. 8), and a recommendation with its reasons.

    Examples: `tilewise tune -w W1 --allocators system,tbbmalloc --repeat 5`;
    `tilewise tune --engine postgres --sf 1 --queries 5,18 --allocators system,jemalloc,tbbmalloc`;
    black-box: `tilewise tune --allocators system,jemalloc -- ./my_engine --query q1.sql`.
    """
    from tilewise.tune import session

    if restore:
        conflicts("--restore", ("workload_name", "dataset", "records", "groups", "zipf_exponent", "ratio", "ops", "slots",
                                "threads", "seed", "paper_scale", "engine", "benchmark", "sf", "query_list", "policy",
                                "cores", "data_dir", "min_gain", "max_slowdown", "alloc_list", "mem_list", "placements",
                                "repeat", "warmup", "out_dir", "apply_os", "thp", "autonuma", "timeout"),
                  "--restore only undoes what a crashed run left, then exits")
        if command:
            raise UsageError("--restore takes no command", "run `tilewise tune --restore` alone")
        from tilewise.cli.restore import restore_report

        return restore_report(as_json)
    engine_only = ("benchmark", "sf", "query_list", "policy", "cores", "data_dir", "min_gain", "max_slowdown")
    if engine:
        if workload_name or command:
            raise UsageError("give one of --workload W, --engine E or a command after --")
        conflicts("--engine", ("dataset", "records", "groups", "zipf_exponent", "ratio", "ops", "slots", "threads", "seed",
                               "paper_scale"), "workload options apply to --workload")
        from tilewise.tune import engine as engine_tune
        from tilewise.tune import recommend

        ecfg = engine_tune.Config(
            engine=engine, benchmark=benchmark or "tpch", sf=sf if sf is not None else "0.1", queries=query_list,
            policy=policy or "wim", cores=cores, allocators=alloc_list, mem=mem_list, placements=placements,
            repeat=repeat, warmup=1 if warmup is None else warmup, out=out_dir, apply_os=apply_os, thp=thp,
            autonuma=autonuma, os_root=os_root, data_dir=data_dir, timeout=timeout,
            min_gain=recommend.MIN_GAIN if min_gain is None else min_gain / 100,
            max_slowdown=recommend.MAX_SLOWDOWN if max_slowdown is None else max_slowdown / 100)
        return engine_tune.run(ecfg, _Reporter(as_json))
    given = explicit(*engine_only)
    if given:
        raise UsageError(f"{given[0]} applies to --engine E", "add --engine, or drop it")
    warmup = warmup or 0
    w = wl.canonical(workload_name) if workload_name else None
    if w:
        params = make_params(w, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale)
    elif any(v is not None for v in (dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed)) or paper_scale:
        raise UsageError("workload options (--records, --threads, ...) apply to --workload, not to a command")
    else:
        params = None
    cfg = session.Config(workload=w, params=params, command=tuple(command), allocators=alloc_list, mem=mem_list,
                         placements=placements, repeat=repeat, warmup=warmup, out=out_dir, apply_os=apply_os, thp=thp,
                         autonuma=autonuma, os_root=os_root, timeout=timeout)
    session.run(cfg, _Reporter(as_json))


class _Reporter:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.err = console(stderr=True)

    def message(self, text: str) -> None:
        if not self.as_json:
            self.err.print(text, markup=False)

    def done(self, doc: dict) -> None:
        if self.as_json:
            return emit_json(doc)
        from tilewise.results import report

        out = console(wide=True)
        report.render(doc, out)
        for k, p in doc["files"].items():
            out.print(f"wrote {k}: {p}", markup=False)
