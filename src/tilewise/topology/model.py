"""One set of types for every topology source (sysfs, hwloc XML, synthetic).

Vocabulary follows hwloc: Package > NUMANode > L3Cache ("chiplet": CCX/CCD, tile, cluster) > Core
> PU, except that the nesting of NUMA nodes and L3 caches is not fixed: with sub-NUMA clustering
one L3 holds several nodes (Package > L3Cache > NUMANode > Core), and the model keeps it one L3. CPU numbers are OS (physical) indexes everywhere; logical indexes are positions in the
sorted tuples below and are printed as L#n next to P#n.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology.pci import PciDevice


@dataclass(frozen=True)
class Package:
    id: int  # OS index (physical_package_id); a logical number when os_index_known is False
    cpus: tuple[int, ...]
    invented: bool = False  # the source has no package: one made up to hold its PUs
    os_index_known: bool = True  # False: grouped as hwloc does (package_cpus masks, XML without os_index)
    # an OS index several packages share (Itanium's physical_package_id repeats across distinct
    # package_cpus groups; hwloc shows each group as a package with that index): id is then logical
    shared_os_index: int | None = None

    @property
    def os_index(self) -> int | None:
        if self.shared_os_index is not None:
            return self.shared_os_index
        return self.id if self.os_index_known and not self.invented else None


@dataclass(frozen=True)
class NumaNode:
    id: int  # OS index
    cpus: tuple[int, ...]  # empty for CPU-less memory nodes (CXL, HBM, PMem)
    memory_bytes: int  # 0 when unknown
    package: int | None = None
    kind: str = "dram"  # dram | cxl | hbm | pmem | memory (CPU-less, unknown technology)
    # not in the source: made up for PUs that have no NUMA node above them (a container whose
    # allowed memory excludes their node, a firmware node left out); its memory is unknown
    invented: bool = False
    # a node left with no CPU by the source's restriction (a cgroup's, --restrict's): its CPUs, not
    # allowed here; its memory is ordinary memory local to them, not a CPU-less tier
    hidden_cpus: tuple[int, ...] = ()

    @property
    def cpuless(self) -> bool:
        return not self.cpus

    @property
    def restricted_away(self) -> bool:
        """No CPU here only because the source's restriction left its CPUs out."""
        return not self.cpus and bool(self.hidden_cpus)


@dataclass(frozen=True)
class L3Domain:
    """CPUs sharing one last-level cache: the planning unit "chiplet".

    Usually inside one NUMA node; where one L3 holds several nodes (Intel sub-NUMA clustering, or
    a VM that splits a die's CPUs over nodes) it stays one domain listing all of them, as hwloc
    puts those nodes under the cache. A cache is never split by node.
    """

    id: int  # logical index, 0..n-1 in topology order
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]  # the nodes holding its CPUs: one, or several when it spans nodes
    package: int
    size_bytes: int  # 0 when unknown
    # not an L3 of the source: the cores of a node without L3 facts (l3_known False), or cores
    # with no L3 above them on a machine that has L3s (low-power E-cores): "no L3", never a chiplet
    invented: bool = False

    @property
    def spans_nodes(self) -> bool:
        return len(self.numa_nodes) > 1


@dataclass(frozen=True)
class Core:
    id: int  # logical index, 0..n-1 in topology order
    os_index: int  # core_id as the OS reports it (unique only within a package)
    package: int
    numa_node: int
    l3: int  # L3Domain.id
    pus: tuple[int, ...]  # OS cpu numbers, first is the primary hardware thread
    invented: bool = False  # the source has no Core objects: one made up per PU

    @property
    def primary(self) -> int:
        return self.pus[0]


@dataclass(frozen=True)
class MemoryCache:
    """A memory-side cache (hwloc's MemCache): DRAM caching slower memory (Optane memory mode, HBM
    or MCDRAM cache mode) in front of the NUMA node(s) it lists."""

    id: int  # logical index, in node order
    numa_nodes: tuple[int, ...]
    size_bytes: int
    level: int = 1  # hwloc's cache depth: 1 nearest to the memory


# OS/firmware SLIT; added by a tool (hwloc-annotate & co); invented 10/20; the firmware's with
# 10/20 for invented nodes
DISTANCE_SOURCES = ("firmware", "user", "default", "partial")


@dataclass
class Topology:
    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    l3_domains: tuple[L3Domain, ...]
    cores: tuple[Core, ...]
    distances: tuple[tuple[int, ...], ...]  # SLIT, rows/cols in numa_nodes order
    source: str = "unknown"
    allowed_cpus: tuple[int, ...] | None = None  # None: all CPUs allowed
    l3_known: bool = True  # False when no L3 information existed (one domain per node then)
    # Measured matrices keyed by name ("latency_ns", "bandwidth_gbs"): {"cpus": [...], "values": [[...]]}
    measurements: dict = field(default_factory=dict)
    # PCI GPUs, accelerators and NICs with their NUMA node and local CPUs (topology/pci.py)
    devices: tuple[PciDevice, ...] = ()
    # where the distance matrix comes from: firmware (the OS/firmware SLIT), user (added to the
    # XML by a tool such as hwloc-annotate), default (none in the source: 10 local, 20 remote) or
    # partial (the source's, with 10/20 for nodes the model invented)
    distances_source: str = "firmware"
    allowed_nodes: tuple[int, ...] | None = None  # NUMA nodes whose memory may be used; None: all
    memory_caches: tuple[MemoryCache, ...] = ()
    # hwloc memory attributes kept as read: {name: {"flags": int, "values": [{"target_node": id,
    # "initiator_cpus": [cpus] | None, "value": int}]}}
    memattrs: dict = field(default_factory=dict)
    # how this model differs from what the source says or what hwloc reads from it, and why
    # ({"level": "warning" | "note", "text": ...}); warnings are firmware or file defects
    notes: tuple[dict, ...] = ()

    def __post_init__(self) -> None:
        validate(self)

    # ---- derived views -------------------------------------------------------------------
    @cached_property
    def pus(self) -> tuple[int, ...]:
        return tuple(sorted(p for c in self.cores for p in c.pus))

    @cached_property
    def core_of_cpu(self) -> dict[int, Core]:
        return {p: c for c in self.cores for p in c.pus}

    @cached_property
    def node_by_id(self) -> dict[int, NumaNode]:
        return {n.id: n for n in self.numa_nodes}

    @cached_property
    def package_by_id(self) -> dict[int, Package]:
        return {p.id: p for p in self.packages}

    @cached_property
    def l3_by_id(self) -> dict[int, L3Domain]:
        return {d.id: d for d in self.l3_domains}

    def l3s_of_node(self, node: int) -> tuple[L3Domain, ...]:
        """The L3 domains holding CPUs of a node (several L3s in one node, or one L3 over several nodes)."""
        return tuple(d for d in self.l3_domains if node in d.numa_nodes)

    @cached_property
    def locality_blocks(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """(node ids, L3 ids) groups that L3 caches spanning nodes join, in topology order.

        Usually one node with the L3s inside it; with sub-NUMA clustering one L3 with its nodes."""
        blocks: list[tuple[set[int], set[int]]] = []
        for d in self.l3_domains:
            nodes = set(d.numa_nodes)
            joined = [b for b in blocks if b[0] & nodes]
            merged = (nodes.union(*(b[0] for b in joined)), {d.id}.union(*(b[1] for b in joined)))
            blocks = [b for b in blocks if b not in joined] + [merged]
        blocks.sort(key=lambda b: min(b[1]))
        return tuple((tuple(sorted(n)), tuple(sorted(l))) for n, l in blocks)

    @property
    def l3_spans_nodes(self) -> bool:
        return any(d.spans_nodes for d in self.l3_domains)

    @property
    def mem_allowed_nodes(self) -> tuple[int, ...]:
        """The NUMA nodes whose memory may be used (a container can allow fewer than it shows)."""
        ids = tuple(n.id for n in self.numa_nodes)
        if self.allowed_nodes is None:
            return ids
        return tuple(i for i in ids if i in set(self.allowed_nodes))

    @property
    def chiplets(self) -> tuple[L3Domain, ...]:
        """L3 domains that are real caches of the source."""
        return tuple(d for d in self.l3_domains if not d.invented)

    @property
    def cpu_nodes(self) -> tuple[NumaNode, ...]:
        return tuple(n for n in self.numa_nodes if n.cpus)

    @property
    def gpus(self) -> tuple[PciDevice, ...]:
        """GPUs and other accelerators, in PCI address order."""
        return tuple(d for d in self.devices if d.is_gpu)

    @property
    def nics(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "nic")

    @property
    def smt(self) -> int:
        return max((len(c.pus) for c in self.cores), default=1)

    @property
    def memory_bytes(self) -> int:
        return sum(n.memory_bytes for n in self.numa_nodes)

    @property
    def total_l3_bytes(self) -> int:
        return sum(d.size_bytes for d in self.l3_domains)

    def usable_cores(self) -> tuple[Core, ...]:
        """Cores with at least one allowed PU (plan only on allowed CPUs)."""
        if self.allowed_cpus is None:
            return self.cores
        allowed = set(self.allowed_cpus)
        return tuple(c for c in self.cores if any(p in allowed for p in c.pus))

    def core_cpus(self, core: Core, smt: bool) -> tuple[int, ...]:
        """The CPUs of a core a plan may use: primary thread only, or all allowed threads."""
        allowed = set(self.allowed_cpus) if self.allowed_cpus is not None else None
        pus = [p for p in core.pus if allowed is None or p in allowed]
        return tuple(pus if smt else pus[:1])

    def distance(self, a: int, b: int) -> int:
        ids = [n.id for n in self.numa_nodes]
        return self.distances[ids.index(a)][ids.index(b)]

    def fingerprint(self) -> str:
        """Stable hash of the shape (nodes, L3s, cores, PUs): same machine -> same fingerprint."""
        shape = {
            "nodes": [[n.id, list(n.cpus)] for n in self.numa_nodes],
            "l3": [list(d.cpus) for d in self.l3_domains],
            "cores": [list(c.pus) for c in self.cores],
        }
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> str:
        return summary_line(self)


def human_bytes(n: int) -> str:
    if n <= 0:
        return "unknown"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{n} B"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_line(t: Topology) -> str:
    """e.g. '2 packages, 2 NUMA nodes, 16 chiplets x 8 cores, SMT2, 512 GiB'."""
    parts = [_plural(len(t.packages), "package")]
    if any(p.invented for p in t.packages):
        parts[-1] += " (invented: the source has none)"
    nodes = _plural(len(t.numa_nodes), "NUMA node")
    cpuless = sum(1 for n in t.numa_nodes if n.cpuless and not n.restricted_away)
    away = sum(1 for n in t.numa_nodes if n.restricted_away)
    said = ([f"{cpuless} CPU-less"] if cpuless else []) + ([f"{away} with no allowed CPU"] if away else [])
    if said:
        nodes += f" ({', '.join(said)})"
    parts.append(nodes)
    cores_in = Counter(c.l3 for c in t.cores)
    # with L3 facts, cores under no L3 (low-power E-cores) are not a chiplet: counted apart
    domains = t.chiplets if t.l3_known else t.l3_domains
    per_l3 = Counter(cores_in[d.id] for d in domains)
    sizes = " + ".join(f"{k} x {_plural(v, 'core')}" for v, k in sorted(per_l3.items(), key=lambda kv: -kv[1]))
    word = "chiplet" if t.l3_known else "node-wide domain"
    spanning = [d for d in domains if d.spans_nodes]
    if not per_l3:
        parts.append("no L3")
    elif len(per_l3) == 1:
        (v, k), = per_l3.items()
        parts.append(f"{k} {word}{'s' if k != 1 else ''} x {_plural(v, 'core')}")
    else:
        parts.append(f"{len(domains)} {word}s ({sizes})")
    if spanning:
        per = Counter(len(d.numa_nodes) for d in spanning)
        if len(spanning) == len(domains) and len(per) == 1:
            parts[-1] += f" each spanning {next(iter(per))} NUMA nodes"
        else:
            parts[-1] += f", {len(spanning)} spanning several NUMA nodes"
    no_l3 = sum(cores_in[d.id] for d in t.l3_domains if d.invented) if t.l3_known else 0
    if no_l3:
        parts[-1] += f" + {_plural(no_l3, 'core')} without L3"
    if any(c.invented for c in t.cores):
        parts[-1] += " (cores invented, one per PU: the source has none)"
    parts.append(f"SMT{t.smt}" if t.smt > 1 else "no SMT")
    parts.append(human_bytes(t.memory_bytes))
    return ", ".join(parts)


def validate(t: Topology) -> None:
    """Reject inconsistent models: a parse error must never look like an empty machine."""
    if not t.cores:
        raise UsageError(f"topology from {t.source} has no cores", "check the file or description")
    if not t.numa_nodes:
        raise UsageError(f"topology from {t.source} has no NUMA node")
    seen: dict[int, int] = {}
    for c in t.cores:
        if not c.pus:
            raise UsageError(f"topology from {t.source}: core L#{c.id} has no PU")
        for p in c.pus:
            if p in seen:
                raise UsageError(f"topology from {t.source}: PU P#{p} belongs to two cores")
            seen[p] = c.id
    node_ids = [n.id for n in t.numa_nodes]
    if len(set(node_ids)) != len(node_ids):
        raise UsageError(f"topology from {t.source}: duplicate NUMA node ids")
    node_cpus = sorted(p for n in t.numa_nodes for p in n.cpus)
    if node_cpus != sorted(seen):
        raise UsageError(
            f"topology from {t.source}: NUMA node cpus ({cpulist.format(node_cpus)}) "
            f"do not cover the cores' PUs ({cpulist.format(seen)})"
        )
    for d in t.l3_domains:
        unknown = [x for x in d.numa_nodes if x not in node_ids]
        if unknown or not d.numa_nodes:
            raise UsageError(f"topology from {t.source}: L3 L#{d.id} names unknown NUMA node(s) {unknown}")
    if t.distances_source not in DISTANCE_SOURCES:
        raise UsageError(f"topology from {t.source}: unknown distances source {t.distances_source!r}")
    n = len(t.numa_nodes)
    if len(t.distances) != n or any(len(r) != n for r in t.distances):
        raise UsageError(f"topology from {t.source}: distance matrix is not {n}x{n}")
