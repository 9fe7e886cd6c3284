"""Readable views of a topology: a summary line, a compact tree, and the JSON document."""

from __future__ import annotations

from collections import Counter

from tilewise import cpulist
from tilewise.topology.model import Topology, human_bytes, summary_line  # noqa: F401 - part of this module's API


def tree_lines(t: Topology, max_l3: int = 64) -> list[str]:
    """Compact tree: Package > NUMANode > L3 (or Package > L3 > NUMANode where an L3 holds several
    nodes, as hwloc shows sub-NUMA clustering) with logical and OS indexes."""
    lines = [f"Machine ({human_bytes(t.memory_bytes)}, {len(t.cores)} cores, {len(t.pus)} PUs)  [{t.source}]"]
    cores_per_l3 = Counter(c.l3 for c in t.cores)
    logical_node = {n.id: i for i, n in enumerate(t.numa_nodes)}
    shown = 0
    label = "L3" if t.l3_known else "Domain"

    def node_line(indent: str, nid: int) -> str:
        node = t.node_by_id[nid]
        return f"{indent}NUMANode L#{logical_node[nid]} (P#{nid}, {human_bytes(node.memory_bytes)})  cpus {cpulist.format(node.cpus)}"

    def l3_line(indent: str, d) -> str:
        size = human_bytes(d.size_bytes) if d.size_bytes else "size unknown"
        spans = f", spans NUMA nodes {cpulist.format(d.numa_nodes)}" if d.spans_nodes else ""
        return f"{indent}{label} L#{d.id} ({size}, {cores_per_l3[d.id]} cores{spans})  cpus {cpulist.format(d.cpus)}"

    for pi, pkg in enumerate(t.packages):
        lines.append(f"  Package L#{pi} (P#{pkg.id})  cpus {cpulist.format(pkg.cpus)}")
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
                if set(t.node_by_id[nid].cpus) & pkg_cpus:
                    lines.append(node_line("    ", nid))
                for d in domains:
                    if nid != d.numa_nodes[0]:
                        continue
                    shown += 1
                    if shown <= max_l3:
                        lines.append(l3_line("      ", d))
    if shown > max_l3:
        lines.append(f"      ... {shown - max_l3} more L3 domains (use --json for all)")
    for ni, node in enumerate(t.numa_nodes):
        if node.cpuless:
            lines.append(f"  NUMANode L#{ni} (P#{node.id}, {human_bytes(node.memory_bytes)}, {node.kind}, no CPUs)")
    if len(t.numa_nodes) > 1:
        ids = [n.id for n in t.numa_nodes]
        lines.append("  Distances (SLIT): " + "  ".join(f"{a}->" + ",".join(str(v) for v in row) for a, row in zip(ids, t.distances)))
    if t.allowed_cpus is not None:
        lines.append(f"  Allowed CPUs: {cpulist.format(t.allowed_cpus)}")
    for key, m in sorted(t.measurements.items()):
        lines.append(f"  Measured: {key} over {len(m['cpus'])} CPUs")
    return lines


def to_json(t: Topology) -> dict:
    cores_by_l3 = Counter(c.l3 for c in t.cores)
    return {
        "source": t.source,
        "fingerprint": t.fingerprint(),
        "summary": summary_line(t),
        "packages": len(t.packages),
        "package_list": [{"id": p.id, "cpus": list(p.cpus)} for p in t.packages],
        "numa_nodes": [
            {"id": n.id, "cpus": list(n.cpus), "memory_bytes": n.memory_bytes, "package": n.package,
             "cpuless": n.cpuless, "kind": n.kind}
            for n in t.numa_nodes
        ],
        "l3_domains": [
            {"id": d.id, "cpus": list(d.cpus), "numa_nodes": list(d.numa_nodes), "package": d.package,
             "size_bytes": d.size_bytes, "cores": cores_by_l3[d.id]}
            for d in t.l3_domains
        ],
        "l3_known": t.l3_known,
        "cores": len(t.cores),
        "core_list": [
            {"id": c.id, "os_index": c.os_index, "pus": list(c.pus), "numa_node": c.numa_node, "l3": c.l3, "package": c.package}
            for c in t.cores
        ],
        "pus": len(t.pus),
        "smt": t.smt,
        "memory_bytes": t.memory_bytes,
        "distances": [list(r) for r in t.distances],
        "allowed_cpus": list(t.allowed_cpus) if t.allowed_cpus is not None else None,
        "measurements": t.measurements,
    }
