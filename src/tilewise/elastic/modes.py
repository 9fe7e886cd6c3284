"""Which core to allocate or release next (paper 002, section IV-B), over any Topology.

- dense: fill a NUMA node (L3 by L3) before the next one; core(i, j) iterated j-major inside i.
- sparse: one core per NUMA node in turn (round-robin over nodes, i inside j).
- adaptive: a priority queue of NUMA nodes by the target's resident pages per node
  (/proc/PID/numa_maps): allocate on the node with the most pages, release on the node with the
  fewest. Inside a node, cores are taken near the cores already held (same L3 first).

Releases undo allocations: dense and sparse release the allocated core that comes last in their
order. Everything here is pure: the pool of cores, the current allocation and the page counts in,
a core out.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.errors import UsageError
from tilewise.topology.model import Core, Topology

MODES = ("dense", "sparse", "adaptive")


@dataclass(frozen=True)
class Pool:
    """The cores the target may ever get: the topology's cores inside the allowed CPUs."""

    cores: tuple[Core, ...]
    cpus_by_core: dict  # core id -> tuple of CPUs handed out with that core
    node_order: tuple[int, ...]  # NUMA node ids with at least one pool core, topology order

    @property
    def n_total(self) -> int:
        return len(self.cores)

    def core(self, cid: int) -> Core:
        for c in self.cores:
            if c.id == cid:
                return c
        raise KeyError(cid)

    def cpus(self, core_ids) -> tuple[int, ...]:
        return tuple(sorted(p for cid in core_ids for p in self.cpus_by_core[cid]))


def make_pool(t: Topology, allowed_cpus=None, smt: bool = False) -> Pool:
    """Cores with at least one CPU in allowed_cpus (and in the topology's allowed set)."""
    allowed = set(allowed_cpus) if allowed_cpus is not None else None
    cores, cpus_by_core = [], {}
    for c in t.usable_cores():
        pus = [p for p in t.core_cpus(c, True) if allowed is None or p in allowed]
        if not pus:
            continue
        cores.append(c)
        cpus_by_core[c.id] = tuple(pus if smt else pus[:1])
    if not cores:
        raise UsageError("no core of the topology is in the target's allowed CPUs",
                         "check --topology matches this machine, or the target's affinity")
    node_ids = [n.id for n in t.numa_nodes]
    used = {c.numa_node for c in cores}
    return Pool(tuple(cores), cpus_by_core, tuple(n for n in node_ids if n in used))


def dense_order(pool: Pool) -> list[int]:
    rank = {n: i for i, n in enumerate(pool.node_order)}
    return [c.id for c in sorted(pool.cores, key=lambda c: (rank[c.numa_node], c.l3, c.id))]


def sparse_order(pool: Pool) -> list[int]:
    per_node: dict[int, list[int]] = {n: [] for n in pool.node_order}
    for cid in dense_order(pool):
        per_node[pool.core(cid).numa_node].append(cid)
    out, j = [], 0
    while len(out) < pool.n_total:
        for n in pool.node_order:
            if j < len(per_node[n]):
                out.append(per_node[n][j])
        j += 1
    return out


def priority_queue(pool: Pool, pages: dict | None) -> list[tuple[int, int]]:
    """(node, pages) of the pool's nodes, highest priority (most pages) first; ties by node order."""
    pages = pages or {}
    rank = {n: i for i, n in enumerate(pool.node_order)}
    return sorted(((n, int(pages.get(n, 0))) for n in pool.node_order), key=lambda x: (-x[1], rank[x[0]]))


def _has_pages(pages: dict | None) -> bool:
    return bool(pages) and any(v > 0 for v in pages.values())


def choose_allocate(pool: Pool, allocated, mode: str, pages: dict | None = None) -> int | None:
    """The next core to hand out, or None when the pool is exhausted."""
    held = set(allocated)
    if mode == "adaptive" and _has_pages(pages):
        dense = dense_order(pool)
        pos = {cid: i for i, cid in enumerate(dense)}
        held_l3 = {pool.core(c).l3 for c in held}
        for node, _ in priority_queue(pool, pages):
            free = [c for c in dense if c not in held and pool.core(c).numa_node == node]
            if free:
                return min(free, key=lambda c: (pool.core(c).l3 not in held_l3, pos[c]))
        return None
    order = sparse_order(pool) if mode == "sparse" else dense_order(pool)
    for cid in order:
        if cid not in held:
            return cid
    return None


def choose_release(pool: Pool, allocated, mode: str, pages: dict | None = None) -> int | None:
    """The core to take back, or None when only one is held (never below one core)."""
    held = list(allocated)
    if len(held) <= 1:
        return None
    if mode == "adaptive" and _has_pages(pages):
        dense = dense_order(pool)
        pos = {cid: i for i, cid in enumerate(dense)}
        for node, _ in reversed(priority_queue(pool, pages)):
            mine = [c for c in held if pool.core(c).numa_node == node]
            if mine:
                return max(mine, key=lambda c: pos[c])
        return None
    order = sparse_order(pool) if mode == "sparse" else dense_order(pool)
    pos = {cid: i for i, cid in enumerate(order)}
    return max(held, key=lambda c: pos[c])


def first_core(pool: Pool, mode: str, pages: dict | None = None) -> int:
    """The one core the target starts with."""
    cid = choose_allocate(pool, (), mode, pages)
    assert cid is not None
    return cid
