"""hwloc synthetic descriptions, e.g. ``Package:2 [NUMANode(memory=256GB)] L3Cache:8(size=32MB) Core:8 PU:2``.

Supported, as in hwloc 2.x: levels ``Machine``, ``Package``/``Socket``, ``Die``, ``Group``,
``NUMANode``, ``L3Cache``, ``L2Cache``, ``L1Cache``/``L1dCache``/``L1iCache``, ``Core``, ``PU``
with counts; memory attached with ``[NUMANode]`` after a level (a second ``[NUMANode]`` on the
same level is a CPU-less memory node, e.g. CXL); attributes ``memory=`` (NUMANode), ``size=``
(caches), ``indexes=`` (an explicit OS index list, e.g. for SMT siblings N and N+64 on EPYC).
Sizes use hwloc's units: KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024.
Defaults as hwloc's: L3 16 MiB; 1 GiB for an implicit node or a NUMANode level; 0 (unknown) for [NUMANode].
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from tilewise.cpulist import is_number as _digits
from tilewise.errors import UsageError
from tilewise.topology.build import RawNode, RawPU, build
from tilewise.topology.model import Topology

_TYPES = {
    "machine": "Machine",
    "package": "Package",
    "socket": "Package",
    "die": "Die",
    "group": "Group",
    "numanode": "NUMANode",
    "node": "NUMANode",
    "l3cache": "L3Cache",
    "l3": "L3Cache",
    "l2cache": "L2Cache",
    "l2": "L2Cache",
    "l1cache": "L1Cache",
    "l1dcache": "L1Cache",
    "l1d": "L1Cache",
    "l1": "L1Cache",
    "l1icache": "L1iCache",
    "core": "Core",
    "pu": "PU",
}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
DEFAULT_L3 = 16 * 2**20
IMPLICIT_NODE_MEMORY = 2**30


@dataclass
class _Level:
    type: str
    count: int
    attrs: dict = field(default_factory=dict)
    memory: list[dict] = field(default_factory=list)  # [NUMANode] attached to each object here


MAX_BYTES = 1 << 62  # beyond any machine's memory or cache
MAX_DESC = 10_000  # characters in a description


def _parse_size(value: str, desc: str) -> int:
    m = re.fullmatch(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([A-Za-z]*)", value.strip())
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"bad size {value!r} in synthetic description {desc!r}", "use e.g. 32MB or 256GiB")
    n = int(Decimal(m.group(1)) * _UNITS[m.group(2).upper()])
    if n > MAX_BYTES:
        raise UsageError(f"size {value!r} in synthetic description {desc!r} is beyond any machine", "use e.g. 32MB or 256GiB")
    return n


def _small_int(text: str, what: str, desc: str) -> int:
    text = text.strip()
    if not _digits(text) or len(text) > 7:
        raise UsageError(f"bad {what} {text!r} in synthetic description {desc!r}", "at most 65536 PUs are supported")
    return int(text)


def _parse_attrs(text: str | None, desc: str) -> dict:
    if not text:
        return {}
    out: dict = {}
    for part in text.split(","):
        if "=" not in part:
            # continuation of an indexes list
            if "indexes" in out and _digits(part.strip()):
                out["indexes"].append(_small_int(part, "PU index", desc))
                continue
            raise UsageError(f"bad attribute {part!r} in synthetic description {desc!r}")
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key in ("memory", "size"):
            out[key] = _parse_size(value, desc)
        elif key == "indexes":
            if not _digits(value.strip()):
                raise UsageError(
                    f"unsupported indexes={value!r} in synthetic description {desc!r}",
                    "give an explicit list, e.g. PU:2(indexes=0,4,1,5,2,6,3,7)",
                )
            out["indexes"] = [_small_int(value, "PU index", desc)]
        else:
            out[key] = value.strip()  # hwloc's other attributes (type, associativity...) are ignored
    return out


def parse_levels(desc: str) -> tuple[list[dict], list[_Level]]:
    if len(desc) > MAX_DESC:
        raise UsageError(f"synthetic description of {len(desc)} characters", f"at most {MAX_DESC} are supported")
    # linear in the text: no alternative scans past the next bracket, so no input backtracks
    tokens = re.findall(r"\[[^\[\]]*\]|[^\s\[(]+(?:\([^()]*\))?|\S", desc)
    if not tokens:
        raise UsageError("empty synthetic description", "e.g. synthetic:Package:2 [NUMANode] L3Cache:8 Core:8 PU:2")
    machine_memory: list[dict] = []
    levels: list[_Level] = []
    for tok in tokens:
        if tok.startswith("["):
            m = re.fullmatch(r"\[\s*(\w+)\s*(?:\((.*)\))?\s*\]", tok)
            if not m or _TYPES.get(m.group(1).lower()) != "NUMANode":
                raise UsageError(f"bad memory attachment {tok!r} in synthetic description {desc!r}", "use [NUMANode] or [NUMANode(memory=64GB)]")
            (levels[-1].memory if levels else machine_memory).append(_parse_attrs(m.group(2), desc))
            continue
        m = re.fullmatch(r"(\w+):(\d+)(?:\((.*)\))?", tok)
        if not m or m.group(1).lower() not in _TYPES:
            raise UsageError(f"bad level {tok!r} in synthetic description {desc!r}", "levels look like Package:2, L3Cache:8, Core:8, PU:2")
        typ = _TYPES[m.group(1).lower()]
        count = _small_int(m.group(2), "count", desc)
        if count < 1:
            raise UsageError(f"level {tok!r} needs a count of at least 1")
        if typ == "Machine":
            if count != 1:
                raise UsageError("Machine:N with N > 1 is not supported", "describe one machine")
            continue
        levels.append(_Level(typ, count, _parse_attrs(m.group(3), desc)))
    if not levels or levels[-1].type != "PU":
        raise UsageError(f"synthetic description {desc!r} must end with a PU level", "e.g. ... Core:8 PU:2")
    if any(lv.type == "PU" for lv in levels[:-1]):
        raise UsageError(f"synthetic description {desc!r} has a PU level before the last")
    return machine_memory, levels


def load(desc: str) -> Topology:
    machine_memory, levels = parse_levels(desc)
    total = 1
    for lv in levels:
        total *= lv.count
    if total > 1 << 16:
        raise UsageError(f"synthetic description {desc!r} has {total} PUs", "at most 65536 are supported")

    has_numa = bool(machine_memory) or any(lv.type == "NUMANode" or lv.memory for lv in levels)
    if not has_numa:
        machine_memory = [{"memory": IMPLICIT_NODE_MEMORY}]

    pu_level = levels[-1]
    pu_indexes = pu_level.attrs.get("indexes")
    if pu_indexes is not None and sorted(pu_indexes) != list(range(total)):
        raise UsageError(f"PU indexes in {desc!r} must be a permutation of 0..{total - 1}")

    raw_nodes: list[RawNode] = []
    pus: list[RawPU] = []
    l3_sizes: dict = {}

    def new_node(attrs: dict, with_cpus: bool, package: int | None) -> int:
        nid = len(raw_nodes)
        memory = attrs.get("memory", 0)
        raw_nodes.append(RawNode(nid, memory, (), package, None if with_cpus else "memory"))
        return nid

    ctx: dict = {"counters": [0] * len(levels)}
    for j, attrs in enumerate(machine_memory):
        nid = new_node(attrs, j == 0, None)
        if j == 0:
            ctx["node"] = nid
    # depth-first over the levels with an explicit stack (any number of levels, no recursion);
    # objects are numbered per level in the order hwloc numbers them
    todo: list[tuple[int, dict, int]] = [(0, ctx, 0)]  # (level, parent's context, which child next)
    while todo:
        depth, parent, i = todo.pop()
        lv = levels[depth]
        if i >= lv.count:
            continue
        todo.append((depth, parent, i + 1))  # the next sibling, after this one's subtree
        c = dict(parent)
        idx = c["counters"][depth]
        c["counters"][depth] += 1
        if lv.type == "Package":
            c["package"] = idx
        elif lv.type == "NUMANode":  # as hwloc: a NUMANode level defaults to 1 GiB per node
            c["node"] = new_node({"memory": IMPLICIT_NODE_MEMORY} | lv.attrs, True, c.get("package"))
        elif lv.type == "L3Cache":
            c["l3"] = ("l3", idx)
            l3_sizes[c["l3"]] = lv.attrs.get("size", DEFAULT_L3)
        elif lv.type == "Core":
            c["core"] = ("core", idx)
        elif lv.type == "PU":
            cpu = pu_indexes[idx] if pu_indexes is not None else idx
            core = c.get("core", ("pu", idx))
            if "node" not in c:
                raise UsageError(
                    f"synthetic description {desc!r} has PUs outside any NUMA node",
                    "attach [NUMANode] to a level above the PUs, or to none at all",
                )
            pus.append(RawPU(cpu, c.get("package", 0), core, core[1], c["node"], c.get("l3")))
            continue
        for j, attrs in enumerate(lv.memory):
            nid = new_node(attrs, j == 0, c.get("package"))
            if j == 0:
                c["node"] = nid
        todo.append((depth + 1, c, 0))
    return build(pus, raw_nodes, distances=None, l3_sizes=l3_sizes, source=f"synthetic:{desc}")
