"""The far-memory study (thesis 004, ch. 4, for CXL): the same deployment with its data in near
memory, in its far tier, interleaved over both, or weighted by bandwidth; per-query slowdown of
each variant against near memory with a 95 % confidence interval, and a verdict in the thesis's
terms: where the far tier is usable (a drop-in for near memory) and where it hurts.

Pure functions: the variants' plans from a near-memory plan, and the study's summary from a
results document; the harness (bench/harness.py) runs them as deployments of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tilewise import cpulist, plan as planner
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import stats
from tilewise.topology.model import Topology

VARIANTS = ("near", "far", "interleave", "weighted")
TITLES = {"near": "near memory (membind to the instance's nodes)",
          "far": "far tier only (membind to the instance's far nodes)",
          "interleave": "interleaved over near and far, equal weights",
          "weighted": "weighted interleave over near and far (weights from the read bandwidth ratio)"}
USABLE = 1.10  # a slowdown whose whole 95 % interval is below this: the far tier is usable there
HURTS = 1.25  # ... whose whole interval is above this: it hurts


class NoFarTier(TilewiseError):
    """The machine has no far memory tier: the study has nothing to compare (nothing is run)."""


def parse_variants(text: str | Sequence[str]) -> tuple[str, ...]:
    items = [x.strip().lower() for x in (text.split(",") if isinstance(text, str) else text) if x.strip()]
    bad = [x for x in items if x not in VARIANTS]
    if bad or not items:
        raise UsageError(f"--mem-variants: unknown variant {', '.join(bad) or '(none)'}", f"choose from {','.join(VARIANTS)}")
    out = tuple(dict.fromkeys(items))
    if "near" not in out:
        out = ("near", *out)  # every slowdown is against near memory
    return out


def variant_plans(t: Topology, label: str, policy: str, instances: int | None, smt: bool,
                  variants: Sequence[str]) -> list[tuple[str, planner.Plan]]:
    """(label:variant, plan) for each variant of one deployment. Raises NoFarTier when no instance
    has a far tier (the machine has no CPU-less memory slower than local memory)."""
    near = planner.plan(t, policy, instances=instances, mem="near", smt=smt)
    missing = [i.id for i in near.instances if not i.far_nodes]
    if len(missing) == len(near.instances):
        raise NoFarTier(f"no far memory tier for {label}: no instance has a CPU-less memory node slower than its local "
                        "memory near it; the far-memory study compares near and far memory, so nothing was run",
                        "run it on a machine with CPU-less memory nodes (CXL, PMem as memory; `tilewise topo` shows tiers)")
    if missing:
        raise UsageError(f"{label}: instance(s) {', '.join(map(str, missing))} have no far tier (only "
                         f"{len(near.instances) - len(missing)} of {len(near.instances)} have)",
                         "use a policy whose every instance is near a far node, e.g. win")
    out = []
    for v in variants:
        if v == "near":
            p = near
        elif v == "far":
            p = _replace(near, lambda i: dataclasses.replace(
                i, mem_policy="membind", mem_nodes=i.far_nodes,
                mem_reason=f"far: membind to far node(s) {cpulist.format(i.far_nodes)} only"))
        elif v == "interleave":
            p = _replace(near, lambda i: dataclasses.replace(
                i, mem_policy="interleave", mem_nodes=tuple(sorted(i.mem_nodes + i.far_nodes)),
                mem_reason=f"interleave: equal weights over node(s) {cpulist.format(i.mem_nodes + i.far_nodes)}"))
        else:
            p = planner.plan(t, policy, instances=instances, mem="weighted-interleave", weights="auto", smt=smt)
        out.append((f"{label}:{v}", p))
    return out


def _replace(p: planner.Plan, fn) -> planner.Plan:
    return dataclasses.replace(p, instances=tuple(fn(i) for i in p.instances))


def verdict(ci: tuple[float, float] | None, ratio: float | None) -> str:
    """The thesis's question per query: can the far tier stand in for near memory here?"""
    if ratio is None:
        return "not measured"
    if ci is None:
        return "one run: no interval (use --runs 3 or more)"
    lo, hi = ci
    if hi < USABLE:
        return "usable (within 10 % of near memory)"
    if lo > HURTS:
        return f"hurts ({ratio:.2f}x near memory)"
    return f"costs {100 * (ratio - 1):.0f} % (interval {lo:.2f}-{hi:.2f}x)"


def summarize(doc: dict) -> dict:
    """Per deployment and variant: per-query slowdown against near memory (ratio of geometric means,
    95 % interval), the geometric mean over queries and the verdict."""
    return summarize_runs(doc.get("policies", {}))


def summarize_runs(pols: dict) -> dict:
    """summarize() over {"<deployment>:<variant>": {"queries": {query: {"times_s": [...]}}}}: the bench
    document's policies, or a workload's variants (tune.far_memory, one "query": the workload)."""
    out: dict = {"usable_below": USABLE, "hurts_above": HURTS, "deployments": {}}
    for name, rec in pols.items():
        if ":" not in name:
            continue
        dep, variant = name.rsplit(":", 1)
        base = pols.get(f"{dep}:near")
        if base is None or variant == "near":
            continue
        queries, ratios = {}, []
        for q, r in rec.get("queries", {}).items():
            b = (base.get("queries", {}).get(q) or {}).get("times_s") or []
            a = r.get("times_s") or []
            rc = stats.ratio_ci(b, a) if a and b else None  # gm(variant) / gm(near)
            ratio = rc["ratio"] if rc else None
            ci = tuple(rc["ci95"]) if rc and rc.get("ci95") else None
            if ratio is not None:
                ratios.append(ratio)
            queries[q] = {"slowdown": ratio, "ci95": list(ci) if ci else None, "verdict": verdict(ci, ratio)}
        usable = [q for q, v in queries.items() if v["verdict"].startswith("usable")]
        hurts = [q for q, v in queries.items() if v["verdict"].startswith("hurts")]
        g = stats.geomean(ratios)
        overall = ("not measured" if g is None else
                   f"{variant}: geometric-mean slowdown {g:.2f}x over {len(ratios)} quer{'y' if len(ratios) == 1 else 'ies'}; usable for "
                   f"{len(usable)} ({', '.join(usable) or 'none'}), hurts {len(hurts)} ({', '.join(hurts) or 'none'})")
        out["deployments"].setdefault(dep, {})[variant] = {"title": TITLES.get(variant, variant), "queries": queries,
                                                           "geomean_slowdown": g, "usable": usable, "hurts": hurts,
                                                           "verdict": overall}
    return out
