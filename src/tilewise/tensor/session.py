"""One `tilewise workload T1|T2|T3` run (the thesis's tensor operators), as a use case:
``run(config, reporter) -> results document``; ``describe`` is its dry run.

The run's configuration (allocator, memory policy, placement, OS switches) is settled as for the
native workloads (tune.workload_session.settle). With a plan (--policy) the run happens inside one
of its tiles: the tile's CPUs, its memory unless a memory policy is given, and in a GPU tile its
GPU; `cuda` names a GPU (devices.resolve_cuda). The results document (kind ``workload.tensor``) is
given to reporter.done before a wrong answer is raised as an error (the figures are kept).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tilewise import devices, parts
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results.output import Writer
from tilewise.tensor import DESCRIPTIONS
from tilewise.tensor import run as tr
from tilewise.tune import knobs
from tilewise.tune.workload_session import Knobs, Setting, settle


@dataclass
class Config:
    params: tr.Params
    knobs: Knobs
    # the plan of --policy for a topology (True: the run uses a GPU, so `auto` plans GPU tiles); None: no tile
    plan: Callable[[object, bool], object] | None = None
    policy: str | None = None  # --policy as given (recorded in the results)
    instance: int | None = None  # which tile of the plan (default 0)
    timeout: float = 600
    out: str | None = None
    topology_src: str | None = None


class Reporter:
    def message(self, text: str) -> None: ...  # progress lines (stderr; not with --json)
    def done(self, doc: dict) -> None: ...  # the results document, also when an answer was wrong


def tile(t, cfg: Config, uses_gpu: bool = False):
    """(plan, instance) to run in, or None."""
    if cfg.plan is None:
        if cfg.instance is not None:
            raise UsageError("--instance needs --policy", "e.g. --policy win --instance 1")
        return None
    p = cfg.plan(t, uses_gpu)
    i = cfg.instance or 0
    if not 0 <= i < len(p.instances):
        raise UsageError(f"instance {i} does not exist: the {p.policy} plan has {len(p.instances)}",
                         f"use --instance 0..{len(p.instances) - 1}")
    return p, p.instances[i]


def resolve_gpu(device: str, inst=None):
    """None for cpu; the GPU (devices.PciDevice) for cuda[:N|:UUID], or one Error line. In a GPU
    tile (inst.gpu) `cuda` is the tile's GPU, and another one is refused."""
    if device == "cpu":
        return None
    found = devices.discover()
    if inst is None or not inst.gpu:
        return devices.resolve_cuda(device, found)
    mine = devices.resolve_cuda(f"cuda:{inst.gpu_uuid}" if inst.gpu_uuid else device, found)
    if mine.address != inst.gpu:
        raise UsageError(f"tile {inst.id} is GPU {inst.gpu}, which CUDA does not list here ({mine.address} is)",
                         "plan on this machine (leave --topology out)")
    if device != "cuda" and devices.resolve_cuda(device, found).address != mine.address:
        raise UsageError(f"--device {device} is not tile {inst.id}'s GPU ({mine.label()})",
                         "use --device cuda inside a GPU tile (the tile chooses the GPU)")
    return mine


@dataclass
class _Prepared:
    setting: Setting
    config: knobs.Config  # the setting's, with the tile's memory where no policy was given
    picked: tuple | None  # (plan, instance)
    cpus: tuple[int, ...] | None
    gpu: object


def _prepare(cfg: Config, rep: Reporter, dry_run: bool) -> _Prepared:
    s = settle(cfg.knobs, cfg.topology_src, dry_run, rep)
    p, kc = cfg.params, s.config
    picked = tile(s.topo, cfg, uses_gpu=p.device != "cpu")
    cpus = None
    if picked is not None:
        inst = picked[1]
        cpus = tuple(inst.cpus)
        if kc.mem == "first-touch" and not kc.mem_nodes:  # the tile's memory unless --mem says otherwise
            kc = knobs.Config(kc.allocator, inst.mem_policy, tuple(inst.mem_nodes), kc.placement, kc.thp, kc.autonuma)
    gpu = resolve_gpu(p.device, picked[1] if picked else None)
    return _Prepared(s, kc, picked, cpus, gpu)


def describe(cfg: Config, reporter: Reporter | None = None) -> tuple[dict, object]:
    """The dry run: (what would run: params, configuration, per-thread CPUs, tile, GPU, worker
    command; the plan of the tile or None). Nothing runs."""
    r = _prepare(cfg, reporter or Reporter(), dry_run=True)
    p, t, kc, picked, gpu = cfg.params, r.setting.topo, r.config, r.picked, r.gpu
    d = p.resolved()
    allowed = set(r.cpus) if r.cpus else (None if cfg.topology_src else set(os.sched_getaffinity(0)))
    pin = knobs.thread_order(t, kc.placement, d["threads"] or len(allowed or t.pus), allowed)
    doc = {"workload": p.workload, "params": d, "config": kc.to_json(), "pin": pin,
           "tile": picked[1].to_json() if picked else None, "gpu": gpu.to_json() if gpu else None,
           "worker": tr.worker("SPEC.json", pin, gpu.uuid if gpu else None)[0], "estimated_bytes": tr.estimate_bytes(d)}
    return doc, picked[0] if picked else None


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """The run; returns its results document (also given to reporter.done). A wrong answer is an
    error raised after the document is written and given to the reporter."""
    parts.require(parts.EXTRAS["tensor"], f"workload {cfg.params.workload}")
    rep = reporter or Reporter()
    r = _prepare(cfg, rep, dry_run=False)
    p, t, kc, picked = cfg.params, r.setting.topo, r.config, r.picked
    writer = Writer(cfg.out)
    doc = model.new("workload.tensor", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"workload": p.workload, **p.to_json(), "config": kc.to_json(), "timeout_s": cfg.timeout,
                            "policy": cfg.policy, "instance": cfg.instance})
    tr.preflight(p)
    rep.message(f"{p.workload}: {DESCRIPTIONS[p.workload]} on {p.device}"
                + ("; the first compiled run compiles (tens of seconds the first time, cached after)"
                   if "compiled" in p.resolved()["variants"] else ""))
    with r.setting.applied(cfg.knobs.apply_os) as changes:
        run_state = r.setting.switches.state()
        body = tr.run(p, kc, t, timeout=cfg.timeout, cpus=r.cpus, gpu=r.gpu, on_message=rep.message)
    body.pop("params", None)
    doc.update(body)
    doc.update({"config": kc.to_json(), "label": kc.label(), "tile": picked[1].to_json() if picked else None,
                "os_switches": {k: v.to_json() for k, v in run_state.items()},
                "os_changed": [c.to_json() for c in changes], "os_restored": bool(changes)})
    doc["params"]["resolved"] = p.resolved()
    wrong = tr.wrong_answers(doc)
    model.finish(doc, complete=not wrong)
    writer.write(doc)
    rep.done(doc)
    if wrong:
        raise TilewiseError(f"{p.workload}: wrong answer(s): {'; '.join(wrong)}",
                            "the figures are kept in the results; report this as a bug")
    return doc
