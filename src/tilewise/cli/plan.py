"""`tilewise plan`: turn a policy into bound instances, with reasons."""

from __future__ import annotations

import click

from tilewise import cpulist, plan, topology
from tilewise.cli.common import AT_LEAST_1, OUTPUT_FILE, conflicts, console, emit_json, json_option, parse_size, topology_option
from tilewise.errors import UsageError


def plan_options(f):
    """--policy/--instances/--mem/--mem-nodes/--smt and auto hints; shared by plan, exec, bench."""
    opts = [
        click.option("--policy", "-p", default="auto", show_default=True, metavar="POLICY",
                     help="wim, win, wicp, wicp-mixed, wic, spread, n (with --instances), auto."),
        click.option("--instances", "-k", type=AT_LEAST_1, default=None, help="Number of instances (policy n)."),
        click.option("--mem", "mem", default=None, metavar="POLICY",
                     help="Memory policy: first-touch, interleave, membind, preferred, local, weighted-interleave "
                          "(Linux 6.9+), near (membind to the instance's nodes), near-then-far (its nodes, then its "
                          "far tier: Linux 5.15+); default: the policy's."),
        click.option("--mem-nodes", default=None, metavar="LIST", help="Override the memory nodes: a list (0-1,4) or numactl's forms (all, !1, +0-1)."),
        click.option("--smt", is_flag=True, help="Use SMT siblings too (default: physical cores only)."),
        click.option("--engine-threads", type=click.Choice(["parallel", "single"]), default="parallel",
                     show_default=True, help="auto: is the engine multi-threaded per instance?"),
        click.option("--working-set", default=None, metavar="SIZE", help="auto: bytes the workload touches, e.g. 200MB."),
        click.option("--skewed", is_flag=True, help="auto: the data is skewed (prefer fewer, larger instances)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


weights_option = click.option(
    "--weights", "weights", default=None, metavar="auto|N:M",
    help="With --mem weighted-interleave: interleave over each instance's nodes and its far tier, weighted N:M "
         "(one weight 1..255 per node) or auto (the measured read-bandwidth ratio, else the firmware's). The "
         "weights are global: they apply to the whole machine while the command runs.")


def make_plan(t, policy, instances, mem, mem_nodes, smt, engine_threads="parallel", working_set=None, skewed=False,
              weights=None, uses_gpu=False):
    if instances is not None and policy == "auto":
        policy = "n"
    if policy != "auto":
        conflicts(f"--policy {policy}", ("engine_threads", "working_set", "skewed"),
                  "--engine-threads, --working-set and --skewed are hints for --policy auto")
    nodes = cpulist.parse_set(mem_nodes, topology.allowed_nodes(t), what="--mem-nodes") if mem_nodes is not None else None
    ws = parse_size(working_set, "--working-set") if working_set is not None else None
    hints = plan.AutoHints(engine_threads, ws, skewed, uses_gpu)
    if (policy == "gpu" or uses_gpu) and topology.is_live(t):
        from tilewise import devices

        t = devices.with_nvml(t)  # this machine's GPUs get NVML's UUIDs (CUDA_VISIBLE_DEVICES) where a driver is loaded
    # tier-aware placement reads its figures (measured, HMAT, kernel tiers) from the topology's memattrs
    return plan.plan(t, policy, instances=instances, mem=mem, smt=smt, mem_nodes=nodes, hints=hints, weights=weights)


@click.command("plan")
@topology_option
@plan_options
@weights_option
@json_option
@click.option("--save", "save_path", type=OUTPUT_FILE, help="Also write the plan as JSON (for exec --plan).")
def plan_cmd(topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, weights, as_json,
             save_path):
    """Plan a deployment: which instances, which CPUs, which memory nodes, and why."""
    t = topology.load(topology_src)
    p = make_plan(t, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, weights)
    doc = p.to_json()
    if save_path:
        from tilewise.fsutil import atomic_write_json

        try:
            atomic_write_json(save_path, doc)
        except OSError as e:
            raise UsageError(f"cannot write {save_path}: {e.strerror}") from None
    if as_json:
        emit_json(doc)
        return
    print_plan(p, t)


def print_plan(p, t) -> None:
    from rich.table import Table

    out = console()
    title = f"policy {p.policy}" + (" (auto)" if p.requested == "auto" else "")
    out.print(f"[bold]{title}[/bold]: {len(p.instances)} instance(s) on {t.summary()}")
    for r in p.reasons:
        out.print(f"  because {r}", markup=False)
    table = Table(show_edge=False, pad_edge=False)
    gpu = any(i.gpu for i in p.instances)
    for col in ("instance", "cores", "cpus (P#)", "NUMA (P#)", "L3 (L#)", "memory (P#)") + (("GPU",) if gpu else ()):
        table.add_column(col, overflow="fold")
    shown = p.instances if len(p.instances) <= 64 else p.instances[:64]
    for i in shown:
        mem = i.mem_policy + (f" {cpulist.format(i.mem_nodes)}" if i.mem_policy not in ("first-touch", "local") else "")
        if i.weights:
            mem += " weights " + ":".join(str(i.weights[n]) for n in sorted(i.weights))
        table.add_row(str(i.id), str(i.cores), cpulist.format(i.cpus), cpulist.format(i.numa_nodes),
                      cpulist.format(i.l3_domains), mem, *((f"{i.gpu} {(i.gpu_uuid or '')[:12]}".strip(),) if gpu else ()))
    out.print(table)
    if len(p.instances) > len(shown):
        out.print(f"... {len(p.instances) - len(shown)} more instances (use --json for all)")
    for i in shown:
        if i.mem_reason:
            out.print(f"instance {i.id} memory: {i.mem_reason}", markup=False)
    for n in p.notes:
        out.print(f"note: {n}", markup=False)
    out.print("P#: OS indexes (CPU and node numbers as the kernel numbers them); L#: logical (hwloc's order)", markup=False)
