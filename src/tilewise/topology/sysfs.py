"""Linux sysfs: /sys/devices/system/{node,cpu}, read through an injected root directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology.build import RawNode, RawPU, build
from tilewise.topology.model import Topology

DEFAULT_ROOT = "/sys/devices/system"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _read_opt(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip())
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)]


def resolve_root(root: str | os.PathLike) -> Path:
    """Accept /sys/devices/system itself, or a saved tree holding sys/devices/system."""
    r = Path(root)
    for cand in (r, r / "sys" / "devices" / "system", r / "devices" / "system"):
        if (cand / "cpu").is_dir():
            return cand
    raise UsageError(f"{root} is not a sysfs copy", "expected a directory holding cpu/ and node/ (a copy of /sys/devices/system)")


def load(root: str | os.PathLike = DEFAULT_ROOT, *, allowed_cpus=None, meminfo_path: str = "/proc/meminfo") -> Topology:
    base = resolve_root(root)
    cpu_dir = base / "cpu"
    online_text = _read_opt(cpu_dir / "online")
    if online_text:
        cpus = cpulist.parse(online_text, what=f"{cpu_dir}/online")
    else:
        cpus = tuple(sorted(int(m.group(1)) for d in cpu_dir.iterdir() if (m := re.fullmatch(r"cpu(\d+)", d.name))))
    if not cpus:
        raise UsageError(f"no CPUs found under {cpu_dir}")

    # NUMA nodes (a kernel without NUMA has no node/ directory: one node holds everything).
    node_dir = base / "node"
    node_ids: list[int] = []
    if node_dir.is_dir():
        node_ids = sorted(int(m.group(1)) for d in node_dir.iterdir() if (m := re.fullmatch(r"node(\d+)", d.name)))
    cpu_node: dict[int, int] = {}
    raw_nodes: list[RawNode] = []
    distances: list[list[int]] | None = []
    if node_ids:
        for nid in node_ids:
            nd = node_dir / f"node{nid}"
            ncpus = cpulist.parse(_read(nd / "cpulist"), what=f"{nd}/cpulist", allow_empty=True)
            for c in ncpus:
                cpu_node[c] = nid
            mem = 0
            meminfo = _read_opt(nd / "meminfo") or ""
            if m := re.search(r"MemTotal:\s+(\d+)\s*kB", meminfo):
                mem = int(m.group(1)) * 1024
            kind = None
            if not ncpus:
                kind = _memory_kind(base, nid)
            raw_nodes.append(RawNode(nid, mem, ncpus, None, kind))
            dtext = _read_opt(nd / "distance")
            if dtext is None:
                distances = None
            elif distances is not None:
                row = [int(x) for x in dtext.split()]
                if len(row) != len(node_ids):
                    raise UsageError(f"{nd}/distance has {len(row)} entries for {len(node_ids)} nodes")
                distances.append(row)
    else:
        mem = 0
        text = _read_opt(Path(meminfo_path)) or ""
        if m := re.search(r"MemTotal:\s+(\d+)\s*kB", text):
            mem = int(m.group(1)) * 1024
        raw_nodes.append(RawNode(0, mem))
        cpu_node = {c: 0 for c in cpus}
        distances = [[10]]

    pus: list[RawPU] = []
    l3_sizes: dict = {}
    for c in cpus:
        topo = cpu_dir / f"cpu{c}" / "topology"
        if not topo.is_dir():
            raise UsageError(f"{topo} is missing", "is this a copy of /sys/devices/system?")
        pkg = int(_read(topo / "physical_package_id"))
        pkg = max(pkg, 0)  # some virtual machines report -1
        core_id = int(_read(topo / "core_id"))
        siblings_text = _read_opt(topo / "thread_siblings_list") or _read_opt(topo / "core_cpus_list")
        siblings = cpulist.parse(siblings_text, what=f"{topo}/thread_siblings_list") if siblings_text else (c,)
        # The core's identity is its sibling set: core_id repeats across dies and packages.
        core_key = ("core", min(siblings))
        l3_key = None
        cache_dir = cpu_dir / f"cpu{c}" / "cache"
        if cache_dir.is_dir():
            for idx in sorted(cache_dir.glob("index*")):
                if _read_opt(idx / "level") == "3" and (_read_opt(idx / "type") or "Unified") in ("Unified", "Data"):
                    shared = cpulist.parse(_read(idx / "shared_cpu_list"), what=f"{idx}/shared_cpu_list")
                    l3_key = ("l3", shared)
                    l3_sizes[l3_key] = _size(_read_opt(idx / "size") or "0")
                    break
        if c not in cpu_node:
            raise UsageError(f"cpu{c} is online but in no NUMA node's cpulist under {node_dir}")
        pus.append(RawPU(c, pkg, core_key, core_id, cpu_node[c], l3_key))
    return build(pus, raw_nodes, distances=distances, l3_sizes=l3_sizes, source=f"sysfs:{root}", allowed_cpus=allowed_cpus)


def _memory_kind(base: Path, nid: int) -> str:
    """Best-effort technology of a CPU-less node (memory tiers, dax); 'memory' when unknown."""
    tiers = base / "memory_tiering"
    if tiers.is_dir():
        for t in sorted(tiers.glob("memory_tier*")):
            nodes = _read_opt(t / "nodelist")
            if nodes and nid in cpulist.parse(nodes, allow_empty=True):
                # Tier 4 (adistance 512) is DRAM; slower tiers are CXL/PMem-like.
                m = re.search(r"(\d+)$", t.name)
                if m and int(m.group(1)) > 4:
                    return "cxl"
                return "memory"
    return "memory"


def load_live() -> Topology:
    """This machine, planning only on the CPUs this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    return load(DEFAULT_ROOT, allowed_cpus=allowed)
