"""Readable views of a topology: a summary line, a compact tree, and the JSON document."""

from __future__ import annotations

from collections import Counter

from tilewise import cpulist
from tilewise.topology import firmware, tiers
from tilewise.topology.model import Topology, human_bytes, summary_line  # noqa: F401 - part of this module's API


def tree_lines(t: Topology, max_l3: int = 64) -> list[str]:
    """Compact tree: Package > NUMANode > L3 (or Package > L3 > NUMANode where an L3 holds several
    nodes, as hwloc shows sub-NUMA clustering) with logical and OS indexes."""
    lines = [f"Machine ({human_bytes(t.memory_bytes)}, {len(t.cores)} cores, {len(t.pus)} PUs)  [{t.source}]"]
    cores_per_l3 = Counter(c.l3 for c in t.cores)
    logical_node = {n.id: i for i, n in enumerate(t.numa_nodes)}
    shown = 0
    label = "L3" if t.l3_known else "Domain"

    caches_of: dict[int, list] = {}
    for m in t.memory_caches:
        for nid in m.numa_nodes:
            caches_of.setdefault(nid, []).append(m)

    def node_line(indent: str, nid: int) -> str:
        node = t.node_by_id[nid]
        marks = ", invented: not in the source" if node.invented else ""
        if nid not in t.mem_allowed_nodes:
            marks += ", memory not allowed"
        mc = "".join(f", behind MemCache L#{m.id} ({human_bytes(m.size_bytes)})" for m in caches_of.get(nid, ()))
        return (f"{indent}NUMANode L#{logical_node[nid]} (P#{nid}, {human_bytes(node.memory_bytes)}{mc}{marks})"
                f"  cpus {cpulist.format(node.cpus)}")

    def l3_line(indent: str, d) -> str:
        if t.l3_known and d.invented:
            return f"{indent}No L3 ({cores_per_l3[d.id]} cores under no L3 cache: not a chiplet)  cpus {cpulist.format(d.cpus)}"
        size = human_bytes(d.size_bytes) if d.size_bytes else "size unknown"
        spans = f", spans NUMA nodes {cpulist.format(d.numa_nodes)}" if d.spans_nodes else ""
        return f"{indent}{label} L#{d.id} ({size}, {cores_per_l3[d.id]} cores{spans})  cpus {cpulist.format(d.cpus)}"

    if any(c.invented for c in t.cores):
        lines.append("  (cores invented: the source has no Core objects, one core per PU)")
    # a node whose CPUs are in several packages is shown once, above them (hwloc hangs it from the Machine)
    pkg_of = {p: c.package for c in t.cores for p in c.pus}
    wide = [n for n in t.cpu_nodes if len({pkg_of[p] for p in n.cpus}) > 1]
    for n in wide:
        lines.append(node_line("  ", n.id) + f"  (spans {len({pkg_of[p] for p in n.cpus})} packages)")
    wide_ids = {n.id for n in wide}
    for pi, pkg in enumerate(t.packages):
        if pkg.invented:
            ident = "invented: the source has no package"
        else:
            ident = f"P#{pkg.id}" if pkg.os_index_known else "P#?, OS index unknown"
        lines.append(f"  Package L#{pi} ({ident})  cpus {cpulist.format(pkg.cpus)}")
        pkg_cpus = set(pkg.cpus)
        for nodes, l3s in t.locality_blocks:
            domains = [t.l3_by_id[i] for i in l3s if t.l3_by_id[i].package == pkg.id]
            if not domains:
                continue
            if len(l3s) == 1 and len(nodes) > 1:  # one L3 holding several nodes: the cache above them
                shown += 1
                if shown <= max_l3:
                    lines.append(l3_line("    ", domains[0]))
                    lines.extend(node_line("      ", nid) for nid in nodes)
                continue
            for nid in nodes:
                if set(t.node_by_id[nid].cpus) & pkg_cpus and nid not in wide_ids:
                    lines.append(node_line("    ", nid))
                for d in domains:
                    if nid != d.numa_nodes[0]:
                        continue
                    shown += 1
                    if shown <= max_l3:
                        lines.append(l3_line("    " if nid in wide_ids else "      ", d))
    if shown > max_l3:
        lines.append(f"      ... {shown - max_l3} more L3 domains (use --json for all)")
    for ni, node in enumerate(t.numa_nodes):
        if node.cpuless:
            mc = "".join(f", behind MemCache L#{m.id} ({human_bytes(m.size_bytes)})" for m in caches_of.get(node.id, ()))
            cpus = (f"its CPUs {cpulist.format(node.hidden_cpus)} not allowed here" if node.restricted_away
                    else "no CPUs")
            lines.append(f"  NUMANode L#{ni} (P#{node.id}, {human_bytes(node.memory_bytes)}, {node.kind}, {cpus}{mc})")
    if len(t.numa_nodes) > 1:
        lines.append(distances_line(t))
    if t.allowed_cpus is not None:
        lines.append(f"  Allowed CPUs: {cpulist.format(t.allowed_cpus)}")
    if t.allowed_nodes is not None:
        lines.append(f"  Allowed memory nodes: {cpulist.format(t.allowed_nodes) or 'none'}")
    lines.extend(device_lines(t))
    for key, m in sorted(t.measurements.items()):
        lines.append(f"  Measured: {key} over {len(m['cpus'])} CPUs")
    lines += memattr_lines(t)
    lines += tier_lines(t)
    return lines


# hwloc's memory attributes, in the units the kernel and hwloc give them
MEMATTR_UNITS = {"Latency": "ns", "ReadLatency": "ns", "WriteLatency": "ns", "Bandwidth": "MB/s",
                 "ReadBandwidth": "MB/s", "WriteBandwidth": "MB/s", "Capacity": "bytes", "Locality": "PUs"}
MEMATTR_SHOWN = 4  # values per attribute in the text (all of them in --json)


def memattr_lines(t: Topology) -> list[str]:
    """Each memory attribute (the firmware's HMAT figures as hwloc reads them, or measured ones): what
    it measures and its first values per target node and initiator. The kernel's tiers are shown by
    tier_lines instead."""
    out = []
    for name, attr in sorted(t.memattrs.items()):
        if name == firmware.TIER_ATTR:
            continue
        unit = MEMATTR_UNITS.get(name.rsplit(":", 1)[-1].removeprefix("Measured"), "")
        order = "lower is nearer" if attr.get("flags", 0) & firmware.LOWER_FIRST else "higher is better"
        vals = attr["values"]
        shown = "; ".join(f"node {v['target_node']}"
                          + (f" from CPUs {cpulist.format(v['initiator_cpus'])}" if v.get("initiator_cpus") else "")
                          + f": {v['value']}" for v in vals[:MEMATTR_SHOWN])
        more = f"; {len(vals) - MEMATTR_SHOWN} more (see --json)" if len(vals) > MEMATTR_SHOWN else ""
        out.append(f"  Memory attribute {name} ({', '.join(x for x in (unit, order) if x)}): {shown}{more}")
    return out


def device_lines(t: Topology) -> list[str]:
    """GPUs, accelerators and NICs, by NUMA node (the firmware's, or none)."""
    lines = []
    for d in t.devices:
        node = f"NUMA P#{d.numa_node}" if d.numa_node is not None else "no NUMA node (firmware: -1)"
        facts = [x for x in (human_bytes(d.memory_bytes) if d.memory_bytes else None, d.uuid,
                             ",".join(d.os_devices) or None) if x]
        lines.append(f"  {d.kind.upper() if d.kind in ('gpu', 'nic') else d.kind.capitalize()} {d.address} "
                     f"{d.name or d.vendor or hex(d.vendor_id)} [{d.vendor_id:04x}:{d.device_id:04x}]  {node}, "
                     f"local cpus {cpulist.format(d.local_cpus) or 'unknown'}" + (f"  ({'; '.join(facts)})" if facts else ""))
    return lines


def tier_lines(t: Topology) -> list[str]:
    """Each node's memory tier and, for a CPU-less node, its nearest CPUs and what that was decided on
    (measured latency, else the firmware's figures, else SLIT distance); shown where the machine has
    CPU-less nodes or memory figures."""
    if not any(n.cpuless and not n.restricted_away for n in t.numa_nodes) and not t.memattrs:
        return []
    fig = tiers.figures(t)
    ktiers = fig.firmware.tiers if fig.firmware else ()
    head = "  Memory tiers" + (" (kernel: " + "; ".join(f"tier {k.id} = node(s) {cpulist.format(k.nodes)}" for k in ktiers)
                                + ")" if ktiers else "") + ":"
    out = [head]
    for nt in tiers.classify(t, measured=fig.measured, firmware=fig.firmware):
        if nt.nearest is None:
            away = t.node_by_id[nt.node].hidden_cpus if not t.node_by_id[nt.node].cpus else ()
            out.append(f"    node {nt.node}: {nt.tier} (its CPUs' local memory"
                       + (f"; its CPUs {cpulist.format(away)} are not allowed here: not a far tier)" if away else ")"))
            continue
        ratios = ", ".join(x for x in (f"latency {nt.latency_ratio:.2f}x" if nt.latency_ratio else "",
                                        f"read bandwidth {nt.bandwidth_ratio:.2f}x" if nt.bandwidth_ratio else "") if x)
        out.append(f"    node {nt.node}: {nt.tier}; nearest CPUs: node(s) {cpulist.format(nt.nearest.initiators)} by "
                   f"{nt.nearest.source}" + (f" ({nt.nearest.value:g} ns)" if nt.nearest.source != tiers.SRC_SLIT else
                                             f" ({nt.nearest.value:g})")
                   + (f"; {ratios} of their local memory ({nt.basis})" if ratios else f"; decided on {nt.basis}"))
    return out


DIST_SOURCE_WORDS = {
    "firmware": "from the firmware",
    "user": "added by a tool (not the firmware)",
    "default": "default 10/20: none in the source, hwloc shows none",
    "partial": "from the source, 10/20 for invented nodes",
}


def distances_line(t: Topology, max_nodes: int = 8) -> str:
    ids = [n.id for n in t.numa_nodes]
    head = f"  Distances (SLIT, {DIST_SOURCE_WORDS[t.distances_source]}): "
    if len(ids) > max_nodes:
        values = sorted({v for row in t.distances for v in row})
        return head + f"{len(ids)}x{len(ids)}, values {'/'.join(map(str, values[:8]))}{' ...' if len(values) > 8 else ''} (all in --json)"
    return head + "  ".join(f"{a}->" + ",".join(str(v) for v in row) for a, row in zip(ids, t.distances))


def note_lines(t: Topology) -> list[str]:
    """How this model differs from the source or from hwloc's reading of it, and why."""
    return [f"{n['level']}: {n['text']}" for n in t.notes]


def to_json(t: Topology) -> dict:
    cores_by_l3 = Counter(c.l3 for c in t.cores)
    allowed_mem = set(t.mem_allowed_nodes)
    return {
        "source": t.source,
        "fingerprint": t.fingerprint(),
        "summary": summary_line(t),
        "packages": len(t.packages),
        "package_list": [{"id": p.id, "cpus": list(p.cpus), "os_index": p.os_index, "invented": p.invented}
                         for p in t.packages],
        "numa_nodes": [
            {"id": n.id, "cpus": list(n.cpus), "memory_bytes": n.memory_bytes, "package": n.package,
             "cpuless": n.cpuless, "kind": n.kind, "invented": n.invented, "hidden_cpus": list(n.hidden_cpus),
             "memory_allowed": n.id in allowed_mem}
            for n in t.numa_nodes
        ],
        "l3_domains": [
            {"id": d.id, "cpus": list(d.cpus), "numa_nodes": list(d.numa_nodes), "package": d.package,
             "size_bytes": d.size_bytes, "cores": cores_by_l3[d.id], "invented": d.invented}
            for d in t.l3_domains
        ],
        "l3_known": t.l3_known,
        "cores": len(t.cores),
        "cores_invented": any(c.invented for c in t.cores),
        "core_list": [
            {"id": c.id, "os_index": c.os_index, "pus": list(c.pus), "numa_node": c.numa_node, "l3": c.l3,
             "package": c.package, "invented": c.invented}
            for c in t.cores
        ],
        "pus": len(t.pus),
        "smt": t.smt,
        "memory_bytes": t.memory_bytes,
        "distances": [list(r) for r in t.distances],
        "distances_source": t.distances_source,
        "allowed_cpus": list(t.allowed_cpus) if t.allowed_cpus is not None else None,
        "allowed_nodes": list(t.allowed_nodes) if t.allowed_nodes is not None else None,
        "memory_caches": [{"id": m.id, "numa_nodes": list(m.numa_nodes), "size_bytes": m.size_bytes, "level": m.level}
                          for m in t.memory_caches],
        # initiators as kernel CPU lists ("0-87,176-263"): thousands of values stay readable
        "memattrs": {name: {"flags": a["flags"], "values": [
            {"target_node": v["target_node"], "value": v["value"],
             "initiator_cpus": cpulist.format(v["initiator_cpus"]) if v["initiator_cpus"] is not None else None}
            for v in a["values"]]} for name, a in t.memattrs.items()},
        "measurements": t.measurements,
        "devices": [d.to_json() for d in t.devices],
        "memory_tiers": [x.to_json() for x in tiers.classify(t, **vars(tiers.figures(t)))] if len(t.numa_nodes) > 1 or t.memattrs else [],
        "notes": [dict(n) for n in t.notes],
    }
