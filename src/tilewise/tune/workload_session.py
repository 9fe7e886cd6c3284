"""One `tilewise workload` run of a native workload (W1-W4, alloc), as a use case:
``run(config, reporter) -> results document``; ``describe`` is its dry run.

The configuration of a run (allocator, memory policy, thread placement, OS switches) comes from the
flags on top of a configuration file written by `tilewise tune` (flags win); ``settle`` resolves it
and checks the OS switches before anything runs, for the tensor workloads too (tensor.session). The
dry run describes the command, binding and per-thread CPUs and runs nothing; a run applies the OS
switches for its duration when asked (always restored, journaled) and returns the results document
of kind ``workload`` (written to ``out`` when given). With memory variants (``--mem-variants``) the run
is the far-memory study in one tile of a plan (tune.far_memory; ``run_far_memory``, dry run
``describe_far_memory``), a document of kind ``workload.far_memory``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from tilewise import allocators, topology
from tilewise.bench.far_memory import parse_variants
from tilewise.environment import system_check
from tilewise.errors import UsageError
from tilewise.results import model
from tilewise.results.output import Writer
from tilewise.tune import far_memory, knobs
from tilewise.tune import workloads as wl
from tilewise.tune.os_switches import OsSwitches


@dataclass
class Knobs:
    """How to run: the flags as given (None: the configuration file's, else the default)."""

    allocator: str | None = None
    mem: str | None = None
    placement: str | None = None
    config_path: str | None = None  # a configuration written by `tilewise tune`
    apply_os: bool = False
    thp: str | None = None
    autonuma: str | None = None
    os_root: str = "/"


@dataclass
class Config:
    workload: str  # W1..W4, alloc (tune.workloads.canonical)
    params: wl.Params
    knobs: Knobs
    timeout: float = 600
    out: str | None = None  # also write results.json here
    topology_src: str | None = None  # a dry run only: plan the threads on another machine


class Reporter:
    def message(self, text: str) -> None: ...  # notes on stderr (not with --json)


@dataclass
class Setting:
    """A run's resolved configuration, with the OS switches it will set and their state now."""

    topo: object
    config: knobs.Config
    switches: OsSwitches
    desired: dict
    state: dict

    def applied(self, apply_os: bool):
        """The OS switches applied for the block (yielding the changes), or nothing changed ([])."""
        return self.switches.applied(self.desired) if apply_os else contextlib.nullcontext([])


def settle(k: Knobs, topology_src: str | None, dry_run: bool, rep: Reporter) -> Setting:
    """The run's configuration: the flags over the configuration file; OS switches checked."""
    if topology_src and not dry_run:
        raise UsageError("--topology is for --dry-run only: workloads run on this machine", "add --dry-run, or drop --topology")
    t = topology.load(topology_src)
    base = knobs.load_config(k.config_path).config if k.config_path else knobs.Config()
    alloc = allocators.get(k.allocator).name if k.allocator else base.allocator
    if k.mem:
        mpol, mnodes = knobs.parse_mem(k.mem, t)
    else:
        mpol, mnodes = base.mem, base.mem_nodes
    cfg = knobs.Config(alloc, mpol, mnodes, k.placement or base.placement,
                       k.thp if k.thp is not None else (base.thp if k.apply_os else None),
                       k.autonuma if k.autonuma is not None else (base.autonuma if k.apply_os else None))
    if not k.apply_os and (base.thp is not None or base.autonuma is not None):
        rep.message(f"note: {k.config_path} also sets OS switches ({base.os_label()}); "
                    "they are applied only with --apply-os (as root)")
    sw = OsSwitches(k.os_root)
    desired = cfg.os_desired()
    if desired and not k.apply_os:
        raise UsageError("--thp/--autonuma change the OS and need --apply-os (as root)")
    return Setting(t, cfg, sw, desired, sw.state())


def _pin(cfg: Config, s: Setting) -> list[int] | None:
    """The CPU of each worker thread (None: placement none)."""
    allowed = None if cfg.topology_src else set(os.sched_getaffinity(0))
    return knobs.thread_order(s.topo, s.config.placement, cfg.params.threads or len(allowed or s.topo.pus), allowed)


def describe(cfg: Config, reporter: Reporter | None = None) -> dict:
    """The dry run: the command, configuration, per-thread CPUs and OS switches; nothing runs."""
    s = settle(cfg.knobs, cfg.topology_src, True, reporter or Reporter())
    pin = _pin(cfg, s)
    argv = wl.argv(cfg.workload, cfg.params, pin)
    return {"workload": cfg.workload, "argv": argv, "config": s.config.to_json(), "pin": pin,
            "reproduce": s.config.reproduce_env(argv), "os_switches": {k: v.to_json() for k, v in s.state.items()}}


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """The run; returns its results document (kind workload), written to cfg.out when given."""
    s = settle(cfg.knobs, cfg.topology_src, False, reporter or Reporter())
    w, p, t, kc = cfg.workload, cfg.params, s.topo, s.config
    _pin(cfg, s)  # a placement that cannot be made fails before anything is written
    writer = Writer(cfg.out)  # a bad --out fails before the run (None: nothing written)
    doc = model.new("workload", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"workload": w, **p.to_json(), "config": kc.to_json(), "timeout_s": cfg.timeout})
    with s.applied(cfg.knobs.apply_os) as changes:
        run_state = s.switches.state()
        r = wl.run_workload(w, p, kc, t, timeout=cfg.timeout)
    doc.update({"workload": w, "config": kc.to_json(), "label": kc.label(),
                "result": r.result, "wall_s": r.wall_s, "allocator_verified": r.allocator_verified,
                "verification": r.verification,
                "os_switches": {k: v.to_json() for k, v in run_state.items()},
                "os_changed": [c.to_json() for c in changes], "os_restored": bool(changes)})
    model.finish(doc, complete=True)
    writer.write(doc)
    return doc


@dataclass
class FarMemory:
    """The far-memory study's own settings (`--mem-variants`)."""

    variants: str  # near,far,interleave,weighted (bench.far_memory.parse_variants)
    policy: str = "win"
    instance: int = 0
    runs: int = 3
    warmup: int = 1


def _study(cfg: Config, fm: FarMemory, dry_run: bool, rep: Reporter) -> tuple[Setting, far_memory.Config, list]:
    """The study's setting and variants: no far tier, no such instance or a binding that cannot be
    made is one line here, before anything is written or run."""
    s = settle(cfg.knobs, cfg.topology_src, dry_run, rep)
    study = far_memory.Config(cfg.workload, cfg.params, parse_variants(fm.variants), s.config, fm.policy, fm.instance,
                              fm.runs, fm.warmup, cfg.timeout)
    return s, study, far_memory.variants(s.topo, study)


def describe_far_memory(cfg: Config, fm: FarMemory, reporter: Reporter | None = None) -> dict:
    """The study's dry run: each variant's binding of the tile; nothing runs."""
    _, study, vs = _study(cfg, fm, True, reporter or Reporter())
    return {"workload": cfg.workload, "policy": study.policy, "instance": study.instance,
            "variants": [{"name": v.name, "binding": v.binding.to_json(), "describe": v.binding.describe(),
                          "mem_reason": v.instance.mem_reason} for v in vs]}


def run_far_memory(cfg: Config, fm: FarMemory, reporter: Reporter | None = None) -> dict:
    """The far-memory study (OS switches applied around it when asked); its document is rewritten
    to cfg.out after every variant."""
    rep = reporter or Reporter()
    s, study, _ = _study(cfg, fm, False, rep)
    writer = Writer(cfg.out)  # a bad --out fails before the run
    with s.applied(cfg.knobs.apply_os):
        return far_memory.run(study, s.topo, rep, writer=writer.write)
