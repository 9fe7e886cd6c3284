"""`tilewise workload`: run one in-memory analytics workload (paper 003; the thesis's tensor
operators T1-T3, options in workload_tensor.py) under one configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from tilewise import allocators
from tilewise.cli.common import (AT_LEAST_1, COUNT, Number, NON_NEGATIVE, SECONDS, SEED, Messages, conflicts, console, emit_json,
                                 json_option, topology_option)
from tilewise.cli import modes
from tilewise.cli.workload_tensor import tensor_options
from tilewise.errors import UsageError

MAX_THREADS = 4096  # more is a typo, not an experiment: refused at parse time, never clamped
WORKLOAD_NAMES = ("W1", "W2", "W3", "W4", "alloc", "T1", "T2", "T3")


def workload_options(f):
    """Workload size and shape; shared by `workload` and `tune --workload`."""
    opts = [
        click.option("--dataset", default=None, help="W1/W2: moving-cluster (default), sequential, zipf; W3/W4: uniform; "
                                                     "T1/T2: unique (default), uniform, zipf, sparse."),
        click.option("--records", type=COUNT, default=None,
                     help="W1/W2: input records (default 10M); W3/W4: build-side rows (default 1M, probe = ratio x); "
                          "T1: keys (default 10M); T2: R rows (default 4M)."),
        click.option("--groups", type=COUNT, default=None,
                     help="W1/W2: group-by cardinality (default 100K); T1/T2 uniform, zipf, sparse: distinct values drawn from."),
        click.option("--zipf-exponent", type=NON_NEGATIVE, default=None, help="zipf dataset exponent (default 0.5)."),
        click.option("--ratio", type=AT_LEAST_1, default=None,
                     help="W3/W4: probe rows per build row (default 16); T2: S rows per R row (default 1)."),
        click.option("--ops", type=COUNT, default=None, help="alloc: operations per thread (default 5M)."),
        click.option("--slots", type=COUNT, default=None, help="alloc: live-block slots per thread (default 200K)."),
        click.option("--threads", "-t", type=Number(integer=True, min=1, max=MAX_THREADS), default=None,
                     help=f"Worker threads (default: the CPUs allowed; at most {MAX_THREADS})."),
        click.option("--seed", type=SEED, default=None, help="Dataset seed (default 42)."),
        click.option("--paper-scale", is_flag=True, help="The paper's sizes: 100M/1M (W1, W2), 16M x 256M (W3, W4), 100M ops (alloc); "
                                                          "T3: LiveJournal's size, T1/T2: 10M."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_params(workload, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale):
    from tilewise.tune import workloads as wl

    if paper_scale:
        conflicts("--paper-scale", ("records", "groups", "ops"), "--paper-scale sets the paper's sizes; give either")
        scale = wl.PAPER_SCALE[workload]
        records = records if records is not None else scale.get("records")
        groups = groups if groups is not None else scale.get("groups")
        ops = ops if ops is not None else scale.get("ops")
    p = wl.Params(dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed)
    wl.validate(workload, p)
    return p


def os_options(f):
    opts = [
        click.option("--apply-os", is_flag=True, help="Change OS switches for the run (root; always restored, journaled)."),
        click.option("--thp", default=None, metavar="MODE", help="THP during the run: always, madvise, never (needs --apply-os)."),
        click.option("--autonuma", default=None, metavar="on|off", help="AutoNUMA during the run (needs --apply-os)."),
        click.option("--os-root", default="/", hidden=True, help="Root directory for sysfs/procfs (tests)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _is(*names: str) -> Callable[[dict], bool]:
    return lambda a: a["name"].strip().upper() in names


# which options go with which workloads (cli/modes.py): refused elsewhere, shown in --help
MODES = modes.declare(
    modes.Mode("the tensor workloads T1-T3", _is("T1", "T2", "T3"), ("device", "variants_text")),
    modes.Mode("the tensor workloads T1-T3", _is("T1", "T2", "T3"), ("runs", "warmup", "policy", "instance_id")),
    modes.Mode("the far-memory study (--mem-variants)", lambda a: a["mem_variants"] is not None,
               ("runs", "warmup", "policy", "instance_id")),
    modes.Mode("T1 and T2", _is("T1", "T2"), ("rename_method", "bincount_memory_text")),
    modes.Mode("T3", _is("T3"), ("scale", "iterations", "tolerance", "damping", "dtype")),
    modes.Mode("the allocator microbenchmark (alloc)", _is("ALLOC"), ("ops", "slots")),
    modes.Mode("the workloads W1-W4", _is("W1", "W2", "W3", "W4"), ("mem_variants",),
               hint="the far-memory study runs W1-W4 (and `tilewise bench tpch --mem-variants`)"),
    current=lambda a: a["name"].strip(),
)


@MODES
@click.command("workload")
@click.argument("name", metavar="W1|W2|W3|W4|alloc|T1|T2|T3")
@workload_options
@click.option("--allocator", default=None, help=f"Preload an allocator: {', '.join(allocators.names())} (system = ptmalloc).")
@click.option("--mem", default=None, metavar="POLICY",
              help="first-touch (default), interleave[:NODES], local, preferred[:N], membind[:NODES].")
@click.option("--placement", type=click.Choice(["none", "sparse", "dense"]), default=None,
              help="Thread placement inside the process (default none: the OS schedules).")
@click.option("--mem-variants", "mem_variants", default=None, metavar="LIST",
              help="W1-W4: the far-memory study: run in one tile of --policy (default win, --instance 0) with the data "
                   "in near memory, its far tier, interleaved over both, weighted by bandwidth "
                   "(near,far,interleave,weighted), --runs each; the slowdown against near memory with a verdict. "
                   "Without a far tier it says so and runs nothing.")
@click.option("--config", "config_path", metavar="FILE", help="A configuration written by `tilewise tune` (flags win).")
@os_options
@click.option("--timeout", type=SECONDS, default=600, show_default=True, help="Seconds before the run is stopped.")
@click.option("--dry-run", is_flag=True, help="Print the command, binding and per-thread CPUs; run nothing.")
@click.option("--out", "out_dir", default=None, metavar="DIR",
              help="Also write results.json (the results model; compare runs with `tilewise report`).")
@tensor_options
@topology_option
@json_option
def workload_cmd(name, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale,
                 allocator, mem, placement, mem_variants, config_path, apply_os, thp, autonuma, os_root, timeout, dry_run,
                 out_dir, device, variants_text, rename_method, bincount_memory_text, scale, iterations, tolerance,
                 damping, dtype, runs, warmup, policy, instance_id, topology_src, as_json):
    """Run one workload (W1 holistic aggregation, W2 distributive aggregation, W3 hash join,
    W4 index nested-loop join, alloc microbenchmark; the thesis's tensor operators T1 DISTINCT
    cardinality, T2 join cardinality, T3 PageRank, on CPU or a GPU) with an allocator, memory policy
    and thread placement; print its result (time, max RSS, checksum; T1-T3: every variant's time,
    ratios and the check of its answer)."""
    from tilewise.cli import workload_tensor as wt
    from tilewise.results import report
    from tilewise.tensor import is_tensor_workload
    from tilewise.tune import workload_session as session
    from tilewise.tune import workloads as wl

    k = session.Knobs(allocator, mem, placement, config_path, apply_os, thp, autonuma, os_root)
    if mem_variants is not None:
        conflicts("--mem-variants", ("mem",), "the variants choose each run's memory policy")
    if is_tensor_workload(name):
        w = name.strip().upper()
        p = wt.make_params(w, dataset, records, groups, zipf_exponent, ratio, threads, seed, paper_scale, device,
                           variants_text, rename_method, bincount_memory_text, scale, iterations, tolerance, damping,
                           dtype, runs, warmup)
        return wt.run(p, k, policy, instance_id, timeout, dry_run, out_dir, topology_src, as_json)
    try:
        w = wl.canonical(name)
    except UsageError:
        raise UsageError(f"unknown workload {name!r}", f"choose one of {', '.join(WORKLOAD_NAMES)}") from None
    p = make_params(w, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale)
    cfg = session.Config(w, p, k, timeout=timeout, out=out_dir, topology_src=topology_src)
    rep = Messages(quiet=as_json)
    if mem_variants is not None:
        fm = session.FarMemory(mem_variants, (policy or "win").strip().lower(), instance_id or 0, runs, warmup)
        if dry_run:
            return show_variants(session.describe_far_memory(cfg, fm, rep), as_json)
        doc = session.run_far_memory(cfg, fm, Messages(quiet=as_json, prefix="tilewise: "))
    elif dry_run:
        return show_dry_run(session.describe(cfg, rep), as_json)
    else:
        doc = session.run(cfg, rep)
    if as_json:
        return emit_json(doc)
    report.render(doc, console(wide=True))
    if out_dir:
        console().print(f"wrote {Path(out_dir) / 'results.json'}", markup=False)


def show_dry_run(doc: dict, as_json: bool) -> None:
    from tilewise.tune import knobs, workloads as wl

    if as_json:
        return emit_json(doc)
    out = console()
    out.print(f"{doc['workload']}: {wl.DESCRIPTIONS[doc['workload']]}", markup=False)
    out.print(f"config: {knobs.Config.from_json(doc['config']).label()}", markup=False)
    out.print(f"thread CPUs: {doc['pin'] if doc['pin'] else 'none (OS schedules)'}", markup=False)
    out.print(f"command: {doc['reproduce']}", markup=False)


def show_variants(doc: dict, as_json: bool) -> None:
    if as_json:
        return emit_json(doc)
    out = console()
    for v in doc["variants"]:
        out.print(f"{v['name']}: {v['describe']} ({v['mem_reason']})", markup=False)
