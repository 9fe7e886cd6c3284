"""The firmware's memory figures and the kernel's memory tiers, as Linux shows them in sysfs.

ACPI HMAT (Heterogeneous Memory Attribute Table) gives latency and bandwidth from initiators
(CPUs, or other agents) to memory; Linux keeps, for every memory node, the figures of its *best*
initiators only, in two access classes (Documentation/admin-guide/mm/numaperf.rst):

    /sys/devices/system/node/nodeT/access0/initiators/{read,write}_{latency,bandwidth}   any initiator
    /sys/devices/system/node/nodeT/access1/initiators/...                                CPU initiators only
    /sys/devices/system/node/nodeT/accessK/initiators/nodeI                              the best initiators

Latency in nanoseconds, bandwidth in MB/s as the kernel writes it (what QEMU is given in MiB/s,
and what hwloc reports as MiB/s). A figure of 0 means the firmware gave none. The kernel's memory
tiers (Linux 6.1+) are /sys/devices/virtual/memory_tiering/memory_tierN/nodelist; a tier's number
is its abstract distance divided by 128 (DRAM is tier 4, slower memory higher). The weights of
weighted interleave (Linux 6.9+) are /sys/kernel/mm/mempolicy/weighted_interleave/nodeN.

Everything is read through an injected root (a saved copy of /sys in tests). Read-only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist
from tilewise.errors import UsageError

SYS = "/sys"
ACCESS_CLASSES = ("access0", "access1")  # access0: any initiator; access1: CPU initiators only
FIGURES = ("read_latency", "write_latency", "read_bandwidth", "write_bandwidth")
UNITS = {"read_latency": "ns", "write_latency": "ns", "read_bandwidth": "MB/s", "write_bandwidth": "MB/s"}
TIER_CHUNK = 128  # MEMTIER_CHUNK_SIZE: one tier per 128 of abstract distance
DRAM_TIER = 4  # MEMTIER_ADISTANCE_DRAM (512) / 128


@dataclass(frozen=True)
class Access:
    """The firmware figures of one memory node (target) from its best initiators, in one access class."""

    target: int
    access: str  # access0 | access1
    initiators: tuple[int, ...]  # nodes the kernel links as the best initiators
    read_latency: int | None = None  # ns; None: the firmware gave none
    write_latency: int | None = None
    read_bandwidth: int | None = None  # MB/s
    write_bandwidth: int | None = None

    def figure(self, name: str) -> int | None:
        return getattr(self, name)

    def to_json(self) -> dict:
        return {"target": self.target, "access": self.access, "initiators": list(self.initiators),
                **{f: getattr(self, f) for f in FIGURES}}


@dataclass(frozen=True)
class MemoryTier:
    id: int  # memory_tierN
    nodes: tuple[int, ...]

    @property
    def adistance(self) -> tuple[int, int]:
        """The range of abstract distance the kernel puts in this tier."""
        return self.id * TIER_CHUNK, (self.id + 1) * TIER_CHUNK - 1

    def to_json(self) -> dict:
        return {"id": self.id, "nodes": list(self.nodes), "adistance": list(self.adistance)}


@dataclass(frozen=True)
class Firmware:
    """What this kernel shows of the firmware's memory figures and its own memory tiers."""

    accesses: tuple[Access, ...] = ()
    tiers: tuple[MemoryTier, ...] = ()
    tiers_supported: bool = False  # the kernel has /sys/devices/virtual/memory_tiering (6.1+)
    weights: dict[int, int] = field(default_factory=dict)  # weighted interleave, node -> weight (6.9+)
    weights_supported: bool = False
    source: str = SYS

    @property
    def has_hmat(self) -> bool:
        return any(any(a.figure(f) for f in FIGURES) for a in self.accesses)

    def access(self, target: int, access: str = "access1") -> Access | None:
        return next((a for a in self.accesses if a.target == target and a.access == access), None)

    def figure(self, initiator: int, target: int, name: str, access: str = "access1") -> int | None:
        """The firmware's figure for the path initiator -> target, where the kernel kept it (the
        initiator is among the target's best); None otherwise."""
        a = self.access(target, access)
        if a is None or initiator not in a.initiators:
            return None
        return a.figure(name)

    def tier_of(self, node: int) -> int | None:
        return next((t.id for t in self.tiers if node in t.nodes), None)

    def to_json(self) -> dict:
        return {"source": self.source, "hmat": [a.to_json() for a in self.accesses],
                "tiers_supported": self.tiers_supported, "tiers": [t.to_json() for t in self.tiers],
                "weighted_interleave_supported": self.weights_supported,
                "weighted_interleave": {str(k): v for k, v in sorted(self.weights.items())}}


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _int(text: str | None, where: Path) -> int | None:
    if text is None or text == "":
        return None
    try:
        v = int(text)
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a number", "is this a copy of /sys?") from None
    if v < 0:
        raise UsageError(f"{where}: negative value {v}")
    return v or None  # 0: the firmware gave no figure


def read(root: str | os.PathLike = SYS) -> Firmware:
    """The HMAT figures, memory tiers and interleave weights under root (a /sys, or a copy of it)."""
    base = Path(root)
    node_dir = base / "devices" / "system" / "node"
    accesses: list[Access] = []
    if node_dir.is_dir():
        for nd in sorted(node_dir.glob("node*"), key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else -1):
            m = re.fullmatch(r"node(\d+)", nd.name)
            if not m:
                continue
            target = int(m.group(1))
            for acc in ACCESS_CLASSES:
                d = nd / acc / "initiators"
                if not d.is_dir():
                    continue
                inits = tuple(sorted(int(x.name[4:]) for x in d.iterdir() if re.fullmatch(r"node\d+", x.name)))
                figs = {f: _int(_read(d / f), d / f) for f in FIGURES}
                accesses.append(Access(target, acc, inits, **figs))
    tier_dir = base / "devices" / "virtual" / "memory_tiering"
    tiers: list[MemoryTier] = []
    if tier_dir.is_dir():
        for td in tier_dir.glob("memory_tier*"):
            m = re.fullmatch(r"memory_tier(\d+)", td.name)
            text = _read(td / "nodelist") if m else None
            if m and text is not None:
                nodes = cpulist.parse(text, what=f"{td}/nodelist", allow_empty=True)
                tiers.append(MemoryTier(int(m.group(1)), tuple(nodes)))
    wdir = base / "kernel" / "mm" / "mempolicy" / "weighted_interleave"
    weights: dict[int, int] = {}
    if wdir.is_dir():
        for w in wdir.glob("node*"):
            m = re.fullmatch(r"node(\d+)", w.name)
            v = _read(w) if m else None
            if m and v is not None and v.isdigit():
                weights[int(m.group(1))] = int(v)
    return Firmware(tuple(accesses), tuple(sorted(tiers, key=lambda t: t.id)), tier_dir.is_dir(), weights,
                    wdir.is_dir(), str(root))


# ---- as hwloc memory attributes (Topology.memattrs) -------------------------------------------------
# hwloc's names and flags (hwloc_memattr_flag_e: 1 higher first, 2 lower first, 4 needs an initiator).
# Like hwloc's Linux backend, the figures come from access1 (CPU initiators; access0 where the kernel
# has no access1), the initiator is the union of the best initiators' CPUs, and Bandwidth/Latency
# are the mean of read and write.
HIGHER_FIRST, LOWER_FIRST, NEED_INITIATOR = 1, 2, 4
HWLOC_NAMES = {"read_latency": "ReadLatency", "write_latency": "WriteLatency", "read_bandwidth": "ReadBandwidth",
               "write_bandwidth": "WriteBandwidth"}
FLAGS = {"ReadLatency": LOWER_FIRST | NEED_INITIATOR, "WriteLatency": LOWER_FIRST | NEED_INITIATOR,
         "Latency": LOWER_FIRST | NEED_INITIATOR, "ReadBandwidth": HIGHER_FIRST | NEED_INITIATOR,
         "WriteBandwidth": HIGHER_FIRST | NEED_INITIATOR, "Bandwidth": HIGHER_FIRST | NEED_INITIATOR}
TIER_ATTR = "tilewise:MemoryTier"  # the kernel's memory_tierN of each node (no initiator; lower is nearer)


def to_memattrs(fw: Firmware, node_cpus: dict[int, tuple[int, ...]]) -> dict:
    """The firmware figures and kernel tiers as hwloc memattrs ({name: {"flags", "values": [...]}})."""
    out: dict = {}

    def add(name: str, flags: int, target: int, cpus, value: int) -> None:
        out.setdefault(name, {"flags": flags, "values": []})["values"].append(
            {"target_node": target, "initiator_cpus": list(cpus) if cpus is not None else None, "value": int(value)})

    targets = sorted({a.target for a in fw.accesses})
    for target in targets:
        a = fw.access(target, "access1") or fw.access(target, "access0")
        cpus = sorted(c for i in a.initiators for c in node_cpus.get(i, ())) if a else []
        if not a or not cpus:
            continue
        for f, name in HWLOC_NAMES.items():
            if a.figure(f):
                add(name, FLAGS[name], target, cpus, a.figure(f))
        for both, (r, w) in (("Latency", ("read_latency", "write_latency")), ("Bandwidth", ("read_bandwidth", "write_bandwidth"))):
            vals = [a.figure(x) for x in (r, w) if a.figure(x)]
            if vals:
                add(both, FLAGS[both], target, cpus, sum(vals) // len(vals))
    for tier in fw.tiers:
        for n in tier.nodes:
            add(TIER_ATTR, LOWER_FIRST, n, None, tier.id)
    return out


def from_memattrs(memattrs: dict, node_cpus: dict[int, tuple[int, ...]], source: str = "memattrs") -> Firmware:
    """The firmware figures and kernel tiers kept in memattrs (read from sysfs, or from an hwloc XML file
    that real hwloc or tilewise wrote): one access1 record per target. An initiator cpuset maps back to
    the nodes whose CPUs it holds."""
    per: dict[int, dict] = {}
    for f, name in HWLOC_NAMES.items():
        for v in (memattrs.get(name) or {}).get("values", []):
            cpus = set(v.get("initiator_cpus") or ())
            inits = tuple(sorted(n for n, cs in node_cpus.items() if cs and set(cs) <= cpus))
            rec = per.setdefault(v["target_node"], {"initiators": inits})
            rec[f] = int(v["value"]) or None
    accesses = tuple(Access(t, "access1", r.pop("initiators"), **r) for t, r in sorted(per.items()))
    tiers: dict[int, list[int]] = {}
    for v in (memattrs.get(TIER_ATTR) or {}).get("values", []):
        tiers.setdefault(int(v["value"]), []).append(v["target_node"])
    return Firmware(accesses, tuple(MemoryTier(k, tuple(sorted(ns))) for k, ns in sorted(tiers.items())),
                    bool(tiers), {}, False, source)
