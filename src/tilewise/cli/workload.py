"""`tilewise workload`: run one in-memory analytics workload (paper 003; the thesis's tensor
operators T1-T3, options in workload_tensor.py) under one configuration."""

from __future__ import annotations

import click

from tilewise import allocators, topology
from tilewise.cli.common import (AT_LEAST_1, COUNT, NON_NEGATIVE, SECONDS, SEED, conflicts, console, emit_json, explicit,
                                 json_option, topology_option)
from tilewise.cli.workload_tensor import TENSOR_OPTIONS, tensor_options
from tilewise.errors import UsageError

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
        click.option("--threads", "-t", type=AT_LEAST_1, default=None, help="Worker threads (default: the CPUs allowed)."),
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
    from tilewise.tensor import is_tensor_workload
    from tilewise.tune import knobs, workloads as wl
    from tilewise.tune.os_switches import OsSwitches

    tensor = is_tensor_workload(name)
    if mem_variants is not None:
        if tensor or name.strip().lower() == "alloc":
            raise UsageError(f"--mem-variants applies to the workloads W1-W4, not {name.strip()}",
                             "the far-memory study runs W1-W4 (and `tilewise bench tpch --mem-variants`)")
        if mem:
            raise UsageError("--mem-variants and --mem cannot be combined", "the variants choose each run's memory policy")
    if tensor:
        w = name.strip().upper()
        given = explicit("ops", "slots")
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the allocator "
                             f"microbenchmark (alloc), not {w}")
        p = wt.make_params(w, dataset, records, groups, zipf_exponent, ratio, threads, seed, paper_scale, device,
                           variants_text, rename_method, bincount_memory_text, scale, iterations, tolerance, damping,
                           dtype, runs, warmup)
    else:
        # the far-memory study runs in a tile of a plan, several times per variant
        study = ("runs", "warmup", "policy", "instance_id") if mem_variants is not None else ()
        given = explicit(*(o for o in TENSOR_OPTIONS if o not in study))
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the tensor workloads "
                             f"T1-T3, not {name.strip()}")
        try:
            w = wl.canonical(name)
        except UsageError:
            raise UsageError(f"unknown workload {name!r}", f"choose one of {', '.join(WORKLOAD_NAMES)}") from None
        p = make_params(w, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale)
    if topology_src and not dry_run:
        raise UsageError("--topology is for --dry-run only: workloads run on this machine", "add --dry-run, or drop --topology")
    t = topology.load(topology_src)
    base = knobs.load_config(config_path).config if config_path else knobs.Config()
    alloc = allocators.get(allocator).name if allocator else base.allocator
    if mem:
        mpol, mnodes = knobs.parse_mem(mem, t)
    else:
        mpol, mnodes = base.mem, base.mem_nodes
    cfg = knobs.Config(alloc, mpol, mnodes, placement or base.placement,
                       thp if thp is not None else (base.thp if apply_os else None),
                       autonuma if autonuma is not None else (base.autonuma if apply_os else None))
    if not apply_os and (base.thp is not None or base.autonuma is not None) and not as_json:
        console(stderr=True).print(f"note: {config_path} also sets OS switches ({base.os_label()}); "
                                   "they are applied only with --apply-os (as root)", markup=False)
    sw = OsSwitches(os_root)
    desired = cfg.os_desired()
    if desired and not apply_os:
        raise UsageError("--thp/--autonuma change the OS and need --apply-os (as root)")
    state = sw.state()
    if tensor:
        return wt.run_cmd(p, cfg, t, sw, desired, apply_os, policy, instance_id, timeout, dry_run, out_dir,
                          topology_src, as_json, _null)
    if mem_variants is not None:
        return _far_memory(w, p, cfg, t, sw, desired, apply_os, mem_variants, policy, instance_id, runs, warmup,
                           timeout, dry_run, out_dir, as_json)
    import os

    allowed = None if topology_src else set(os.sched_getaffinity(0))
    pin = knobs.thread_order(t, cfg.placement, p.threads or len(allowed or t.pus), allowed)
    if dry_run:
        argv = wl.argv(w, p, pin)
        doc = {"workload": w, "argv": argv, "config": cfg.to_json(), "pin": pin,
               "reproduce": cfg.reproduce_env(argv), "os_switches": {k: v.to_json() for k, v in state.items()}}
        if as_json:
            emit_json(doc)
        else:
            out = console()
            out.print(f"{w}: {wl.DESCRIPTIONS[w]}", markup=False)
            out.print(f"config: {cfg.label()}", markup=False)
            out.print(f"thread CPUs: {pin if pin else 'none (OS schedules)'}", markup=False)
            out.print(f"command: {cfg.reproduce_env(argv)}", markup=False)
        return
    from tilewise.environment import system_check
    from tilewise.results import model, report
    from tilewise.results.output import Writer

    writer = Writer(out_dir) if out_dir else Writer(None)  # a bad --out fails before the run
    doc = model.new("workload", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"workload": w, **p.to_json(), "config": cfg.to_json(), "timeout_s": timeout})
    ctx = sw.applied(desired) if apply_os else _null()
    with ctx as changes:
        run_state = sw.state()
        r = wl.run_workload(w, p, cfg, t, timeout=timeout)
    doc.update({"workload": w, "config": cfg.to_json(), "label": cfg.label(),
                "result": r.result, "wall_s": r.wall_s, "allocator_verified": r.allocator_verified,
                "verification": r.verification,
                "os_switches": {k: v.to_json() for k, v in run_state.items()},
                "os_changed": [c.to_json() for c in changes], "os_restored": bool(changes)})
    model.finish(doc, complete=True)
    writer.write(doc)
    if as_json:
        emit_json(doc)
        return
    report.render(doc, console(wide=True))
    if writer.json_path:
        console().print(f"wrote {writer.json_path}", markup=False)


def _far_memory(w, p, cfg, t, sw, desired, apply_os, mem_variants, policy, instance_id, runs, warmup, timeout,
                dry_run, out_dir, as_json):
    """`workload W1-W4 --mem-variants`: the far-memory study in one tile (tune.far_memory)."""
    from tilewise.bench.far_memory import parse_variants
    from tilewise.tune import far_memory as fm

    study = fm.Config(w, p, parse_variants(mem_variants), cfg, (policy or "win").strip().lower(), instance_id or 0,
                      runs, warmup, timeout)
    vs = fm.variants(t, study)  # no far tier, no such instance: one line, before anything is written or run
    if dry_run:
        doc = {"workload": w, "policy": study.policy, "instance": study.instance,
               "variants": [{"name": v.name, "binding": v.binding.to_json(), "mem_reason": v.instance.mem_reason}
                            for v in vs]}
        if as_json:
            emit_json(doc)
        else:
            out = console()
            for v in vs:
                out.print(f"{v.name}: {v.binding.describe()} ({v.instance.mem_reason})", markup=False)
        return
    from tilewise.results import report
    from tilewise.results.output import Writer

    writer = Writer(out_dir) if out_dir else Writer(None)  # a bad --out fails before the run
    err = console(stderr=True)

    class Rep(fm.Reporter):
        def message(self, text: str) -> None:
            if not as_json:
                err.print(f"tilewise: {text}", markup=False)

    ctx = sw.applied(desired) if apply_os else _null()
    with ctx:
        doc = fm.run(study, t, Rep(), writer=writer.write)  # rewritten after every variant
    if as_json:
        emit_json(doc)
        return
    report.render(doc, console(wide=True))
    if writer.json_path:
        console().print(f"wrote {writer.json_path}", markup=False)


class _null:
    def __enter__(self):
        return []

    def __exit__(self, *exc):
        return False
