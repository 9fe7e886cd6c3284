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
from functools import cached_property

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

    # computed once per pool (the pool never changes): a tick at 256 cores must not re-sort it
    @cached_property
    def by_id(self) -> dict[int, Core]:
        return {c.id: c for c in self.cores}

    @cached_property
    def dense(self) -> tuple[int, ...]:
        rank = {n: i for i, n in enumerate(self.node_order)}
        return tuple(c.id for c in sorted(self.cores, key=lambda c: (rank[c.numa_node], c.l3, c.id)))

    @cached_property
    def sparse(self) -> tuple[int, ...]:
        per_node: dict[int, list[int]] = {n: [] for n in self.node_order}
        for cid in self.dense:
            per_node[self.by_id[cid].numa_node].append(cid)
        out, j = [], 0
        while len(out) < self.n_total:
            for n in self.node_order:
                if j < len(per_node[n]):
                    out.append(per_node[n][j])
            j += 1
        return tuple(out)

    @cached_property
    def dense_pos(self) -> dict[int, int]:
        return {cid: i for i, cid in enumerate(self.dense)}

    @cached_property
    def sparse_pos(self) -> dict[int, int]:
        return {cid: i for i, cid in enumerate(self.sparse)}

    def core(self, cid: int) -> Core:
        return self.by_id[cid]

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
    by_id = pool.by_id
    if mode == "adaptive" and _has_pages(pages):
        held_l3 = {by_id[c].l3 for c in held}
        for node, _ in priority_queue(pool, pages):
            # the dense order is node-major then L3: the first free core of the node in an L3
            # already held, else the node's first free core
            first = None
            for c in pool.dense:
                if c in held:
                    continue
                core = by_id[c]
                if core.numa_node != node:
                    continue
                if core.l3 in held_l3:
                    return c
                if first is None:
                    first = c
            if first is not None:
                return first
        return None
    order = pool.sparse if mode == "sparse" else pool.dense
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
        pos, by_id = pool.dense_pos, pool.by_id
        for node, _ in reversed(priority_queue(pool, pages)):
            mine = [c for c in held if by_id[c].numa_node == node]
            if mine:
                return max(mine, key=pos.__getitem__)
        return None
    pos = pool.sparse_pos if mode == "sparse" else pool.dense_pos
    return max(held, key=pos.__getitem__)


def first_core(pool: Pool, mode: str, pages: dict | None = None) -> int:
    """The one core the target starts with."""
    cid = choose_allocate(pool, (), mode, pages)
    assert cid is not None
    return cid
