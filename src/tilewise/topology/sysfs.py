"""Linux sysfs: /sys/devices/system/{node,cpu}, read through an injected root directory.

Read as hwloc's Linux backend reads it, so that a saved tree gives the model `lstopo` shows:
- every list file has its mask twin (``cpulist``/``cpumap``, ``thread_siblings_list``/
  ``thread_siblings``, ``core_cpus*``, ``package_cpus*``/``core_siblings*``, ``shared_cpu_list``/
  ``shared_cpu_map``): old kernels and trimmed gathers have only the masks;
- files may be padded with NUL bytes (some copies are);
- packages are the groups of ``package_cpus`` (``core_siblings``), numbered by
  ``physical_package_id`` when it is there and not -1 (s390, some VMs), else "OS index unknown";
- thread siblings that report distinct ``core_id`` values are separate cores where hwloc splits
  them: x86 with /proc/cpuinfo saying AuthenticAMD family 15h/16h (Bulldozer compute units); else
  one core with SMT, as hwloc, and a note says so;
- a node whose CPUs were already listed by an earlier node is left out, with a warning (the
  firmware bug that lists every CPU in every node), as hwloc ignores it;
- memory-side caches come from ``node*/memory_side_cache/index*``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology import firmware, pci
from tilewise.topology.build import RawMemCache, RawNode, RawPU, build, note
from tilewise.topology.model import Topology

DEFAULT_ROOT = "/sys/devices/system"


def _clean(text: str) -> str:
    return text.replace("\x00", "").strip()


def _read(path: Path) -> str:
    try:
        return _clean(path.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeError:
        raise UsageError(f"{path} is not text", "is this a copy of /sys/devices/system?") from None


def _read_opt(path: Path) -> str | None:
    try:
        return _clean(path.read_text())
    except (OSError, UnicodeError):
        return None


_LIST_OF_MASK = {"cpumap": "cpulist", "shared_cpu_map": "shared_cpu_list"}


def _cpus(d: Path, mask: str) -> tuple[int, ...] | None:
    """A CPU set from the list file (``<mask>_list``, ``cpulist``, ``shared_cpu_list``), else from
    the mask file as hwloc reads it; None when neither is there, () when it is empty."""
    name = _LIST_OF_MASK.get(mask, f"{mask}_list")
    text = _read_opt(d / name)
    if text is not None:
        return cpulist.parse(text, what=f"{d}/{name}", allow_empty=True)
    text = _read_opt(d / mask)
    if text is not None:
        return cpulist.parse_mask(text, what=f"{d}/{mask}")
    return None


def _int_opt(path: Path) -> int | None:
    text = _read_opt(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{path} holds {text[:40]!r}, not a number") from None


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


def _read_nodes(base: Path, cpus: tuple[int, ...], notes: list[dict]):
    """(cpu -> node, raw nodes, distances or None, memory caches) as hwloc reads node/."""
    node_dir = base / "node"
    node_ids: list[int] = []
    if node_dir.is_dir():
        node_ids = sorted(int(m.group(1)) for d in node_dir.iterdir() if (m := re.fullmatch(r"node(\d+)", d.name)))
    if not node_ids:
        return None, [], None, []
    online = set(cpus)
    cpu_node: dict[int, int] = {}
    raw_nodes: list[RawNode] = []
    dropped: dict[int, tuple[int, ...]] = {}  # node -> the CPUs it listed, when left out
    rows: dict[int, list[int]] = {}
    caches: list[RawMemCache] = []
    no_distance = False
    for nid in node_ids:
        nd = node_dir / f"node{nid}"
        listed = _cpus(nd, "cpumap")
        if listed is None:
            raise UsageError(f"{nd} has neither cpulist nor cpumap", "is this a copy of /sys/devices/system?")
        ncpus = tuple(c for c in listed if c in online)
        dtext = _read_opt(nd / "distance")
        if set(ncpus) & cpu_node.keys():
            dropped[nid] = ncpus  # as hwloc: a node overlapping earlier ones is ignored
        else:
            for c in ncpus:
                cpu_node[c] = nid
            mem = 0
            if m := re.search(r"MemTotal:\s+(\d+)\s*kB", _read_opt(nd / "meminfo") or ""):
                mem = int(m.group(1)) * 1024
            raw_nodes.append(RawNode(nid, mem, ncpus, None, None if ncpus else _memory_kind(base, nid)))
            caches.extend(_memory_side_caches(nd, nid))
        if dtext is None:
            no_distance = True
        else:
            try:
                row = [int(x) for x in dtext.split()]
            except ValueError:
                raise UsageError(f"{nd}/distance holds {dtext[:40]!r}, not numbers") from None
            if len(row) == len(node_ids):
                rows[nid] = row
            elif len(row) > max(node_ids):  # a row per possible node, some offline (no nodeN/): by node id
                rows[nid] = [row[k] for k in node_ids]
            else:
                raise UsageError(f"{nd}/distance has {len(row)} entries for {len(node_ids)} nodes")
    if dropped:
        _firmware_overlap(node_ids, dropped, cpu_node, raw_nodes, notes, base)
    _nodeless(cpus, cpu_node, raw_nodes, notes)
    distances = None
    if not no_distance:  # the matrix of the nodes kept (an invented node has no row)
        pos = {nid: k for k, nid in enumerate(node_ids)}
        kept = [n.id for n in raw_nodes]
        if all(a in rows for a in kept):
            distances = [[rows[a][pos[b]] for b in kept] for a in kept]
    return cpu_node, raw_nodes, distances, caches


def _nodeless(cpus, cpu_node, raw_nodes, notes) -> None:
    """Online CPUs no node lists (their node is offline, or the firmware gave them none): hwloc shows
    them without a NUMA node; tilewise puts them in one invented node, numbered with the lowest free id."""
    orphans = [c for c in cpus if c not in cpu_node]
    if not orphans:
        return
    used = {n.id for n in raw_nodes}
    nid = next(i for i in range(len(used) + 1) if i not in used)
    for c in orphans:
        cpu_node[c] = nid
    raw_nodes.append(RawNode(nid, 0, tuple(orphans), None, None, invented=True))
    raw_nodes.sort(key=lambda n: n.id)
    notes.append(note("note", f"CPUs {cpulist.format(orphans)} are online but in no NUMA node's cpulist (their node is "
                              "offline, or the firmware gave them none): hwloc shows them without one; tilewise puts "
                              f"them in invented node {nid}, memory unknown"))


def _firmware_overlap(node_ids, dropped, cpu_node, raw_nodes, notes, base) -> None:
    """Nodes whose CPUs an earlier node already listed: left out as hwloc leaves them out; their
    CPUs that no kept node holds go to an invented node with the first dropped node's id."""
    orphans: dict[int, list[int]] = {}
    for nid, listed in sorted(dropped.items()):
        for c in listed:
            if c not in cpu_node:
                orphans.setdefault(nid, []).append(c)
                cpu_node[c] = nid
    overlap = sorted({c for listed in dropped.values() for c in listed})
    holders = sorted({n for n in node_ids if n in dropped} | {cpu_node[c] for c in overlap if cpu_node[c] not in dropped})
    text = (f"the firmware lists CPUs {cpulist.format(overlap)} in several NUMA nodes ({cpulist.format(holders)}), "
            f"a known BIOS/ACPI SRAT bug; as hwloc, node(s) {cpulist.format(sorted(dropped))} are left out "
            "(their memory is not shown)")
    if orphans:
        text += (f"; CPUs {cpulist.format(sorted(c for v in orphans.values() for c in v))} are then in no node "
                 f"(hwloc shows them without one): tilewise puts them in invented node(s) "
                 f"{cpulist.format(sorted(orphans))} with unknown memory")
        for nid, cs in orphans.items():
            raw_nodes.append(RawNode(nid, 0, tuple(sorted(cs)), None, None, invented=True))
        raw_nodes.sort(key=lambda n: n.id)
    notes.append(note("warning", text + "; check the BIOS NUMA settings or update it"))


def _memory_side_caches(nd: Path, nid: int) -> list[RawMemCache]:
    out = []
    msc = nd / "memory_side_cache"
    if msc.is_dir():
        for idx in sorted(msc.glob("index*")):
            size = _int_opt(idx / "size")
            m = re.fullmatch(r"index(\d+)", idx.name)
            # hwloc needs size, line_size and indexing to believe in a memory-side cache
            if size and m and _read_opt(idx / "line_size") is not None and _read_opt(idx / "indexing") is not None:
                out.append(RawMemCache((nid,), size, int(m.group(1))))
    return out


X86 = re.compile(r"x86_64|amd64|i[3-6]86")


def amd_compute_units(proc: Path | None, arch: str | None = None) -> bool:
    """hwloc's rule for splitting thread siblings with distinct core ids into cores (its
    is_amd_with_CU): an x86 machine whose /proc/cpuinfo says AuthenticAMD, family 15h or 16h
    (Bulldozer to Jaguar: compute units). proc: the machine's /proc (a saved tree's; None when the
    copy holds none); arch: uname's machine, else the tree's hwloc-nofile-info (hwloc-gather-topology
    writes it) says it."""
    if proc is None:
        return False
    if arch is None:
        info = _read_opt(proc / "hwloc-nofile-info") or ""
        m = re.search(r"^Architecture:\s*(\S+)", info, re.M)
        arch = m.group(1) if m else ""
    if not X86.fullmatch(arch):
        return False
    text = _read_opt(proc / "cpuinfo") or ""
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    return bool(vendor and family and vendor.group(1) == "AuthenticAMD" and int(family.group(1)) in (0x15, 0x16))


def tree_restriction(fsroot: Path) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, str]:
    """The CPUs and memory nodes a saved tree's process was allowed, found as hwloc finds them: the
    first cpuset mount in its proc/mounts (cgroup v2 whose cgroup.controllers lists cpuset; cgroup v1
    mounted with the cpuset option, whose files have no "cpuset." prefix under noprefix; the old cpuset
    file system), the process's cpuset from proc/self/cpuset, else the first ":cpuset:" or "::" line
    of proc/self/cgroup, and its files (v2: cpuset.cpus.effective; v1: cpuset.cpus; cpuset fs: cpus;
    "mems" likewise), read under fsroot. A file that is not there restricts nothing. (None, None, "")
    when the tree has no restriction."""
    proc = fsroot / "proc"
    mounts = _read_opt(proc / "mounts")
    if not mounts:
        return None, None, ""
    found = None
    for ln in mounts.splitlines():
        f = ln.split()
        if len(f) < 4:
            continue
        mnt, fstype, opts = fsroot / f[1].lstrip("/"), f[2], f[3].split(",")
        if fstype == "cgroup2" and "cpuset" in (_read_opt(mnt / "cgroup.controllers") or "").split():
            found = (mnt, "cpuset.{}.effective", "cgroup v2")
        elif fstype == "cpuset" or (fstype == "cgroup" and "cpuset" in opts and "noprefix" in opts):
            found = (mnt, "{}", "cpuset")
        elif fstype == "cgroup" and "cpuset" in opts:
            found = (mnt, "cpuset.{}", "cgroup v1 cpuset")
        if found:
            break
    if found is None:
        return None, None, ""
    name = _read_opt(proc / "self" / "cpuset")
    if name is None:
        for ln in (_read_opt(proc / "self" / "cgroup") or "").splitlines():
            _, colon, rest = ln.partition(":")
            if colon and rest.startswith("cpuset:"):
                name = rest[len("cpuset:"):]
                break
            if colon and rest.startswith(":"):
                name = rest[1:]
                break
    if name is None:
        return None, None, ""
    mnt, pattern, what = found
    d = mnt / name.strip("/")

    def one(attr: str) -> tuple[int, ...] | None:
        text = _read_opt(d / pattern.format(attr))
        return cpulist.parse(text, what=f"{d / pattern.format(attr)}", allow_empty=True) if text is not None else None

    cpus, mems = one("cpus"), one("mems")
    if cpus is None and mems is None:
        return None, None, ""
    return cpus, mems, f"{what} {name}"


def _restrict(pus: list[RawPU], raw_nodes: list[RawNode], cpus_ok, mems_ok, where: str, notes: list[dict]):
    """The saved tree as hwloc reads it under its process's restriction: CPUs outside the allowed set
    left out (a node keeps them as hidden_cpus: its memory is ordinary memory local to CPUs not allowed
    here), nodes outside the allowed memory left out (their allowed CPUs go to an invented node of the
    same id, as for a restricted hwloc export). Returns (pus, nodes)."""
    all_cpus = {p.cpu for p in pus}
    allowed = set(cpus_ok) & all_cpus if cpus_ok is not None else all_cpus
    if not allowed:
        raise UsageError(f"the saved tree's {where} allows none of its CPUs", "is its cgroup's cpuset empty?")
    mems = set(mems_ok) if mems_ok is not None else {n.id for n in raw_nodes}
    pus = [p for p in pus if p.cpu in allowed]
    kept, gone = [], []
    for n in raw_nodes:
        listed = tuple(sorted(n.cpus))
        hidden = tuple(c for c in listed if c not in allowed)
        if n.id in mems:
            mine = tuple(c for c in listed if c in allowed)
            if mine:
                hidden = ()  # recorded for a node left with no allowed CPU only (as an hwloc export shows it)
            kind = "dram" if hidden else n.kind  # memory local to CPUs not allowed here
            kept.append(RawNode(n.id, n.memory_bytes, mine, n.package, kind, n.invented, hidden))
        elif any(p.node == n.id for p in pus):
            gone.append(n.id)
            kept.append(RawNode(n.id, 0, (), None, None, invented=True))
    text = (f"the saved tree's {where} allows CPUs {cpulist.format(sorted(allowed))}"
            + (f" and the memory of node(s) {cpulist.format(sorted(mems))}" if mems_ok is not None else "")
            + ": read as hwloc reads it, the rest left out")
    if gone:
        text += (f"; CPUs of node(s) {cpulist.format(gone)}, whose memory is not allowed, are in no node there "
                 "(hwloc shows them without one): tilewise puts them in invented node(s) of the same id, memory unknown")
    notes.append(note("note", text))
    return pus, kept


def _online_cpus(cpu_dir: Path, notes: list[dict]) -> tuple[int, ...]:
    """The CPUs hwloc reads: cpu/online (an old kernel has none: every cpuN whose own online file
    does not say 0), less those without a topology/ directory (offline CPUs of old kernels show one
    without it), which hwloc skips; a note names them."""
    online_text = _read_opt(cpu_dir / "online")
    if online_text:
        cpus = cpulist.parse(online_text, what=f"{cpu_dir}/online")
    else:
        found = sorted(int(m.group(1)) for d in cpu_dir.iterdir() if (m := re.fullmatch(r"cpu(\d+)", d.name)))
        cpus = tuple(c for c in found if _read_opt(cpu_dir / f"cpu{c}" / "online") != "0")
    bare = [c for c in cpus if not (cpu_dir / f"cpu{c}" / "topology").is_dir()]
    if bare and len(bare) < len(cpus):
        notes.append(note("note", f"CPUs {cpulist.format(bare)} have no topology/ directory (offline CPUs of a kernel "
                                  "without cpu/online show one without it): left out, as hwloc leaves them out"))
        cpus = tuple(c for c in cpus if c not in bare)
    elif bare:
        raise UsageError(f"{cpu_dir / f'cpu{bare[0]}' / 'topology'} is missing (and every CPU's)",
                         "is this a copy of /sys/devices/system?")
    if not cpus:
        raise UsageError(f"no CPUs found under {cpu_dir}")
    return tuple(cpus)


def load(root: str | os.PathLike = DEFAULT_ROOT, *, allowed_cpus=None, meminfo_path: str | None = None) -> Topology:
    base = resolve_root(root)
    # the machine's /proc: this one's for /sys/devices/system, a saved tree's own (hwloc-gather-topology
    # keeps meminfo, cpuinfo and hwloc-nofile-info), none for a bare copy of devices/system
    proc = base.parents[2] / "proc" if base.name == "system" and len(base.parents) > 2 else None
    if proc is not None and not proc.is_dir():
        proc = None
    if meminfo_path is None:
        meminfo_path = str(proc / "meminfo") if proc is not None and (proc / "meminfo").is_file() else "/proc/meminfo"
    compute_units = amd_compute_units(proc, os.uname().machine if proc == Path("/proc") else None)
    cpu_dir = base / "cpu"
    notes: list[dict] = []
    allowed_nodes = None
    distances_source = None
    cpus = _online_cpus(cpu_dir, notes)

    # NUMA nodes (a kernel without NUMA has no node/ directory: one node holds everything).
    cpu_node, raw_nodes, distances, caches = _read_nodes(base, cpus, notes)
    if cpu_node is None:
        mem = 0
        text = _read_opt(Path(meminfo_path)) or ""
        if m := re.search(r"MemTotal:\s+(\d+)\s*kB", text):
            mem = int(m.group(1)) * 1024
        raw_nodes = [RawNode(0, mem)]
        cpu_node = {c: 0 for c in cpus}
        distances = None

    online = set(cpus)
    pus: list[RawPU] = []
    l3_sizes: dict = {}
    core_ids: dict[int, int | None] = {}
    split_cores: list[int] = []
    distinct_ids: list[int] = []  # thread siblings with distinct core ids kept as one core (not AMD CUs)
    # per CPU: (physical_package_id, package_cpus group), read once; an id several groups carry is
    # shared (Itanium)
    package_of = {c: (_int_opt(cpu_dir / f"cpu{c}" / "topology" / "physical_package_id"),
                      _cpus(cpu_dir / f"cpu{c}" / "topology", "package_cpus")
                      or _cpus(cpu_dir / f"cpu{c}" / "topology", "core_siblings")) for c in cpus}
    groups_of_os: dict[int, set] = {}  # physical_package_id -> the package_cpus groups carrying it
    for c, (pkg_os, pkg_set) in package_of.items():
        if pkg_set is not None and pkg_os is not None and pkg_os >= 0:
            groups_of_os.setdefault(pkg_os, set()).add(min((x for x in pkg_set if x in online), default=c))
    shared_os = sorted(k for k, g in groups_of_os.items() if len(g) > 1)
    for c in cpus:
        topo = cpu_dir / f"cpu{c}" / "topology"
        pkg_os, pkg_set = package_of[c]
        if pkg_set is not None:
            # as hwloc: a package is a package_cpus group; its OS index is physical_package_id
            # unless that is missing or -1 (s390, some VMs); an index several groups carry
            # (Itanium) is kept on each of them
            first = min((x for x in pkg_set if x in online), default=c)
            if pkg_os is None or pkg_os < 0:
                pkg = ("mask", first)
            elif pkg_os in shared_os:
                pkg = ("shared", pkg_os, first)
            else:
                pkg = pkg_os
        else:
            pkg = pkg_os if pkg_os is not None and pkg_os >= 0 else None
        core_id = core_ids[c] if c in core_ids else _int_opt(topo / "core_id")
        siblings = _cpus(topo, "core_cpus") or _cpus(topo, "thread_siblings")
        if siblings is not None:
            siblings = tuple(x for x in siblings if x in online) or (c,)
            # The core's identity is its sibling set: core_id repeats across dies and packages.
            # Siblings with distinct core ids are separate cores on AMD compute units, as hwloc.
            for x in siblings:
                if x not in core_ids:
                    core_ids[x] = _int_opt(cpu_dir / f"cpu{x}" / "topology" / "core_id")
            distinct = len(siblings) > 1 and len({core_ids[x] for x in siblings}) > 1
            if distinct:
                (split_cores if compute_units else distinct_ids).append(c)
            core_key = ("core", c) if distinct and compute_units else ("core", min(siblings))
        else:
            core_key = None  # no core facts: one invented core per PU
        l3_key = None
        cache_dir = cpu_dir / f"cpu{c}" / "cache"
        if cache_dir.is_dir():
            for idx in sorted(cache_dir.glob("index*")):
                if _read_opt(idx / "level") == "3" and (_read_opt(idx / "type") or "Unified") in ("Unified", "Data"):
                    shared = _cpus(idx, "shared_cpu_map")
                    if shared is None:
                        raise UsageError(f"{idx} has neither shared_cpu_list nor shared_cpu_map")
                    # as hwloc: an empty map means the core's own threads
                    shared = tuple(x for x in shared if x in online) or siblings or (c,)
                    l3_key = ("l3", shared)
                    l3_sizes[l3_key] = _size(_read_opt(idx / "size") or "0")
                    break
        pus.append(RawPU(c, pkg, core_key, core_id if core_id is not None else c, cpu_node[c], l3_key))
    if split_cores:
        notes.append(note("note", f"CPUs {cpulist.format(split_cores)} are thread siblings with distinct core ids "
                                  "on AMD family 15h/16h (Bulldozer compute units): each is a core of its own, as "
                                  "hwloc counts them"))
    if distinct_ids:
        notes.append(note("note", f"CPUs {cpulist.format(distinct_ids)} are thread siblings with distinct core ids: "
                                  "one core with SMT per sibling set, as hwloc reads them "
                                  + ("here (its /proc/cpuinfo is not AMD family 15h/16h; on those, Bulldozer compute "
                                     "units, each would be a core)" if proc is not None and (proc / "cpuinfo").is_file()
                                     else "without the machine's /proc/cpuinfo (an AMD family 15h/16h there, Bulldozer "
                                          "compute units, would make each a core: save the tree with "
                                          "hwloc-gather-topology)")))
    if any(p.package is None for p in pus):
        notes.append(note("note", "no physical_package_id nor package_cpus/core_siblings: one package is invented "
                                  "(hwloc shows none)"))
    if any(p.core_key is None for p in pus):
        notes.append(note("note", "no thread_siblings/core_cpus: one core per CPU is invented (hwloc shows no cores)"))
    if any(isinstance(p.package, tuple) and p.package[0] == "mask" for p in pus):
        notes.append(note("note", "physical_package_id is missing or -1: packages are the package_cpus/core_siblings "
                                  "groups, OS index unknown, as hwloc reads them"))
    if shared_os:
        notes.append(note("note", f"physical_package_id {cpulist.format(shared_os)} is carried by several distinct "
                                  "package_cpus/core_siblings groups (Itanium): each group is a package with that OS "
                                  "index, as hwloc reads them (numbered apart here)"))
    if proc is not None and proc != Path("/proc") and allowed_cpus is None:
        # a saved tree: the restriction of the process that saved it, as hwloc applies it (this
        # machine's own is the caller's: load_live passes its affinity)
        cpus_ok, mems_ok, where = tree_restriction(proc.parent)
        if where:
            before = [n.id for n in raw_nodes]
            pus, raw_nodes = _restrict(pus, raw_nodes, cpus_ok, mems_ok, where, notes)
            if distances is not None:  # as hwloc: the matrix of the allowed nodes; 10/20 for an invented one
                pos = {nid: k for k, nid in enumerate(before)}
                real = [n.id for n in raw_nodes if not n.invented]
                distances = None if len(real) < 2 else [
                    [distances[pos[a.id]][pos[b.id]] if not (a.invented or b.invented) else (10 if a.id == b.id else 20)
                     for b in raw_nodes] for a in raw_nodes]
                if distances is not None and len(real) < len(raw_nodes):
                    distances_source = "partial"
                    notes.append(note("note", "distances to invented node(s) "
                                              f"{cpulist.format([n.id for n in raw_nodes if n.invented])} are not "
                                              "hwloc's (their node is not allowed): 10/20 shown for them"))
            allowed_nodes = sorted(mems_ok) if mems_ok is not None else None
    sys_root = pci.sysfs_root_of(base)
    devices = pci.read_sysfs(sys_root) if sys_root is not None else []
    # the firmware's memory figures (HMAT) and the kernel's memory tiers, as hwloc memattrs
    fw = firmware.read(base.parent.parent)
    memattrs = firmware.to_memattrs(fw, {n.id: tuple(n.cpus) for n in raw_nodes})
    return build(pus, raw_nodes, distances=distances, l3_sizes=l3_sizes, source=f"sysfs:{root}",
                 allowed_cpus=allowed_cpus, memory_caches=caches, notes=notes, devices=devices, memattrs=memattrs,
                 allowed_nodes=allowed_nodes, distances_source=distances_source)


def _memory_kind(base: Path, nid: int) -> str:
    """Best-effort technology of a CPU-less node (memory tiers, dax); 'memory' when unknown."""
    tiers = base.parent / "virtual" / "memory_tiering"  # /sys/devices/virtual, beside /sys/devices/system
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

