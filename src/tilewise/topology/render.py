"""Readable views of a topology: a summary line, a compact tree, and the JSON document."""

from __future__ import annotations

from collections import Counter, defaultdict

from tilewise import cpulist
from tilewise.topology.model import Topology


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
    nodes = _plural(len(t.numa_nodes), "NUMA node")
    cpuless = sum(1 for n in t.numa_nodes if n.cpuless)
    if cpuless:
        nodes += f" ({cpuless} CPU-less)"
    parts.append(nodes)
    per_l3 = Counter(sum(1 for c in t.cores if c.l3 == d.id) for d in t.l3_domains)
    sizes = " + ".join(f"{k} x {_plural(v, 'core')}" for v, k in sorted(per_l3.items(), key=lambda kv: -kv[1]))
    word = "chiplet" if t.l3_known else "node-wide domain"
    if len(per_l3) == 1:
        (v, k), = per_l3.items()
        parts.append(f"{k} {word}{'s' if k != 1 else ''} x {_plural(v, 'core')}")
    else:
        parts.append(f"{len(t.l3_domains)} {word}s ({sizes})")
    parts.append(f"SMT{t.smt}" if t.smt > 1 else "no SMT")
    parts.append(human_bytes(t.memory_bytes))
    return ", ".join(parts)


def tree_lines(t: Topology, max_l3: int = 64) -> list[str]:
    """Compact tree: Package > NUMANode > L3 with logical and OS indexes."""
    lines = [f"Machine ({human_bytes(t.memory_bytes)}, {len(t.cores)} cores, {len(t.pus)} PUs)  [{t.source}]"]
    l3_by_node: dict[int, list] = defaultdict(list)
    for d in t.l3_domains:
        l3_by_node[d.numa_node].append(d)
    cores_per_l3 = Counter(c.l3 for c in t.cores)
    shown = 0
    for pi, pkg in enumerate(t.packages):
        lines.append(f"  Package L#{pi} (P#{pkg.id})  cpus {cpulist.format(pkg.cpus)}")
        for ni, node in enumerate(t.numa_nodes):
            if node.cpuless or node.package != pkg.id:
                continue
            lines.append(f"    NUMANode L#{ni} (P#{node.id}, {human_bytes(node.memory_bytes)})  cpus {cpulist.format(node.cpus)}")
            for d in l3_by_node[node.id]:
                shown += 1
                if shown > max_l3:
                    continue
                size = human_bytes(d.size_bytes) if d.size_bytes else "size unknown"
                label = "L3" if t.l3_known else "Domain"
                lines.append(f"      {label} L#{d.id} ({size}, {cores_per_l3[d.id]} cores)  cpus {cpulist.format(d.cpus)}")
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
            {"id": d.id, "cpus": list(d.cpus), "numa_node": d.numa_node, "package": d.package,
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
