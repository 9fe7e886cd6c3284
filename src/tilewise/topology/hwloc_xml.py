"""hwloc XML (``lstopo --of xml``), the interchange format: import (hwloc 1.x, 2.x and 3.0) and export.

Import reads what hwloc reads:
- 2.x/3.0: NUMA nodes are memory children, possibly below memory-side caches (``MemCache``, kept
  as ``Topology.memory_caches``); ``distances2`` matrices whose object list and values hwloc
  splits over several ``<indexes>``/``<u64values>`` elements (10 per element); ``memattr``
  values (kept as ``Topology.memattrs``); 3.0's ``id="objN"`` object names.
- 1.x: NUMANode, Socket and Cache objects as tree levels, ``<distances>`` attached to the root
  (``latency`` values times ``latency_base``), and files without NUMA nodes or nodesets (hwloc then
  adds one node holding everything).
- Restricted exports (a container whose allowed memory excludes its CPUs' node; ``--restrict``)
  have PUs with no NUMA node above them: hwloc shows them without one; tilewise puts them in an
  invented node named by their ``complete_nodeset`` and says so in ``Topology.notes``.
- Without Package or Core objects, one package and one core per PU are invented and marked.
- PCIDev objects of GPUs, accelerators and NICs (below Bridges, with their OSDevs: cuda0, nvml0,
  eth0) become the model's devices (topology/pci.py), on the node of the object they hang from.

Export writes hwloc 2.x XML that ``lstopo --input FILE`` accepts: Machine > Package > (Group per
NUMA node when a package holds several) > L3Cache > Core > PU, or, where one L3 holds several
nodes (sub-NUMA clustering), Package > L3Cache > Group per node > Core > PU as hwloc writes it;
NUMA nodes as memory children (below their memory-side caches), CPU-less memory nodes attached to
the Machine, the SLIT as a ``distances2`` matrix written as hwloc writes it (10 indexes or values
per element; left out when it is the default one), memory attributes, and measured CPU-pair
matrices (latency, bandwidth) as extra named ``distances2`` matrices over PUs, and the devices as
host Bridge > PCIDev > OSDev under their node's object (the Machine without a node). Invented objects
are not written (a re-import invents them again), except invented NUMA nodes, marked with an info.
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections import Counter

from tilewise import cpulist
from tilewise.cpulist import is_number as _digits
from tilewise.errors import UsageError
from tilewise.fsutil import atomic_write
from tilewise.topology import pci
from tilewise.topology.build import RawMemCache, RawNode, RawPU, build, note
from tilewise.topology.model import Topology, human_bytes

# hwloc_distances_kind_e bits
KIND_FROM_OS, KIND_FROM_USER, KIND_LATENCY, KIND_BANDWIDTH = 1, 2, 4, 8
MEMATTR_NEED_INITIATOR = 4  # hwloc_memattr_flag_e
CPULESS_SUBTYPES = {"CXL-DRAM", "CXL-NVM", "NVM", "HBM", "MCDRAM", "SPM", "GPUMemory", "DAX"}
SUBTYPE_OF_KIND = {"cxl": "CXL-DRAM", "hbm": "HBM", "pmem": "NVM"}
KIND_OF_SUBTYPE = {"CXL-DRAM": "cxl", "CXL-NVM": "cxl", "HBM": "hbm", "MCDRAM": "hbm", "NVM": "pmem"}
MEASURE_PREFIX = "tilewise:"
L3_PIECE_INFO = "tilewise:l3"  # marks the pieces of one L3 that partly overlaps several nodes
INVENTED_INFO = "tilewise:invented"  # marks a NUMA node the model invented (PUs without a node)
MEASURE_SCALE = 1000  # distances2 holds integers: measured values are stored in thousandths
PER_ELEMENT = 10  # hwloc writes 10 indexes or values per <indexes>/<u64values> element
V1_SCALE = 1000  # hwloc's scale for non-integer 1.x distances (HWLOC_XML_V1DIST_SCALE)

# the object types hwloc's XML import knows (any other is an error there)
_NORMAL = {"Machine", "Package", "Die", "Group", "Core", "PU", "L1Cache", "L2Cache", "L3Cache", "L4Cache",
           "L5Cache", "L1iCache", "L2iCache", "L3iCache"}
_MEMORY = {"NUMANode", "MemCache"}
_IO = {"Bridge", "PCIDev", "OSDev", "Misc"}
_ALIASES = {"Socket": "Package", "Tile": "Group", "Module": "Group", "System": "Machine"}


def _infos(obj: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}


def _type(obj: ET.Element) -> str:
    t = obj.get("type", "")
    if t == "Cache":  # hwloc 1.x: the type from depth (and cache_type)
        depth = (obj.get("depth") or "").strip()
        if depth not in ("1", "2", "3", "4", "5"):
            return "Group"  # no cache type: hwloc leaves it out (its children stay), as tilewise does a Group
        return f"L{depth}{'i' if (obj.get('cache_type') or '').strip() == '2' and depth in '123' else ''}Cache"
    return _ALIASES.get(t, t)


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


_MASKS: dict[str, tuple[int, ...]] = {}  # bitmaps repeat (memattr initiators, nodesets): decode each once


def _mask(text: str | None, what: str) -> tuple[int, ...] | None:
    """An hwloc bitmap ("0x0000ffff,,0x0000ffff": 32-bit words, most significant first, empty for
    zero); None when absent or infinite ("0xf...f")."""
    if text is None or "f...f" in text:
        return None
    if text in _MASKS:
        return _MASKS[text]
    words = text.strip().split(",")
    if len(words) * 32 > cpulist.MAX_ID:
        raise UsageError(f"{what} is longer than any machine's bitmap")
    ids: list[int] = []
    try:
        for k, w in enumerate(reversed(words)):  # word k holds bits 32k..32k+31
            w = w.strip()
            v = int(w[2:] if w[:2].lower() == "0x" else w or "0", 16) if w not in ("", "0x") else 0
            if v >> 32:
                raise ValueError
            while v:
                low = v & -v
                ids.append(32 * k + low.bit_length() - 1)
                v ^= low
    except ValueError:
        raise UsageError(f"{what}: malformed bitmap {text[:40]!r}", "hwloc writes 0x-prefixed 32-bit hex words") from None
    out = tuple(ids)
    if len(_MASKS) < 4096:
        _MASKS[text] = out
    return out


def _version(root: ET.Element, path) -> tuple[int, str]:
    raw = root.get("version")
    if raw is None:
        return 1, "1.x"
    m = re.fullmatch(r"\s*(\d{1,3})(?:\.(\d{1,3}))?\s*", raw)
    if not m:
        raise UsageError(f"{path}: <topology version={raw[:20]!r}> is not an hwloc XML version",
                         "hwloc writes version=\"2.0\" or \"3.0\" (none for 1.x); produce it with `lstopo --of xml FILE`")
    major = int(m.group(1))
    label = f"{major}.{m.group(2) or '0'}"
    if major > 3 or major < 1:
        raise UsageError(f"{path} is hwloc {label} XML, which tilewise cannot read",
                         "tilewise reads hwloc 1.x, 2.x and 3.0 XML; re-export it with an hwloc 2.x `lstopo --of xml FILE`")
    return major, label


class _Reader:
    """One pass over the object tree (explicit stack: any depth), collecting the flat facts."""

    def __init__(self, path, major: int, label: str) -> None:
        self.path, self.major, self.label = path, major, label
        self.where = f"{path} (hwloc {label} XML)"
        self.pus: list[RawPU] = []
        self.nodes: dict[int, RawNode] = {}
        self.node_order: list[int] = []  # document order (1.x distances follow it)
        self.l3_sizes: dict = {}
        self.caches: list[RawMemCache] = []
        self.gp: dict[str, ET.Element] = {}
        self.gp_node: dict[str, int] = {}
        self.orphans: list[tuple[int, str | None]] = []  # PUs without a NUMA node: (cpu, complete_nodeset)
        self.saw_package = self.saw_core = False
        self.unknown_packages = 0
        self.shared_packages: set[str] = set()  # os_index values several Package objects carry
        self.devices: list = []  # PciDevice, in document order

    def err(self, what: str, hint: str = "") -> UsageError:
        return UsageError(f"{self.where}: {what}", hint or "produce the file with `lstopo --of xml FILE`")

    def name(self, obj: ET.Element) -> str | None:
        """Record the object's global index (gp_index; 3.0's id="objN") for distances and memattrs."""
        gp = obj.get("gp_index")
        if gp is None and (ident := obj.get("id", "")).startswith("obj"):
            gp = ident[3:]
        if gp is not None:
            gp = gp.strip()
            self.gp[gp] = obj
        return gp

    def add_node(self, obj: ET.Element, cpuless: bool, package) -> int:
        nid = _index(obj, "os_index", len(self.nodes), f"{self.where}: NUMANode")
        if nid in self.nodes:
            raise self.err(f"two NUMANode objects with os_index {nid}",
                           "each NUMA node appears once in an hwloc export; the file was edited or merged")
        mem = _int(obj, "local_memory", 0, f"{self.where}: NUMANode P#{nid}")
        infos = _infos(obj)
        kind = KIND_OF_SUBTYPE.get(obj.get("subtype", infos.get("subtype", "")))
        if cpuless:
            kind = kind or infos.get("tilewise:kind") or ("dram" if self._has_cpus_elsewhere(obj) else "memory")
        # its CPUs left out of this export (allowed elsewhere, restricted here): complete_cpuset keeps them
        hidden = (_mask(obj.get("complete_cpuset"), f"{self.where}: NUMANode P#{nid} complete_cpuset") or ()
                  if cpuless and self._has_cpus_elsewhere(obj) else ())
        self.nodes[nid] = RawNode(nid, mem, (), package, kind, invented=infos.get(INVENTED_INFO) == "1",
                                  hidden_cpus=tuple(hidden))
        self.node_order.append(nid)
        self.elem_node[id(obj)] = nid
        gp = self.name(obj)
        if gp is not None:
            self.gp_node[gp] = nid
        if self.major >= 2:
            for c in obj:
                if c.tag == "object":
                    raise self.err(f"NUMANode P#{nid} has a {c.get('type', '')[:20]} child: in hwloc {self.label} XML "
                                   "a NUMA node is a leaf (a memory child)",
                                   "hwloc rejects it too; only hwloc 1.x files (no version attribute) nest objects under NUMA nodes")
        return nid

    @staticmethod
    def _has_cpus_elsewhere(obj: ET.Element) -> bool:
        """A node whose CPUs are outside the allowed set (empty cpuset, non-empty complete_cpuset)."""
        cpus, complete = obj.get("cpuset", ""), obj.get("complete_cpuset", "")
        return bool(complete) and complete.strip(",0x") != "" and cpus.strip(",0x") == ""

    def memory_below(self, top: ET.Element, ctx: dict) -> list[ET.Element]:
        """The NUMA nodes of a memory child (a NUMANode, or MemCache(s) in front of some, any depth);
        each MemCache is recorded with the nodes below it once those are read. ctx: the facts of
        the object they hang from (whether it has a nodeset)."""
        found: list[ET.Element] = []
        todo = [(top, ctx)]
        while todo:
            obj, above = todo.pop()
            self.check_sets(obj, dict(above))
            if _type(obj) == "NUMANode":
                found.append(obj)
                continue
            below = [c for c in obj if c.tag == "object"]
            bad = [c for c in below if _type(c) not in _MEMORY]
            if bad:
                raise self.err(f"MemCache with a {bad[0].get('type', '')[:20]} child",
                               "a memory-side cache holds only MemCache and NUMANode objects; hwloc rejects it too")
            self._pending_caches.append((obj, _leaves(obj)))
            todo.extend((c, {"has_nodeset": obj.get("nodeset") is not None}) for c in reversed(below))
        return found

    def check_sets(self, obj: ET.Element, ctx: dict) -> None:
        """What hwloc's XML import checks of every object before it accepts a file (topology-xml.c):
        a cpuset on all but I/O and Misc objects, a nodeset on NUMA nodes and only below an object
        that has one, a cache's depth and cache_type matching its type. hwloc rejects a file that
        breaks one, and so does tilewise (one line naming the object). ctx["has_nodeset"] is the
        parent's (absent at the root), and is set to obj's for its children."""
        typ = _type(obj)
        label = f"{typ} P#{(obj.get('os_index') or '?').strip()[:12]}"
        parent_has = ctx.get("has_nodeset")
        has = obj.get("nodeset") is not None
        ctx["has_nodeset"] = has
        if self.major < 2 and typ != "Group":  # hwloc 1.x files: both sets of a kind or neither (a Group is left out)
            for a, b in (("cpuset", "complete_cpuset"), ("nodeset", "complete_nodeset"), ("cpuset", "nodeset")):
                if obj.get(a) is None and obj.get(b) is not None:
                    raise self.err(f"{label} has a {b} attribute but no {a}",
                                   "hwloc rejects it too; produce the file with `lstopo --of xml FILE`")
                if obj.get(b) is None and obj.get(a) is not None and b != "nodeset":
                    raise self.err(f"{label} has a {a} attribute but no {b}",
                                   "hwloc rejects it too; produce the file with `lstopo --of xml FILE`")
        if obj.get("cpuset") is None and not (typ == "Group" and self.major < 2 and obj.get("complete_cpuset")):
            raise self.err(f"{label} has no cpuset attribute",
                           "hwloc rejects it too (every object but I/O and Misc ones has one); "
                           "produce the file with `lstopo --of xml FILE`")
        if typ == "NUMANode" and not has:
            raise self.err(f"{label} has no nodeset attribute",
                           "hwloc rejects it too (a NUMA node's nodeset names it); produce the file with `lstopo --of xml FILE`")
        if has and parent_has is False:
            raise self.err(f"{label} has a nodeset while the object above it has none",
                           "hwloc rejects it too (nodesets go from the Machine down); produce the file with `lstopo --of xml FILE`")
        m = re.fullmatch(r"L(\d)(i?)Cache", typ)
        if m and obj.get("type") != "Cache":  # 1.x "Cache" objects take their type from depth and cache_type
            depth, ctype = (obj.get("depth") or "").strip(), (obj.get("cache_type") or "0").strip()
            if depth != m.group(1) or (ctype == "2") != bool(m.group(2)):
                raise self.err(f"{typ} with depth={obj.get('depth', '')[:10]!r} and cache_type={ctype[:10]!r}",
                               "hwloc rejects a cache whose depth or cache type (2: instruction) contradicts its type")

    def walk(self, machine: ET.Element, packages_with_memory: bool) -> None:
        self._pending_caches: list[tuple[ET.Element, list[ET.Element]]] = []
        self.elem_node: dict[int, int] = {}
        todo: list[tuple[ET.Element, dict]] = [(machine, {})]
        while todo:
            obj, ctx = todo.pop()
            ctx = dict(ctx)
            children = self.visit(obj, ctx, packages_with_memory)
            for c in reversed(children):
                todo.append((c, ctx))
        for cache, nodes in self._pending_caches:
            ids = tuple(self.elem_node[id(n)] for n in nodes if id(n) in self.elem_node)
            if ids:
                self.caches.append(RawMemCache(ids, _int(cache, "cache_size", 0, f"{self.where}: MemCache"),
                                               _int(cache, "depth", 1, f"{self.where}: MemCache")))

    def visit(self, obj: ET.Element, ctx: dict, packages_with_memory: bool) -> list[ET.Element]:
        """Record obj (ctx is its own copy) and return the children to visit under it."""
        raw_type = obj.get("type", "")
        typ = _type(obj)
        if typ not in _NORMAL and typ not in _MEMORY and typ not in _IO:
            raise self.err(f"unknown object type {raw_type[:30]!r}",
                           "hwloc rejects it too; produce the file with `lstopo --of xml FILE`")
        if typ in _IO:
            if typ == "Bridge":
                return [c for c in obj if c.tag == "object"]
            if typ == "PCIDev":  # GPUs, accelerators, NICs (topology/pci.py); its OSDevs are read with it
                cpus = _mask(ctx.get("cpuset"), f"{self.where}: cpuset above PCIDev") or ()
                dev = pci.from_hwloc(obj, ctx.get("node"), cpus, self.where)
                if dev is not None:
                    self.devices.append(dev)
                return [c for c in obj if c.tag == "object" and _type(c) == "PCIDev"]  # behind a PCI switch function
            return []  # OS devices (read with their PCIDev), Misc
        self.name(obj)
        self.check_sets(obj, ctx)
        if obj.get("cpuset") is not None:
            ctx["cpuset"] = obj.get("cpuset")
        if obj.get("complete_nodeset"):
            ctx["complete_nodeset"] = obj.get("complete_nodeset")
        objects = [c for c in obj if c.tag == "object"]
        if typ == "Package":
            self.saw_package = True
            if obj.get("os_index") is None:
                self.unknown_packages += 1
                ctx["package"] = ("unknown", id(obj))  # hwloc's "P#?" (package_cpus grouping, s390)
            elif obj.get("os_index") in self.shared_packages:
                ctx["package"] = ("shared", _index(obj, "os_index", 0, f"{self.where}: Package"), id(obj))
            else:
                ctx["package"] = _index(obj, "os_index", 0, f"{self.where}: Package")
        if self.major >= 2:
            mem_children = [c for c in objects if _type(c) in _MEMORY]
            if mem_children:
                nodes: list[ET.Element] = []
                for m in mem_children:
                    nodes.extend(self.memory_below(m, ctx))
                has_cpu_children = any(_type(c) in _NORMAL for c in objects)
                # Memory attached to the Machine while packages hold their own nodes is CPU-less (CXL).
                cpu_node_taken = not has_cpu_children or (typ == "Machine" and packages_with_memory)
                for m in sorted(nodes, key=lambda m: _index(m, "os_index", 0, f"{self.where}: NUMANode")):
                    cpuless = cpu_node_taken or _is_cpuless(m)
                    nid = self.add_node(m, cpuless, ctx.get("package"))
                    if not cpuless:
                        ctx["node"] = nid
                        cpu_node_taken = True
                objects = [c for c in objects if _type(c) not in _MEMORY]
        elif typ == "NUMANode":  # hwloc 1.x: a tree level holding its CPUs' objects
            has_cpu_children = any(_type(c) in _NORMAL for c in objects)
            nid = self.add_node(obj, not has_cpu_children, ctx.get("package"))
            if has_cpu_children:
                ctx["node"] = nid
        if typ == "L3Cache" and obj.get("cache_type", "0").strip() in ("0", "1"):
            piece = _infos(obj).get(L3_PIECE_INFO) if obj.find("info") is not None else None
            key = ("l3", id(obj)) if piece is None else ("l3-piece", piece)
            ctx["l3"] = key
            self.l3_sizes[key] = _int(obj, "cache_size", 0, f"{self.where}: L3Cache")
        elif typ == "Core":
            self.saw_core = True
            ctx["core"] = ("core", id(obj))
            ctx["core_os"] = _index(obj, "os_index", 0, f"{self.where}: Core")
        elif typ == "PU":
            cpu = _index(obj, "os_index", None, f"{self.where}: PU")
            core = ctx.get("core")
            node = ctx.get("node")
            if node is None:
                node = -1 - len(self.orphans)  # placeholder until the invented nodes are known
                # its complete_nodeset, else the nearest one above it (its core's...)
                self.orphans.append((cpu, ctx.get("complete_nodeset") or obj.get("nodeset")))
            self.pus.append(RawPU(cpu, ctx.get("package"), core, ctx.get("core_os", cpu), node, ctx.get("l3")))
            return []
        return objects


def _leaves(cache: ET.Element) -> list[ET.Element]:
    """The NUMANode objects below a MemCache (any depth)."""
    return [e for e in cache.iter("object") if _type(e) == "NUMANode"]


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


def _numbers(elements, where: str, what: str) -> list[int]:
    words = " ".join(e.text or "" for e in elements).split()
    if not all(_digits(w) and len(w) <= 20 for w in words):
        raise UsageError(f"{where}: {what} must be non-negative integers")
    return [int(w) for w in words]


def load(path: str | os.PathLike, *, text: str | bytes | None = None) -> Topology:
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
    major, label = _version(root, path)
    machine = root.find("object")
    if machine is None:
        raise UsageError(f"{path} (hwloc {label} XML) holds no objects", "produce it with `lstopo --of xml FILE`")

    r = _Reader(path, major, label)
    # an os_index several Package objects carry (Itanium): each is a package of its own, with that index
    counts = Counter(o.get("os_index") for o in machine.iter("object") if _type(o) == "Package" and o.get("os_index"))
    r.shared_packages = {k for k, v in counts.items() if v > 1}
    r.walk(machine, _packages_have_memory(machine))
    where = r.where
    if not r.pus:
        raise UsageError(f"{where} describes no PUs", "produce it with `lstopo --of xml FILE`")
    seen: set[int] = set()
    for p in r.pus:
        if p.cpu in seen:
            raise UsageError(f"{where}: two PUs with os_index {p.cpu}", "each PU appears once in an hwloc export")
        seen.add(p.cpu)

    notes: list[dict] = []
    pus, nodes = _place_orphans(r, machine, notes)
    if not r.saw_package:
        notes.append(note("note", "the file has no Package objects: one package is invented (hwloc shows none)"))
    elif any(p.package is None for p in pus):
        notes.append(note("note", "some PUs are in no Package: one package is invented for them (hwloc shows none)"))
    if r.shared_packages:
        notes.append(note("note", f"Package os_index {', '.join(sorted(r.shared_packages, key=int))} is carried by "
                                  "several packages (Itanium): each is a package with that OS index, as hwloc shows "
                                  "them (numbered apart here)"))
    if r.unknown_packages:
        notes.append(note("note", f"{r.unknown_packages} package(s) without os_index: numbered after the others, "
                                  "OS index unknown (hwloc prints them without P#)"))
    pieces = {k for k in r.l3_sizes if k[0] == "l3-piece"}
    if pieces:
        notes.append(note("note", f"L3Cache objects marked {L3_PIECE_INFO} are pieces of {len(pieces)} L3 cache(s) "
                                  "that tilewise exported split by NUMA node: rejoined (hwloc shows the pieces)"))
    if any(p.core_key is None for p in pus):
        notes.append(note("note", "PUs without a Core above them: one core per PU is invented (hwloc shows no cores"
                                  + (" there)" if r.saw_core else ")")))

    allowed = _mask(machine.get("allowed_cpuset"), f"{where}: allowed_cpuset")
    allowed_nodes = _mask(machine.get("allowed_nodeset"), f"{where}: allowed_nodeset")
    invented = {n.id for n in nodes.values() if n.invented}
    marked = sorted(n for n in invented if n in r.nodes)
    if marked:
        notes.append(note("note", f"node(s) {cpulist.format(marked)} are marked {INVENTED_INFO}: an invented node "
                                  "tilewise exported (hwloc shows it as a real node)"))
    made = invented - set(r.nodes)  # invented here for PUs without a node: their memory is not allowed
    if allowed_nodes is not None and made:
        allowed_nodes = tuple(i for i in allowed_nodes if i not in made)
    elif allowed_nodes is None and made and r.nodes:
        allowed_nodes = tuple(sorted(r.nodes))
    if allowed is not None and set(allowed) & seen != seen:
        notes.append(note("note", f"the file marks CPUs {cpulist.format(sorted(seen - set(allowed)))} disallowed: "
                                  "hwloc hides them unless --disallowed, tilewise shows them and plans on the allowed ones"))

    node_ids = sorted(nodes)
    distances, dist_source, measurements = _distances(root, r, node_ids, invented, seen, notes)
    memattrs = _memattrs(root, r, where)
    return build(
        pus, list(nodes.values()), distances=distances, l3_sizes=r.l3_sizes, source=source,
        allowed_cpus=allowed, measurements=measurements, distances_source=dist_source,
        allowed_nodes=allowed_nodes, memory_caches=r.caches, memattrs=memattrs, notes=notes,
        devices=_devices(r, nodes, notes),
    )


def _devices(r: _Reader, nodes: dict, notes: list[dict]) -> list:
    """The PCI devices read, one per address (an edited file listing one twice: the first, noted)."""
    seen: dict[str, object] = {}
    for d in r.devices:
        if d.address in seen:
            notes.append(note("warning", f"two PCIDev objects with pci_busid {d.address}: the first is kept"))
            continue
        seen[d.address] = d
    unknown = [d for d in r.devices if d.numa_node is None]
    if unknown and len(nodes) > 1:
        notes.append(note("note", f"{len(unknown)} PCI device(s) ({', '.join(d.address for d in unknown)}) hang from an "
                                  "object spanning several NUMA nodes or carry no node: their NUMA node is unknown"))
    return list(seen.values())


def _place_orphans(r: _Reader, machine: ET.Element, notes: list[dict]) -> tuple[list[RawPU], dict[int, RawNode]]:
    """PUs with no NUMA node above them: hwloc 1.x files without NUMA get one node holding everything
    (as hwloc's core adds it); restricted exports get invented nodes named by the PUs' complete_nodeset."""
    nodes = dict(r.nodes)
    if not r.orphans:
        return r.pus, nodes
    if not nodes:
        if r.major >= 2:
            raise r.err("no NUMANode object", f"hwloc {r.label} XML needs at least one (hwloc rejects the file too); "
                                              "re-export it with `lstopo --of xml FILE`")
        mem = _int(machine, "local_memory", 0, f"{r.where}: Machine")
        nodes[0] = RawNode(0, mem, (), None, None, invented=True)
        notes.append(note("note", "the hwloc 1.x file has no NUMA node (a machine without NUMA): as hwloc, an "
                                  f"invented node P#0 holds every CPU ({human_bytes(mem)}, the Machine's memory)"))
        target = {i: 0 for i in range(len(r.orphans))}
    else:
        free = max(nodes) + 1
        target = {}
        for i, (cpu, mask) in enumerate(r.orphans):
            named = [n for n in (_mask(mask, f"{r.where}: PU P#{cpu} nodeset") or ()) if n not in nodes or nodes[n].invented]
            nid = named[0] if named else free
            if nid not in nodes:
                nodes[nid] = RawNode(nid, 0, (), None, None, invented=True)
            target[i] = nid
        made = sorted({n for n in target.values()})
        cpus = sorted(r.orphans[i][0] for i in target)
        notes.append(note("note", f"CPUs {cpulist.format(cpus)} have no NUMA node above them (a container's or "
                                  "--restrict export whose allowed memory excludes their node, or firmware whose node "
                                  "hwloc dropped for listing another node's CPUs): hwloc shows them "
                                  f"without one; tilewise puts them in invented node(s) {cpulist.format(made)} "
                                  "(named by their complete_nodeset), memory unknown and not allowed"))
    pus = [p if p.node >= 0 else RawPU(p.cpu, p.package, p.core_key, p.core_os_index, target[-1 - p.node], p.l3_key)
           for p in r.pus]
    return pus, nodes


def _distances(root: ET.Element, r: _Reader, node_ids: list[int], invented: set[int], pus: set[int], notes: list[dict]):
    """(NUMA matrix or None, its source, measured PU matrices) from distances2 (2.x/3.0) or root
    <distances> (1.x)."""
    distances = None
    source = None
    measurements: dict = {}
    real = [n for n in node_ids if n not in invented]
    if r.major < 2:
        return _v1_distances(r.node_order, root, r, notes), "firmware", measurements
    for d in root.iter("distances2"):
        where = f"{r.where}: distances2 {d.get('name', '')!r}".replace(" ''", "")
        missing = [a for a in ("nbobjs", "type", "indexing", "kind") if not (d.get(a) or "").strip()]
        if missing:
            raise UsageError(f"{where} has no {', '.join(missing)} attribute", "hwloc rejects such a matrix too; "
                             "produce the file with `lstopo --of xml FILE` or `hwloc-annotate`")
        n = _int(d, "nbobjs", 0, where)
        indexes = [x for e in d.findall("indexes") for x in (e.text or "").split()]
        values = _numbers(d.findall("u64values"), where, "values")
        if len(indexes) != n or len(values) != n * n:
            raise UsageError(
                f"{where}: {len(indexes)} indexes and {len(values)} values for nbobjs={n} "
                f"(over {len(d.findall('indexes'))} <indexes> and {len(d.findall('u64values'))} <u64values> elements)",
                f"a matrix of {n} objects has {n} indexes and {n * n} values; hwloc rejects the file too")
        if n < 2:
            continue  # as hwloc: a matrix of one object is ignored
        rows = [values[i * n:(i + 1) * n] for i in range(n)]
        name = d.get("name", "")
        kind = _int(d, "kind", 0, where)
        if d.get("type") == "NUMANode" and not name.startswith(MEASURE_PREFIX):
            if distances is not None or (kind & KIND_BANDWIDTH and not kind & KIND_LATENCY):
                continue  # the first latency matrix is the SLIT; bandwidth matrices are not distances
            try:
                ids = [r.gp_node[i] if d.get("indexing") == "gp" else int(i) for i in indexes]
            except (KeyError, ValueError):
                raise UsageError(f"{where}: indexes {' '.join(indexes)[:60]!r} do not name NUMA nodes",
                                 "indexing=\"os\" lists NUMANode os_index values") from None
            pos = {nid: k for k, nid in enumerate(ids)}
            if all(nid in pos for nid in real):  # nodes the file left out are dropped, as hwloc restricts it
                # an invented node has no row: 10 to itself, 20 to the others
                distances = [[rows[pos[a]][pos[b]] if a in pos and b in pos else (10 if a == b else 20)
                              for b in node_ids] for a in node_ids]
                source = "user" if kind & KIND_FROM_USER and not kind & KIND_FROM_OS else "firmware"
                if any(n not in pos for n in node_ids):
                    source = "partial"
                    notes.append(note("note", f"distances to invented node(s) {cpulist.format(sorted(invented))} "
                                              "are not in the file: 10/20 shown for them"))
            else:
                notes.append(note("note", f"{where.split(': ', 1)[1]} covers nodes "
                                          f"{cpulist.format(sorted(set(ids) & set(real)))} only: default distances shown"))
        elif name.startswith(MEASURE_PREFIX) and d.get("type") == "PU":
            key = name[len(MEASURE_PREFIX):]
            if not all(_digits(i) and int(i) in pus for i in indexes) or len(set(indexes)) != len(indexes):
                raise UsageError(f"{where}: indexes must be distinct PUs of this topology")
            measurements[key] = {
                "cpus": [int(i) for i in indexes],
                "values": [[v / MEASURE_SCALE for v in row] for row in rows],
            }
    return distances, source, measurements


def _v1_distances(order, root: ET.Element, r: _Reader, notes: list[dict]):
    """hwloc 1.x <distances> attached to the root: a matrix over the NUMA nodes in document order
    when nbobjs matches their number (as hwloc 2.x imports them); others are ignored, as hwloc."""
    machine = root.find("object")
    out = None
    for d in machine.findall("distances"):
        where = f"{r.where}: <distances>"
        n = _int(d, "nbobjs", 0, where)
        latencies = d.findall("latency")
        try:
            base = float(d.get("latency_base", "0"))
            values = [float(e.get("value", "")) * base for e in latencies]
        except ValueError:
            raise UsageError(f"{where}: latency values must be numbers", "hwloc rejects the file too") from None
        if not n or not base or not _int(d, "relative_depth", 0, where):
            continue
        if len(values) != n * n:
            raise UsageError(f"{where}: {len(values)} <latency> values for nbobjs={n}",
                             f"a matrix of {n} objects has {n * n} values; hwloc rejects the file too")
        if n < 2 or n != len(order) or out is not None:
            continue
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise UsageError(f"{where}: latency values must be finite and non-negative")
        if all(abs(v - round(v)) < 0.001 for v in values):
            ints = [int(v + 0.5) for v in values]
        else:
            ints = [int(V1_SCALE * v) for v in values]
            notes.append(note("note", f"the hwloc 1.x distances are not integers: multiplied by {V1_SCALE}, as hwloc does"))
        pos = {nid: k for k, nid in enumerate(order)}
        ids = sorted(order)
        out = [[ints[pos[a] * n + pos[b]] for b in ids] for a in ids]
    return out


def _memattrs(root: ET.Element, r: _Reader, where: str) -> dict:
    """memattr elements as read: values per target NUMA node and initiator CPUs (by object or cpuset)."""
    out: dict = {}
    for m in root.findall("memattr"):
        name = m.get("name")
        if not name:
            continue
        flags = _int(m, "flags", 0, f"{where}: memattr {name!r}")
        values = []
        for v in m.findall("memattr_value"):
            target = r.gp_node.get((v.get("target_obj_gp_index") or "").strip())
            if target is None:
                continue  # a target the file left out: ignored, as hwloc does
            value = _int(v, "value", None, f"{where}: memattr {name!r}")
            initiator = None
            if v.get("initiator_cpuset") is not None:
                initiator = _mask(v.get("initiator_cpuset"), f"{where}: memattr {name!r} initiator_cpuset")
            elif v.get("initiator_obj_gp_index") is not None:
                obj = r.gp.get(v.get("initiator_obj_gp_index", "").strip())
                if obj is None:
                    continue
                initiator = _mask(obj.get("cpuset"), f"{where}: memattr {name!r} initiator")
            elif flags & MEMATTR_NEED_INITIATOR:
                raise UsageError(f"{where}: memattr {name!r} value without its initiator", "hwloc rejects the file too")
            values.append({"target_node": target, "initiator_cpus": list(initiator) if initiator is not None else None,
                           "value": value})
        if values:
            out[name] = {"flags": flags, "values": values}
    return out


# ---- export ---------------------------------------------------------------------------------

def format_mask(ids) -> str:
    """hwloc's bitmap text: 32-bit words from the highest set one, zero words left empty except the
    last ("0x0000ffff,,0x0000ffff", "0x00000001,0x0"); "0x0" for none."""
    words: dict[int, int] = {}
    for i in ids:
        words[i >> 5] = words.get(i >> 5, 0) | (1 << (i & 31))
    if not words:
        return "0x0"
    top = max(words)
    parts = [f"0x{words[top]:08x}"]
    for k in range(top - 1, -1, -1):
        w = words.get(k, 0)
        parts.append(f"0x{w:08x}" if w else ("0x0" if k == 0 else ""))
    return ",".join(parts)


def dumps(t: Topology) -> str:
    gp = iter(range(1, 1 << 30))
    all_cpus = t.pus
    all_nodes = [n.id for n in t.numa_nodes]
    node_gp: dict[int, int] = {}

    def obj(parent: ET.Element | None, typ: str, cpus, nodeset, **attrs) -> ET.Element:
        a = {"type": typ}
        a.update({k: str(v) for k, v in attrs.items() if v is not None})
        a["cpuset"] = a["complete_cpuset"] = format_mask(cpus)
        a["nodeset"] = a["complete_nodeset"] = format_mask(nodeset)
        a["gp_index"] = str(next(gp))
        return ET.Element("object", a) if parent is None else ET.SubElement(parent, "object", a)

    root = ET.Element("topology", {"version": "2.0"})
    machine = obj(None, "Machine", all_cpus, all_nodes, os_index=0)
    machine.set("allowed_cpuset", format_mask(t.allowed_cpus if t.allowed_cpus is not None else all_cpus))
    machine.set("allowed_nodeset", format_mask(t.mem_allowed_nodes))
    root.append(machine)
    ET.SubElement(machine, "info", {"name": "Backend", "value": "tilewise"})
    ET.SubElement(machine, "info", {"name": "tilewise:source", "value": t.source})
    caches_of: dict[int, list] = {}
    for m in t.memory_caches:
        caches_of.setdefault(m.numa_nodes[0], []).append(m)

    def mem_child(parent: ET.Element, node, cpus) -> None:
        for m in sorted(caches_of.get(node.id, ()), key=lambda m: -m.level):  # farthest first
            if m.numa_nodes[0] == node.id:
                parent = obj(parent, "MemCache", cpus, m.numa_nodes, cache_size=m.size_bytes, depth=m.level,
                             cache_linesize=64, cache_associativity=1, cache_type=0)
        sub = SUBTYPE_OF_KIND.get(node.kind)
        e = obj(parent, "NUMANode", cpus, [node.id], os_index=node.id, subtype=sub, local_memory=node.memory_bytes or None)
        node_gp[node.id] = int(e.get("gp_index"))
        if node.restricted_away:  # as hwloc writes a node whose CPUs the restriction left out
            e.set("cpuset", "0x0")
            e.set("complete_cpuset", format_mask(node.hidden_cpus))
        if node.cpuless:
            ET.SubElement(e, "info", {"name": "tilewise:cpuless", "value": "1"})
            ET.SubElement(e, "info", {"name": "tilewise:kind", "value": node.kind})
        if node.invented:
            ET.SubElement(e, "info", {"name": INVENTED_INFO, "value": "1"})

    def l3_obj(parent: ET.Element, d, cpus, nodes) -> ET.Element:
        if d.invented:  # no L3 in the source: the cores go straight under the parent
            return parent
        le = obj(parent, "L3Cache", cpus, nodes, cache_size=d.size_bytes, depth=3,
                 cache_linesize=64, cache_associativity=0, cache_type=0)
        if tuple(cpus) != d.cpus:  # a piece of an L3 that hwloc's tree cannot nest: rejoined on import
            ET.SubElement(le, "info", {"name": L3_PIECE_INFO, "value": str(d.id)})
        return le

    def core_objs(parent: ET.Element, cores) -> None:
        for c in cores:
            ce = parent if c.invented else obj(parent, "Core", c.pus, [c.numa_node], os_index=c.os_index)
            for p in c.pus:
                obj(ce, "PU", [p], [c.numa_node], os_index=p)

    node_parent: dict[int, ET.Element] = {}  # the object a node's PCI devices hang from
    for cpuless in [n for n in t.numa_nodes if n.cpuless]:
        mem_child(machine, cpuless, all_cpus)
    # a node whose CPUs are in several packages hangs from the Machine, as hwloc puts it
    wide = {n.id for n in t.cpu_nodes if len({t.core_of_cpu[p].package for p in n.cpus}) > 1}
    # a wide node whose packages lie wholly in it: a Group holds them with the node, as hwloc nests
    # them (Itanium's node of two packages); otherwise the node hangs from the Machine
    package_parent: dict[int, ET.Element] = {}
    for nid in sorted(wide):
        node = t.node_by_id[nid]
        pkgs = {t.core_of_cpu[p].package for p in node.cpus}
        inside = all(set(t.package_by_id[k].cpus) <= set(node.cpus) for k in pkgs)
        parent = obj(machine, "Group", node.cpus, [nid], kind=1001, subkind=0) if inside else machine
        mem_child(parent, node, node.cpus)
        node_parent[nid] = parent
        if inside:
            package_parent.update({k: parent for k in pkgs})
    for pkg in t.packages:
        pcores = [c for c in t.cores if c.package == pkg.id]
        pnodes = sorted({c.numa_node for c in pcores})
        if pkg.invented:
            pe = machine
        else:
            pe = obj(package_parent.get(pkg.id, machine), "Package", pkg.cpus, pnodes, os_index=pkg.os_index)
        for nodes, l3s in t.locality_blocks:
            bcores = [c for c in pcores if c.numa_node in nodes]
            if not bcores:
                continue
            if t.l3_known and len(l3s) == 1 and len(nodes) > 1 and not t.l3_by_id[l3s[0]].invented:
                # One L3 holding several nodes (sub-NUMA clustering): as hwloc, the nodes go under the
                # cache, each in a Group with its cores: Package > L3Cache > Group > NUMANode + Cores.
                d = t.l3_by_id[l3s[0]]
                le = l3_obj(pe, d, d.cpus, list(nodes))
                for nid in nodes:
                    ncores = [c for c in bcores if c.numa_node == nid]
                    ge = obj(le, "Group", t.node_by_id[nid].cpus, [nid], kind=1001, subkind=0)
                    mem_child(ge, t.node_by_id[nid], t.node_by_id[nid].cpus)
                    node_parent[nid] = ge
                    core_objs(ge, ncores)
                continue
            # Nodes holding their L3s: Package > (Group per node when several) > NUMANode + L3Cache > Cores.
            for nid in nodes:
                node = t.node_by_id[nid]
                ncores = [c for c in bcores if c.numa_node == nid]
                if not ncores:
                    continue
                parent = pe
                if len(pnodes) > 1 or (pkg.invented and len(t.cpu_nodes) > 1):
                    parent = obj(pe, "Group", node.cpus, [nid], kind=1001, subkind=0)
                if nid not in wide:
                    mem_child(parent, node, node.cpus)
                    node_parent[nid] = parent
                for lid in sorted({c.l3 for c in ncores}):
                    lcores = [c for c in ncores if c.l3 == lid]
                    le = parent
                    if t.l3_known:
                        le = l3_obj(parent, t.l3_by_id[lid], sorted(p for c in lcores for p in c.pus), [nid])
                    core_objs(le, lcores)

    # PCI devices as hwloc writes them: under the object whose CPUs are their locality (their node's
    # Package or Group; the Machine when the firmware gave none), after the CPU objects
    node_cpus = {n.id: n.cpus for n in t.cpu_nodes}
    for d in t.devices:
        nid = d.numa_node if d.numa_node in node_parent else pci.locate(d, node_cpus)[0]
        pci.to_hwloc(node_parent.get(nid, machine), d, gp)

    def matrix(name: str | None, typ: str, kind: int, ids, rows) -> None:
        n = len(ids)
        attrs = {"type": typ, "nbobjs": str(n), "kind": str(kind), "indexing": "os"}
        if name:
            attrs["name"] = name
        de = ET.SubElement(root, "distances2", attrs)
        # as hwloc: 10 numbers per element; its "length" is the length of the element's text
        for tag, items in (("indexes", list(ids)), ("u64values", [int(v) for r in rows for v in r])):
            for off in range(0, len(items), PER_ELEMENT):
                text = " ".join(str(v) for v in items[off:off + PER_ELEMENT]) + " "
                ET.SubElement(de, tag, {"length": str(len(text))}).text = text

    # the source's matrix only: none when it is the default one, without invented nodes when partial
    real = [k for k, n in enumerate(t.numa_nodes) if not (t.distances_source == "partial" and n.invented)]
    if t.distances_source != "default" and len(real) > 1:
        kind = (KIND_FROM_USER if t.distances_source == "user" else KIND_FROM_OS) | KIND_LATENCY
        matrix("NUMALatency", "NUMANode", kind, [all_nodes[k] for k in real],
               [[t.distances[a][b] for b in real] for a in real])
    for key, m in sorted(t.measurements.items()):
        kind = KIND_FROM_USER | (KIND_BANDWIDTH if "bandwidth" in key else KIND_LATENCY)
        rows = [[round(max(v, 0) * MEASURE_SCALE) for v in r] for r in m["values"]]
        matrix(MEASURE_PREFIX + key, "PU", kind, m["cpus"], rows)
    for name, attr in sorted(t.memattrs.items()):
        me = ET.SubElement(root, "memattr", {"name": name, "flags": str(attr["flags"])})
        for v in attr["values"]:
            a = {"target_obj_type": "NUMANode", "target_obj_gp_index": str(node_gp[v["target_node"]]),
                 "value": str(v["value"])}
            if v.get("initiator_cpus") is not None:
                a["initiator_cpuset"] = format_mask(v["initiator_cpus"])
            ET.SubElement(me, "memattr_value", a)

    ET.indent(root, space="  ")
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n' + body + "\n"


def save(t: Topology, path: str | os.PathLike) -> None:
    try:
        atomic_write(path, dumps(t))
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
