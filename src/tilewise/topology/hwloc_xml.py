"""hwloc XML (``lstopo --of xml``), the interchange format: import (hwloc 2.x, and 1.x trees) and export.

Export writes hwloc 2.x XML that ``lstopo --input FILE`` accepts: Machine > Package > (Group per
NUMA node when a package holds several) > L3Cache > Core > PU, or, where one L3 holds several
nodes (sub-NUMA clustering), Package > L3Cache > Group per node > Core > PU as hwloc writes it;
NUMA nodes as memory children,
CPU-less memory nodes attached to the Machine, the SLIT as a ``distances2`` matrix, and measured
CPU-pair matrices (latency, bandwidth) as extra named ``distances2`` matrices over PUs.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

from tilewise.fsutil import atomic_write
from tilewise import cpulist
from tilewise.cpulist import is_number as _digits
from tilewise.errors import UsageError
from tilewise.topology.build import RawNode, RawPU, build
from tilewise.topology.model import Topology

# hwloc_distances_kind_e bits
KIND_FROM_OS, KIND_FROM_USER, KIND_LATENCY, KIND_BANDWIDTH = 1, 2, 4, 8
CPULESS_SUBTYPES = {"CXL-DRAM", "CXL-NVM", "NVM", "HBM", "MCDRAM", "SPM", "GPUMemory", "DAX"}
SUBTYPE_OF_KIND = {"cxl": "CXL-DRAM", "hbm": "HBM", "pmem": "NVM"}
KIND_OF_SUBTYPE = {"CXL-DRAM": "cxl", "CXL-NVM": "cxl", "HBM": "hbm", "MCDRAM": "hbm", "NVM": "pmem"}
MEASURE_PREFIX = "tilewise:"
L3_PIECE_INFO = "tilewise:l3"  # marks the pieces of one L3 that partly overlaps several nodes
MEASURE_SCALE = 1000  # distances2 holds integers: measured values are stored in thousandths


def _infos(obj: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}


def _type(obj: ET.Element) -> str:
    t = obj.get("type", "")
    if t == "Socket":
        return "Package"
    if t == "Cache":  # hwloc 1.x
        return f"L{obj.get('depth', '0')}Cache"
    return t


def _is_cpuless(node: ET.Element) -> bool:
    infos = _infos(node)
    if infos.get("tilewise:cpuless") == "1":
        return True
    return node.get("subtype", infos.get("subtype", "")) in CPULESS_SUBTYPES


def _int(obj: ET.Element, attr: str, default: int | None, where: str, *, limit: int = 1 << 62) -> int:
    """A non-negative integer attribute; a missing one is default, a malformed one an error."""
    raw = obj.get(attr)
    if raw is None or (raw.strip() == "" and default is not None):
        if default is None:
            raise UsageError(f"{where}: {_type(obj) or 'an object'} without {attr}", "produce it with `lstopo --of xml FILE`")
        return default
    text = raw.strip()
    if not _digits(text) or len(text) > 20 or int(text) > limit:
        raise UsageError(f"{where}: {_type(obj) or 'an object'} has a malformed {attr}={raw[:40]!r}",
                         "expected a non-negative integer; produce the file with `lstopo --of xml FILE`")
    return int(text)


def _index(obj: ET.Element, attr: str, default: int | None, where: str) -> int:
    return _int(obj, attr, default, where, limit=cpulist.MAX_ID - 1)


def load(path: str | os.PathLike, *, text: str | None = None) -> Topology:
    source = str(path)
    try:
        root = ET.fromstring(text) if text is not None else ET.parse(path).getroot()
    except FileNotFoundError:
        raise UsageError(f"topology file {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"topology file {path} is a directory", "give sysfs:<dir> for a saved sysfs copy") from None
    except (ET.ParseError, OSError, ValueError, UnicodeError) as e:
        raise UsageError(f"{path} is not valid hwloc XML: {e}", "produce it with `lstopo --of xml FILE`") from None
    if root.tag != "topology":
        raise UsageError(f"{path} is not hwloc XML (root element <{root.tag}>)", "produce it with `lstopo --of xml FILE`")
    machine = root.find("object")
    if machine is None:
        raise UsageError(f"{path} holds no objects", "produce it with `lstopo --of xml FILE`")

    pus: list[RawPU] = []
    nodes: dict[int, RawNode] = {}
    l3_sizes: dict = {}
    gp_to_os: dict[str, int] = {}
    cpuless_nodes: set[int] = set()
    packages_with_memory = _packages_have_memory(machine)

    def add_node(obj: ET.Element, cpuless: bool, package: int | None) -> int:
        nid = _index(obj, "os_index", len(nodes), f"{path}: NUMANode")
        if nid in nodes:
            raise UsageError(f"{path}: two NUMA nodes with os_index {nid}")
        mem = _int(obj, "local_memory", 0, f"{path}: NUMANode P#{nid}")
        kind = KIND_OF_SUBTYPE.get(obj.get("subtype", _infos(obj).get("subtype", "")))
        if cpuless:
            cpuless_nodes.add(nid)
            kind = kind or "memory"
        nodes[nid] = RawNode(nid, mem, (), package, kind)
        if obj.get("gp_index"):
            gp_to_os[obj.get("gp_index")] = nid
        return nid

    def visit(obj: ET.Element, ctx: dict) -> list[ET.Element]:
        """Record obj (ctx is its own copy) and return the children to visit under it."""
        typ = _type(obj)
        children = [c for c in obj if c.tag == "object"]
        if typ == "Package":
            ctx["package"] = _index(obj, "os_index", 0, f"{path}: Package")
        # hwloc 2.x: NUMA nodes are memory children (possibly under MemCache objects).
        mem_children = []
        stack = list(reversed(children))
        while stack:
            c = stack.pop()
            if _type(c) == "NUMANode" and not any(_type(g) not in ("NUMANode",) for g in c if g.tag == "object"):
                mem_children.append(c)
            elif _type(c) == "MemCache":
                stack.extend(reversed([g for g in c if g.tag == "object"]))
        if mem_children:
            has_cpu_children = any(_type(c) not in ("NUMANode", "MemCache", "Bridge", "PCIDev", "OSDev", "Misc") for c in children)
            # Memory attached to the Machine while packages hold their own nodes is CPU-less (CXL).
            cpu_node_taken = not has_cpu_children or (typ == "Machine" and packages_with_memory)
            for m in sorted(mem_children, key=lambda m: _index(m, "os_index", 0, f"{path}: NUMANode")):
                cpuless = cpu_node_taken or _is_cpuless(m)
                nid = add_node(m, cpuless, ctx.get("package"))
                if not cpuless:
                    ctx["node"] = nid
                    cpu_node_taken = True
        if typ == "NUMANode" and obj not in mem_children and any(_type(c) != "NUMANode" for c in children):
            ctx["node"] = add_node(obj, False, ctx.get("package"))  # hwloc 1.x NUMANode level
        if typ == "L3Cache" and obj.get("cache_type", "0") in ("0", "1"):
            piece = _infos(obj).get(L3_PIECE_INFO)
            key = ("l3", id(obj)) if piece is None else ("l3-piece", piece)
            ctx["l3"] = key
            l3_sizes[key] = _int(obj, "cache_size", 0, f"{path}: L3Cache")
        if typ == "Core":
            ctx["core"] = ("core", id(obj))
            ctx["core_os"] = _index(obj, "os_index", 0, f"{path}: Core")
        if typ == "PU":
            cpu = _index(obj, "os_index", None, f"{path}: PU")
            if "node" not in ctx:
                raise UsageError(f"{path}: PU P#{cpu} has no NUMA node above it", "is this hwloc 2.x XML?")
            core = ctx.get("core", ("pu", cpu))
            pus.append(RawPU(cpu, ctx.get("package", 0), core, ctx.get("core_os", cpu), ctx["node"], ctx.get("l3")))
            return []
        return [c for c in children if c not in mem_children]

    # depth-first with an explicit stack: any nesting depth, no recursion
    todo: list[tuple[ET.Element, dict]] = [(machine, {})]
    while todo:
        obj, ctx = todo.pop()
        ctx = dict(ctx)
        for c in reversed(visit(obj, ctx)):
            todo.append((c, ctx))
    if not pus:
        raise UsageError(f"{path} describes no PUs", "produce it with `lstopo --of xml FILE`")
    seen: set[int] = set()
    for p in pus:
        if p.cpu in seen:
            raise UsageError(f"{path}: two PUs with os_index {p.cpu}", "produce it with `lstopo --of xml FILE`")
        seen.add(p.cpu)

    allowed = None
    if machine.get("allowed_cpuset"):
        allowed = cpulist.parse_mask(machine.get("allowed_cpuset"), what=f"{path} allowed_cpuset")

    node_ids = sorted(nodes)
    distances = None
    measurements: dict = {}
    for d in root.iter("distances2"):
        where = f"{path}: distances2 matrix {d.get('name', '')!r}".replace(" ''", "")
        indexes = [x for x in (d.findtext("indexes") or "").split()]
        words = " ".join(e.text or "" for e in d.findall("u64values")).split()
        if not all(_digits(w) and len(w) <= 20 for w in words):
            raise UsageError(f"{where}: values must be non-negative integers")
        values = [int(v) for v in words]
        n = _int(d, "nbobjs", 0, where)
        if len(indexes) != n or len(values) != n * n:
            raise UsageError(f"{where}: malformed ({len(indexes)} indexes, {len(values)} values for {n} objects)")
        rows = [values[i * n:(i + 1) * n] for i in range(n)]
        name = d.get("name", "")
        if d.get("type") == "NUMANode" and not name.startswith(MEASURE_PREFIX):
            try:
                ids = [gp_to_os[i] if d.get("indexing") == "gp" else int(i) for i in indexes]
            except (KeyError, ValueError):
                raise UsageError(f"{where}: indexes {' '.join(indexes)[:60]!r} do not name NUMA nodes") from None
            if sorted(ids) == node_ids:
                pos = {nid: k for k, nid in enumerate(ids)}
                distances = [[rows[pos[a]][pos[b]] for b in node_ids] for a in node_ids]
        elif name.startswith(MEASURE_PREFIX) and d.get("type") == "PU":
            key = name[len(MEASURE_PREFIX):]
            if not all(_digits(i) and int(i) in seen for i in indexes) or len(set(indexes)) != len(indexes):
                raise UsageError(f"{where}: indexes must be distinct PUs of this topology")
            measurements[key] = {
                "cpus": [int(i) for i in indexes],
                "values": [[v / MEASURE_SCALE for v in r] for r in rows],
            }
    return build(
        pus, list(nodes.values()), distances=distances, l3_sizes=l3_sizes, source=source,
        allowed_cpus=allowed, measurements=measurements,
    )


def _packages_have_memory(machine: ET.Element) -> bool:
    """True when a NUMANode lies somewhere below a Package (one pass over the tree, any depth)."""
    todo = [(machine, False)]
    while todo:
        obj, in_pkg = todo.pop()
        typ = _type(obj)
        if in_pkg and typ == "NUMANode":
            return True
        below = in_pkg or typ == "Package"
        todo.extend((c, below) for c in obj if c.tag == "object")
    return False


# ---- export ---------------------------------------------------------------------------------

def dumps(t: Topology) -> str:
    gp = iter(range(1, 1 << 30))
    all_cpus = t.pus
    all_nodes = [n.id for n in t.numa_nodes]

    def obj(parent: ET.Element | None, typ: str, cpus, nodeset, **attrs) -> ET.Element:
        a = {"type": typ}
        a.update({k: str(v) for k, v in attrs.items() if v is not None})
        a["cpuset"] = a["complete_cpuset"] = cpulist.format_mask(cpus)
        a["nodeset"] = a["complete_nodeset"] = cpulist.format_mask(nodeset)
        a["gp_index"] = str(next(gp))
        return ET.Element("object", a) if parent is None else ET.SubElement(parent, "object", a)

    root = ET.Element("topology", {"version": "2.0"})
    machine = obj(None, "Machine", all_cpus, all_nodes, os_index=0)
    machine.set("allowed_cpuset", cpulist.format_mask(t.allowed_cpus if t.allowed_cpus is not None else all_cpus))
    machine.set("allowed_nodeset", cpulist.format_mask(all_nodes))
    root.append(machine)
    ET.SubElement(machine, "info", {"name": "Backend", "value": "tilewise"})
    ET.SubElement(machine, "info", {"name": "tilewise:source", "value": t.source})

    def mem_child(parent: ET.Element, node, cpus) -> None:
        sub = SUBTYPE_OF_KIND.get(node.kind)
        m = obj(parent, "NUMANode", cpus, [node.id], os_index=node.id, subtype=sub, local_memory=node.memory_bytes or None)
        if node.cpuless:
            ET.SubElement(m, "info", {"name": "tilewise:cpuless", "value": "1"})
            ET.SubElement(m, "info", {"name": "tilewise:kind", "value": node.kind})

    def l3_obj(parent: ET.Element, d, cpus, nodes) -> ET.Element:
        le = obj(parent, "L3Cache", cpus, nodes, cache_size=d.size_bytes, depth=3,
                 cache_linesize=64, cache_associativity=0, cache_type=0)
        if tuple(cpus) != d.cpus:  # a piece of an L3 that hwloc's tree cannot nest: rejoined on import
            ET.SubElement(le, "info", {"name": L3_PIECE_INFO, "value": str(d.id)})
        return le

    def core_objs(parent: ET.Element, cores) -> None:
        for c in cores:
            ce = obj(parent, "Core", c.pus, [c.numa_node], os_index=c.os_index)
            for p in c.pus:
                obj(ce, "PU", [p], [c.numa_node], os_index=p)

    for cpuless in [n for n in t.numa_nodes if n.cpuless]:
        mem_child(machine, cpuless, all_cpus)
    for pkg in t.packages:
        pcores = [c for c in t.cores if c.package == pkg.id]
        pnodes = sorted({c.numa_node for c in pcores})
        pe = obj(machine, "Package", pkg.cpus, pnodes, os_index=pkg.id)
        for nodes, l3s in t.locality_blocks:
            bcores = [c for c in pcores if c.numa_node in nodes]
            if not bcores:
                continue
            if t.l3_known and len(l3s) == 1 and len(nodes) > 1:
                # One L3 holding several nodes (sub-NUMA clustering): as hwloc, the nodes go under the
                # cache, each in a Group with its cores: Package > L3Cache > Group > NUMANode + Cores.
                d = t.l3_by_id[l3s[0]]
                le = l3_obj(pe, d, d.cpus, list(nodes))
                for nid in nodes:
                    ncores = [c for c in bcores if c.numa_node == nid]
                    ge = obj(le, "Group", t.node_by_id[nid].cpus, [nid], kind=1001, subkind=0)
                    mem_child(ge, t.node_by_id[nid], t.node_by_id[nid].cpus)
                    core_objs(ge, ncores)
                continue
            # Nodes holding their L3s: Package > (Group per node when several) > NUMANode + L3Cache > Cores.
            for nid in nodes:
                node = t.node_by_id[nid]
                ncores = [c for c in bcores if c.numa_node == nid]
                if not ncores:
                    continue
                parent = pe
                if len(pnodes) > 1:
                    parent = obj(pe, "Group", node.cpus, [nid], kind=1001, subkind=0)
                mem_child(parent, node, node.cpus)
                for lid in sorted({c.l3 for c in ncores}):
                    lcores = [c for c in ncores if c.l3 == lid]
                    le = parent
                    if t.l3_known:
                        le = l3_obj(parent, t.l3_by_id[lid], sorted(p for c in lcores for p in c.pus), [nid])
                    core_objs(le, lcores)

    def matrix(name: str | None, typ: str, kind: int, ids, rows) -> None:
        n = len(ids)
        attrs = {"type": typ, "nbobjs": str(n), "kind": str(kind), "indexing": "os"}
        if name:
            attrs["name"] = name
        de = ET.SubElement(root, "distances2", attrs)
        # hwloc's "length" is the length of the element's text, not a count
        text = " ".join(str(i) for i in ids) + " "
        ET.SubElement(de, "indexes", {"length": str(len(text))}).text = text
        flat = [int(v) for r in rows for v in r]
        for off in range(0, len(flat), 256):  # hwloc writes values in chunks
            chunk = flat[off:off + 256]
            text = " ".join(str(v) for v in chunk) + " "
            ET.SubElement(de, "u64values", {"length": str(len(text))}).text = text

    matrix(None, "NUMANode", KIND_FROM_OS | KIND_LATENCY, all_nodes, t.distances)
    for key, m in sorted(t.measurements.items()):
        kind = KIND_FROM_USER | (KIND_BANDWIDTH if "bandwidth" in key else KIND_LATENCY)
        rows = [[round(max(v, 0) * MEASURE_SCALE) for v in r] for r in m["values"]]
        matrix(MEASURE_PREFIX + key, "PU", kind, m["cpus"], rows)

    ET.indent(root, space="  ")
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n' + body + "\n"


def save(t: Topology, path: str | os.PathLike) -> None:
    try:
        atomic_write(path, dumps(t))
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
