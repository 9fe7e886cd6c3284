"""The far-memory study for the in-memory workloads W1-W4 (thesis 004, ch. 4, for CXL):
`tilewise workload W2 --mem-variants near,far,interleave,weighted`.

The workload runs in one tile of a plan (default `win`, instance 0: a NUMA node's cores) once per
memory-placement variant, the variants `bench tpch --mem-variants` runs (bench.far_memory): its data
in near memory (membind to the tile's node), in its far tier only, interleaved over both, or weighted
by the read bandwidth ratio (the global weights set through the change-and-undo layer for that
variant's runs and restored after them). Each variant gets `warmup` untimed and `runs` timed runs,
each binding read back from /proc; every variant must compute the same answer (result rows and
checksum) as near memory. The result is each variant's slowdown against near memory with a 95 %
interval and the thesis's verdict (usable, costs, hurts).

On a machine without a far tier the study says so and runs nothing (bench.far_memory.NoFarTier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tilewise import changes, cpulist
from tilewise.bench import far_memory
from tilewise.binding import Binding, admit_weights, check_binding, ensure_mem_policy_supported, set_interleave_weights
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance
from tilewise.probes.memory import emulation
from tilewise.results import model
from tilewise.topology.model import Topology
from tilewise.tune import knobs
from tilewise.tune import workloads as wl

WORKLOADS = ("W1", "W2", "W3", "W4")
KIND = "workload.far_memory"


@dataclass(frozen=True)
class Config:
    workload: str  # W1..W4
    params: wl.Params
    variants: tuple[str, ...]  # bench.far_memory.parse_variants: near first
    base: knobs.Config = field(default_factory=knobs.Config)  # allocator and placement (the variants set the memory policy)
    policy: str = "win"
    instance: int = 0
    runs: int = 3
    warmup: int = 1
    timeout: float = 600.0


@dataclass(frozen=True)
class Variant:
    name: str  # near | far | interleave | weighted
    instance: Instance
    binding: Binding


def variants(t: Topology, cfg: Config) -> list[Variant]:
    """The tile's binding in each variant (pure); NoFarTier when the machine has no far tier, one
    UsageError line for an instance that does not exist, or a binding that cannot be applied."""
    if cfg.workload not in WORKLOADS:
        raise UsageError(f"--mem-variants applies to the workloads {', '.join(WORKLOADS)}, not {cfg.workload}",
                         "the far-memory study of TPC-H is `tilewise bench tpch --mem-variants`")
    plans = far_memory.variant_plans(t, f"{cfg.workload} in {cfg.policy}", cfg.policy, None, False, cfg.variants)
    out = []
    for label, p in plans:
        if not 0 <= cfg.instance < len(p.instances):
            raise UsageError(f"instance {cfg.instance} does not exist: the {p.policy} plan has {len(p.instances)}",
                             f"use --instance 0..{len(p.instances) - 1}")
        ensure_mem_policy_supported(p)  # weighted interleave on a kernel before 6.9: one line, nothing run
        inst = p.instances[cfg.instance]
        out.append(Variant(label.rsplit(":", 1)[1], inst, Binding.from_instance(inst, cfg.base.allocator)))
    return out


def summary(workload: str, deployment: str, times: dict[str, list[float]]) -> dict:
    """bench.far_memory's summary of one deployment, the workload as its one "query"."""
    return far_memory.summarize_runs({f"{deployment}:{v}": {"queries": {workload: {"times_s": ts}}}
                                      for v, ts in times.items()})


def same_answer(runs: dict[str, list[dict]]) -> list[str]:
    """Variants whose result (rows, checksum) differs from near memory's first run: empty when all agree."""
    ref = next(iter(runs.get("near") or []), None)
    if ref is None:
        return []
    key = ("result_rows", "checksum")
    return [f"{v} run {k + 1}: {', '.join(f'{x} {r.get(x)}' for x in key)} (near: "
            f"{', '.join(f'{x} {ref.get(x)}' for x in key)})"
            for v, rs in runs.items() for k, r in enumerate(rs) if any(r.get(x) != ref.get(x) for x in key)]


def _emulated() -> str | None:
    """Why the times are not the hardware's (a QEMU TCG guest), as probe memory says it."""
    try:
        with open("/proc/cpuinfo") as f:
            return emulation(f.read(), None)
    except OSError:
        return None


class Reporter:
    def message(self, text: str) -> None: ...


def run(cfg: Config, t: Topology, reporter: Reporter | None = None, *,
        runner: Callable[..., wl.RunResult] = wl.run_workload, writer: Callable[[dict], None] | None = None) -> dict:
    """Run the study; returns the workload.far_memory results document (rewritten through `writer`
    after every variant). Nothing runs when the plan has no far tier or a binding cannot be applied."""
    rep = reporter or Reporter()
    write = writer or (lambda d: None)
    vs = variants(t, cfg)
    for v in vs:
        check_binding(v.binding)  # before anything runs
    # the global weighted-interleave weights: refused now when not ours to write, not after near memory ran
    admit_weights(sorted({w for v in vs for w in v.binding.weights}))
    dep = f"{cfg.workload} {cfg.policy}#{cfg.instance}"
    doc = model.new(KIND, topo=t, params={"workload": cfg.workload, **cfg.params.to_json(),
                                          "variants": [v.name for v in vs], "policy": cfg.policy,
                                          "instance": cfg.instance, "runs": cfg.runs, "warmup": cfg.warmup,
                                          "config": cfg.base.to_json(), "timeout_s": cfg.timeout})
    doc.update({"workload": cfg.workload, "deployment": dep, "description": wl.DESCRIPTIONS[cfg.workload],
                "cpus": list(vs[0].instance.cpus), "variants": {}, "far_memory": None, "wrong_answers": [],
                "emulated": _emulated()})
    if doc["emulated"]:
        doc.setdefault("warnings", []).append(f"{doc['emulated']}: the slowdowns say nothing about the memory tiers; "
                                             "only the placement (the bindings read back) is checked")
    rep.message(f"{cfg.workload} in tile {cfg.policy} #{cfg.instance} (CPUs {cpulist.format(vs[0].instance.cpus)}): "
                f"{len(vs)} memory variant(s), {cfg.warmup} warm-up + {cfg.runs} timed run(s) each")
    try:
        for v in vs:
            rec = {"title": far_memory.TITLES.get(v.name, v.name), "mem_policy": v.instance.mem_policy,
                   "mem_nodes": list(v.instance.mem_nodes), "weights": {str(n): w for n, w in v.binding.weights},
                   "mem_reason": v.instance.mem_reason, "binding": v.binding.to_json(), "weights_set": [],
                   "times_s": [], "warmup_s": [], "runs": [], "verification": []}
            rep.message(f"{v.name}: {v.binding.describe()}")
            # weighted interleave: the weights are global, set for this variant's runs and restored after them
            with changes.Session(f"workload {cfg.workload} {v.name} weights") as session:
                rec["weights_set"] = set_interleave_weights(session, v.binding.weights) if v.binding.weights else []
                for line in rec["weights_set"]:
                    rep.message(f"{v.name}: {line}")
                for k in range(cfg.warmup + cfg.runs):
                    r = runner(cfg.workload, cfg.params, cfg.base, t, timeout=cfg.timeout, binding=v.binding)
                    timed = k >= cfg.warmup
                    (rec["times_s"] if timed else rec["warmup_s"]).append(r.result.get("time_s"))
                    if timed:
                        rec["runs"].append(r.result)
                        rec["verification"].append(r.verification)
            doc["variants"][v.name] = rec
            doc["far_memory"] = summary(cfg.workload, dep, {n: x["times_s"] for n, x in doc["variants"].items()})
            write(doc)
    except BaseException as e:
        model.stopped(doc, e)
        write(doc)
        raise
    doc["wrong_answers"] = same_answer({n: x["runs"] for n, x in doc["variants"].items()})
    model.with_metrics(doc)  # the kind derives them from the body
    model.finish(doc, complete=not doc["wrong_answers"])
    write(doc)
    if doc["wrong_answers"]:
        raise TilewiseError(f"{cfg.workload}: a memory variant computed another answer than near memory: "
                            f"{doc['wrong_answers'][0]}", "the figures are kept in the results; report this as a bug")
    return doc
