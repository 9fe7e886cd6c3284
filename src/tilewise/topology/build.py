"""Assemble a Topology from the flat facts every source yields (one PU per row).

Sysfs, hwloc XML and synthetic descriptions all reduce to: for each PU, its package, core, NUMA
node and L3; for each NUMA node, its memory; and the node distance matrix. Grouping, ordering,
logical numbering and the nesting of L3 caches and NUMA nodes happen here once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology.model import Core, L3Domain, MemoryCache, NumaNode, Package, Topology


@dataclass(frozen=True)
class RawPU:
    cpu: int
    # an int: the package's OS index; another hashable: a package whose OS index is unknown (hwloc
    # groups those by package_cpus masks); None: the source has no package (one is invented)
    package: Hashable | None
    core_key: Hashable | None  # unique per physical core across the machine; None: no core in the source
    core_os_index: int
    node: int
    l3_key: Hashable | None  # unique per L3 cache; None when unknown or when the PU has no L3


@dataclass(frozen=True)
class RawNode:
    id: int
    memory_bytes: int
    cpus: tuple[int, ...] = ()  # filled from the PUs when empty
    package: int | None = None
    kind: str | None = None
    invented: bool = False
    hidden_cpus: tuple[int, ...] = ()  # its CPUs the source's restriction left out (NumaNode.hidden_cpus)


@dataclass(frozen=True)
class RawMemCache:
    nodes: tuple[int, ...]
    size_bytes: int
    level: int = 1


def note(level: str, text: str) -> dict:
    """One entry of Topology.notes: level "warning" (a defect of the source) or "note" (a choice)."""
    return {"level": level, "text": text}


def _package_ids(pus: Sequence[RawPU]) -> tuple[dict, list[Package]]:
    """Package key -> id, and the packages' flags (invented, os_index_known, shared_os_index). Known
    OS indexes keep their number; packages whose OS index is unknown, packages sharing an OS index
    (key ("shared", os index, ...)) and the invented one (for PUs without a package) get the next
    free numbers."""
    first: dict[Hashable, int] = {}
    for p in pus:
        first[p.package] = min(first.get(p.package, p.cpu), p.cpu)
    known = sorted(k for k in first if isinstance(k, int) and not isinstance(k, bool))
    ids: dict[Hashable, int] = {k: k for k in known}
    nxt = (max(known) + 1) if known else 0
    flags: dict[int, tuple] = {}
    for key in sorted((k for k in first if k not in ids), key=lambda k: first[k]):
        ids[key] = nxt
        shared = key[1] if isinstance(key, tuple) and key[:1] == ("shared",) else None
        flags[nxt] = (key is None, False, shared)  # (invented, os_index_known, shared_os_index)
        nxt += 1
    flags.update({k: (False, True, None) for k in known})
    return ids, flags


def _locality_blocks(pus: Sequence[RawPU], l3_group) -> dict[tuple[int, int], int]:
    """(package, node) -> lowest node id of its locality block: the nodes joined by L3 caches that
    hold CPUs of several of them (per package). Without such caches every node is its own block."""
    parent: dict[Hashable, Hashable] = {}

    def find(x: Hashable) -> Hashable:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pus:
        a, b = find(("node", p.package, p.node)), find(("l3", l3_group(p)))
        if a != b:
            parent[b] = a
    members: dict[Hashable, list[int]] = defaultdict(list)
    for p in pus:
        members[find(("node", p.package, p.node))].append(p.node)
    return {(p.package, p.node): min(members[find(("node", p.package, p.node))]) for p in pus}


def default_distances(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(10 if i == j else 20 for j in range(n)) for i in range(n))


def build(
    pus: Sequence[RawPU],
    nodes: Sequence[RawNode],
    *,
    distances: Sequence[Sequence[int]] | None,
    l3_sizes: dict[Hashable, int] | None = None,
    source: str,
    allowed_cpus: Sequence[int] | None = None,
    measurements: dict | None = None,
    distances_source: str | None = None,
    allowed_nodes: Sequence[int] | None = None,
    memory_caches: Sequence[RawMemCache] = (),
    memattrs: dict | None = None,
    notes: Sequence[dict] = (),
    devices: Sequence = (),
) -> Topology:
    if not pus:
        raise UsageError(f"topology from {source} has no PUs", "check the file or description")
    pkg_id, pkg_flags = _package_ids(pus)
    invented_cores = {p.cpu for p in pus if p.core_key is None}
    pus = [replace(p, package=pkg_id[p.package],
                   core_key=("pu", p.cpu) if p.core_key is None else p.core_key) for p in pus]
    l3_sizes = l3_sizes or {}
    node_ids = sorted({n.id for n in nodes} | {p.node for p in pus})
    raw_nodes = {n.id: n for n in nodes}

    # Cores: group PUs by core key; order by the core's lowest PU.
    core_pus: dict[Hashable, list[RawPU]] = defaultdict(list)
    for p in pus:
        core_pus[p.core_key].append(p)
    for key, members in core_pus.items():
        if len({(m.node, m.package) for m in members}) != 1:
            nodes = sorted({m.node for m in members if m.node is not None and m.node >= 0})
            raise UsageError(f"topology from {source}: the core of PUs {cpulist.format(sorted(m.cpu for m in members))} "
                             f"lies in several NUMA nodes ({cpulist.format(nodes) or 'none named'}) or packages",
                             "a core's hardware threads share one node and one package; the source is inconsistent")

    l3_known = any(p.l3_key is not None for p in pus)

    def l3_group(p: RawPU) -> Hashable:
        # One domain per L3 cache, whatever the NUMA nodes under it (an L3 that holds several nodes,
        # as with sub-NUMA clustering, stays one domain); without L3 facts, one domain per node.
        return p.l3_key if p.l3_key is not None else ("node", p.node)

    block_of = _locality_blocks(pus, l3_group)
    l3_first: dict[Hashable, int] = {}
    for p in pus:
        g = l3_group(p)
        l3_first[g] = min(l3_first.get(g, p.cpu), p.cpu)

    # Topology order: package, locality block (a node with its L3s, or an L3 with its nodes), node,
    # L3 (by its lowest cpu), core (by its lowest cpu). Where every L3 lies inside one node this is
    # package, node, L3, core.
    def core_sort_key(members: list[RawPU]) -> tuple:
        m = members[0]
        return (m.package, block_of[(m.package, m.node)], m.node, l3_first[l3_group(m)], min(x.cpu for x in members))

    ordered = sorted(core_pus.values(), key=core_sort_key)
    l3_index: dict[Hashable, int] = {}
    l3_cpus: dict[int, list[int]] = defaultdict(list)
    l3_nodes: dict[int, set[int]] = defaultdict(set)
    l3_meta: dict[int, tuple[int, int]] = {}
    cores: list[Core] = []
    for members in ordered:
        m = members[0]
        g = l3_group(m)
        if g not in l3_index:
            l3_index[g] = len(l3_index)
            size = l3_sizes.get(m.l3_key, 0) if l3_known else 0
            l3_meta[l3_index[g]] = (m.package, size)
        lid = l3_index[g]
        cpus = tuple(sorted(x.cpu for x in members))
        l3_cpus[lid].extend(cpus)
        l3_nodes[lid].add(m.node)
        cores.append(Core(len(cores), m.core_os_index, m.package, m.node, lid, cpus, m.cpu in invented_cores))

    l3_invented = {lid for g, lid in l3_index.items() if not l3_known or (isinstance(g, tuple) and g[:1] == ("node",))}
    l3_domains = tuple(
        L3Domain(lid, tuple(sorted(l3_cpus[lid])), tuple(sorted(l3_nodes[lid])), *l3_meta[lid], lid in l3_invented)
        for lid in range(len(l3_index))
    )

    node_cpu: dict[int, list[int]] = defaultdict(list)
    node_pkg: dict[int, int] = {}
    pkg_cpu: dict[int, list[int]] = defaultdict(list)
    for p in pus:
        node_cpu[p.node].append(p.cpu)
        node_pkg.setdefault(p.node, p.package)
        pkg_cpu[p.package].append(p.cpu)
    numa_nodes = []
    for nid in node_ids:
        rn = raw_nodes.get(nid, RawNode(nid, 0))
        cpus = tuple(sorted(node_cpu.get(nid, ())))
        kind = rn.kind or ("dram" if cpus else "memory")
        pkg = node_pkg.get(nid, pkg_id.get(rn.package, rn.package))
        if pkg not in pkg_cpu:  # a package with no PU here (emptied by a restriction): none
            pkg = None
        numa_nodes.append(NumaNode(nid, cpus, rn.memory_bytes, pkg, kind, rn.invented,
                                   tuple(sorted(set(rn.hidden_cpus) - set(cpus)))))
    packages = tuple(Package(pid, tuple(sorted(c)), *pkg_flags[pid]) for pid, c in sorted(pkg_cpu.items()))

    if distances is None or not len(distances) or len(numa_nodes) == 1:  # hwloc keeps no 1-node matrix
        dist = default_distances(len(numa_nodes))
        distances_source = "default"
    else:
        dist = tuple(tuple(int(v) for v in row) for row in distances)
        distances_source = distances_source or "firmware"
    caches = tuple(MemoryCache(i, tuple(sorted(m.nodes)), m.size_bytes, m.level)
                   for i, m in enumerate(sorted(memory_caches, key=lambda m: (sorted(m.nodes), -m.level))))
    node_set = set(node_ids)
    for m in caches:
        if not m.numa_nodes or not set(m.numa_nodes) <= node_set:
            raise UsageError(f"topology from {source}: a memory-side cache names unknown NUMA node(s) "
                             f"{sorted(set(m.numa_nodes) - node_set)}")
    mem_allowed = None
    if allowed_nodes is not None:
        mem_allowed = tuple(sorted(set(allowed_nodes) & node_set))
        if mem_allowed == tuple(node_ids):
            mem_allowed = None

    allowed = None
    if allowed_cpus is not None:
        all_cpus = {p.cpu for p in pus}
        allowed_set = set(allowed_cpus) & all_cpus
        if not allowed_set:
            raise UsageError(f"topology from {source}: no allowed CPU among its PUs")
        allowed = None if allowed_set == all_cpus else tuple(sorted(allowed_set))

    return Topology(
        packages=packages,
        numa_nodes=tuple(numa_nodes),
        l3_domains=l3_domains,
        cores=tuple(cores),
        distances=dist,
        source=source,
        allowed_cpus=allowed,
        l3_known=l3_known,
        measurements=dict(measurements or {}),
        distances_source=distances_source,
        allowed_nodes=mem_allowed,
        memory_caches=caches,
        memattrs=dict(memattrs or {}),
        notes=tuple(notes),
        devices=tuple(sorted(devices, key=lambda d: d.address)),
    )
