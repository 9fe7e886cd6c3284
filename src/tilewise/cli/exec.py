"""`tilewise exec`: run a command as one planned instance, bound and verified."""

from __future__ import annotations

import sys

import click

from tilewise import allocators, changes, launch, plan, signals, topology
from tilewise.binding import Binding, admit_weights, check_binding, ensure_runnable, set_interleave_weights
from tilewise.cli.common import INDEX, conflicts, console, emit_json, json_option, topology_option
from tilewise.cli.plan import make_plan, plan_options, weights_option
from tilewise.errors import UsageError


@click.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@topology_option
@plan_options
@weights_option
@click.option("--instance", "-i", "instance_id", type=INDEX, default=0, show_default=True, help="Which instance of the plan.")
@click.option("--plan", "plan_path", metavar="FILE", help="Use a plan saved by `tilewise plan --save`.")
@click.option("--allocator", default=None,
              help=f"Preload an allocator: {', '.join(allocators.names())} (default system).")
@click.option("--config", "config_path", metavar="FILE",
              help="A configuration written by `tilewise tune`: supplies allocator and memory policy (flags win).")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def exec_cmd(topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, weights,
             instance_id, plan_path, allocator, config_path, as_json, command):
    """Run COMMAND bound to one instance's CPUs, memory policy and allocator; verify from /proc.

    COMMAND runs in a process group of its own; SIGINT, SIGTERM and SIGHUP sent to tilewise are
    forwarded to that group (after SIGTERM/SIGHUP the rest is killed after a grace period), and
    whatever the command leaves running when it exits is stopped. Exits with COMMAND's status
    (128+n if it died of signal n; 127 not found, 126 not executable; 1 if its binding does
    not match the plan).
    """
    if config_path:
        from tilewise.tune.knobs import load_config

        cfg = load_config(config_path).config
        allocator = allocator or cfg.allocator
        if mem is None and not plan_path:
            mem = cfg.mem
            mem_nodes = mem_nodes or (",".join(map(str, cfg.mem_nodes)) or None)
    allocator = allocator or "system"
    allocators.get(allocator)
    if plan_path:
        conflicts("--plan", ("topology_src", "policy", "instances", "mem", "mem_nodes", "smt", "engine_threads",
                             "working_set", "skewed", "weights"),
                  "a saved plan already fixes the topology, policy, instances and memory policy; "
                  "drop these options or re-plan with `tilewise plan --save`")
        from tilewise import userfiles

        p = plan.Plan.from_json(userfiles.read_json(plan_path, "plan", "save one with `tilewise plan --save FILE`"),
                                source=plan_path)
    else:
        t = topology.load(topology_src)
        p = make_plan(t, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, weights)
    if not 0 <= instance_id < len(p.instances):
        raise UsageError(f"instance {instance_id} does not exist: the {p.policy} plan has {len(p.instances)}",
                         f"use --instance 0..{len(p.instances) - 1}")
    ensure_runnable(p)
    b = Binding.from_instance(p.instances[instance_id], allocator)
    check_binding(b)  # a bad binding is one line, before anything starts
    admit_weights(b.weights)  # global weights: refused before anything is journaled when not ours to write
    err = console(stderr=True)
    inst = p.instances[instance_id]
    if inst.mem_reason and not as_json:
        err.print(f"tilewise: memory: {inst.mem_reason}", markup=False)
    # weighted-interleave weights are global (sysfs): set through the change-and-undo layer, restored
    # when the command ends (Ctrl-C and SIGTERM included; `tilewise restore` after a kill -9)
    with changes.Session(f"exec weights {' '.join(command)[:60]}") as weights_session:
        said = set_interleave_weights(weights_session, b.weights) if b.weights else []
        for line in said if not as_json else ():
            err.print(f"tilewise: {line}", markup=False)
        run = launch.run_forwarding(list(command), b, stdout=sys.stderr if as_json else None,
                                    on_started=None if as_json else (lambda v: err.print(
                                        f"tilewise: pid {v.pid} bound ({b.describe()}): {v.summary()}", markup=False)))
    if run.leftovers.stopped and not as_json:
        err.print(f"tilewise: the command left processes behind; {run.leftovers.summary()}", markup=False)
    if as_json:
        emit_json({"policy": p.policy, "instance": p.instances[instance_id].to_json(), "binding": b.to_json(),
                   "weights_set": said,
                   "verification": run.verification.to_json(), "returncode": run.returncode, "exit_status": run.status,
                   "signals_forwarded": [signals.name(x) for x in run.forwarded], "leftovers": run.leftovers.to_json()})
    if not run.leftovers.ok:
        raise launch.LaunchError(f"the command's processes could not all be stopped: {run.leftovers.summary()}",
                                 "kill them by pid")
    sys.exit(run.status)
