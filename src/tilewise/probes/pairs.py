"""Pure functions over (Topology, cpus, matrix): pair classes, pair sampling, grouped summaries.

Classes of a pair of CPUs (a, b), from nearest to farthest:
  smt      same physical core (SMT siblings)
  l3       same L3 domain (chiplet) and same NUMA node, other core
  node     same NUMA node, other L3 domain (across chiplets)
  package  same package, other NUMA node (SNC / NPS modes; with SNC both may share one L3)
  remote   other package (across sockets)
"""

from __future__ import annotations

import random
from collections import defaultdict

from tilewise.errors import UsageError
from tilewise.results import stats as S
from tilewise.topology.model import Topology

CLASSES = ("smt", "l3", "node", "package", "remote")  # their titles: results.kinds.pairs.CLASS_TITLES
# above this many ordered pairs, sample by class unless --full
FULL_PAIRS_LIMIT = 240
PER_CLASS = 4  # sampled pairs per class
BLOCK_LIMIT = 1024  # at most this many extra pairs, one per (L3, L3) block, so a heatmap shows the blocks


def pair_class(t: Topology, a: int, b: int) -> str:
    ca, cb = t.core_of_cpu.get(a), t.core_of_cpu.get(b)
    if ca is None or cb is None:
        missing = a if ca is None else b
        raise UsageError(f"CPU {missing} is not in the topology ({t.source})", "check --cpus against `tilewise topo`")
    if ca.id == cb.id:
        return "smt"
    if ca.numa_node == cb.numa_node:
        if ca.l3 == cb.l3:
            return "l3"
        return "node"
    if ca.package == cb.package:
        return "package"
    return "remote"


def all_pairs(cpus) -> list[tuple[int, int]]:
    return [(a, b) for a in cpus for b in cpus if a != b]


def select_pairs(t: Topology, cpus, *, full: bool = False, per_class: int = PER_CLASS, seed: int = 0,
                 limit: int = FULL_PAIRS_LIMIT) -> tuple[list[tuple[int, int]], str]:
    """Ordered pairs to measure and a one-line description of the choice.

    All ordered pairs when `full` or when there are at most `limit` of them; otherwise a sample:
    `per_class` pairs of every class present, plus one pair per ordered (L3 domain, L3 domain) block
    (capped), so the heatmap still shows the chiplet structure. Deterministic for a given seed.
    """
    cpus = list(cpus)
    if len(cpus) < 2:
        raise UsageError(f"a core-to-core probe needs at least two CPUs, got {len(cpus)}",
                         "pass --cpus with two or more CPUs this process may use")
    pairs = all_pairs(cpus)
    if full or len(pairs) <= limit:
        return pairs, f"all {len(pairs)} ordered pairs of {len(cpus)} CPUs"
    rng = random.Random(seed)
    by_class: dict[str, list] = defaultdict(list)
    by_block: dict[tuple[int, int], list] = defaultdict(list)
    for a, b in pairs:
        by_class[pair_class(t, a, b)].append((a, b))
        by_block[(t.core_of_cpu[a].l3, t.core_of_cpu[b].l3)].append((a, b))
    chosen: set = set()
    for cls in CLASSES:
        group = by_class.get(cls, [])
        chosen.update(rng.sample(group, min(per_class, len(group))))
    blocks = sorted(by_block)
    if len(blocks) > BLOCK_LIMIT:
        blocks = sorted(rng.sample(blocks, BLOCK_LIMIT))
    for key in blocks:
        chosen.add(rng.choice(by_block[key]))
    counts = {c: sum(1 for p in chosen if pair_class(t, *p) == c) for c in CLASSES}
    desc = (f"{len(chosen)} sampled of {len(pairs)} ordered pairs ("
            + ", ".join(f"{n} {c}" for c, n in counts.items() if n) + "); --full measures all")
    return sorted(chosen), desc


def group_matrix(t: Topology, cpus, matrix, *, values: bool = False) -> dict[str, dict]:
    """Summarise a CPU x CPU matrix by topology class.

    `matrix[i][j]` is the value for (cpus[i], cpus[j]); None (or a non-positive value, the
    "not measured" marker of stored topologies) is skipped; the diagonal is ignored. Returns, for
    each class that has at least one measured pair, {"mean", "median", "min", "max", "pairs"}
    (and "values", the pairs' values, with values=True).
    """
    cpus = list(cpus)
    if len(matrix) != len(cpus) or any(len(r) != len(cpus) for r in matrix):
        raise UsageError(f"matrix is not {len(cpus)}x{len(cpus)} (one row and column per CPU)")
    vals: dict[str, list[float]] = defaultdict(list)
    for i, a in enumerate(cpus):
        for j, b in enumerate(cpus):
            if i == j:
                continue
            v = matrix[i][j]
            if v is None or v != v or v <= 0:
                continue
            vals[pair_class(t, a, b)].append(float(v))
    out = {}
    for cls in CLASSES:
        v = vals.get(cls)
        if v:
            st = S.summarize(v)
            out[cls] = {"mean": st["mean"], "median": st["median"], "min": st["min"], "max": st["max"], "pairs": st["n"]}
            if values:
                out[cls]["values"] = v
    return out


def to_measurement(cpus, matrix) -> dict:
    """The Topology.measurements form: diagonal 0, unmeasured pairs 0 (never NaN or None)."""
    cpus = list(cpus)
    values = [[0.0 if (i == j or v is None or v != v) else float(v) for j, v in enumerate(row)]
              for i, row in enumerate(matrix)]
    return {"cpus": cpus, "values": values}
