#!/usr/bin/env python3
"""Benchmark: wall time of `tilewise topo` and `tilewise plan` on a 512-PU topology, and of loading a
24-node, 4,096-PU hwloc export with a full distance matrix and memory attributes (budget: 0.5 s each).

Runs each command as a user would (a fresh process each time), after one warm-up, and prints the
median and spread of N runs. Usage: scripts/bench_cli_speed.py [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SYNTH = "synthetic:Package:2 [NUMANode(memory=512GB)] L3Cache:16(size=32MB) Core:8 PU:2"  # 512 PUs


def big_numa_export(path: str) -> str:
    """A 24-node, 4,096-PU machine (2 packages of 12 nodes; 16 nodes of 88 cores and 8 of 80, SMT2,
    one L3 per node), its 24x24 SLIT and Bandwidth/Latency memory attributes for every (node,
    node) pair, written by tilewise and re-exported by Debian's lstopo when it is installed."""
    import shutil

    from tilewise.topology import hwloc_xml
    from tilewise.topology.build import RawNode, RawPU, build

    pus, nodes, cpu = [], [], 0
    for n in range(24):
        for k in range(88 if n < 16 else 80):
            pus += [RawPU(cpu + t, n // 12, ("core", n, k), k, n, ("l3", n)) for t in range(2)]
            cpu += 2
        nodes.append(RawNode(n, 64 * 2**30))
    slit = [[10 if i == j else (12 if i // 12 == j // 12 else 21) for j in range(24)] for i in range(24)]
    t = build(pus, nodes, distances=slit, l3_sizes={("l3", n): 32 * 2**20 for n in range(24)}, source="bench")
    t.memattrs.update({
        name: {"flags": flags, "values": [{"target_node": j, "initiator_cpus": list(t.node_by_id[i].cpus),
                                           "value": near if i == j else far} for i in range(24) for j in range(24)]}
        for name, flags, near, far in (("Bandwidth", 5, 100000, 40000), ("Latency", 6, 90, 140))})
    hwloc_xml.save(t, path)
    lstopo = shutil.which("lstopo-no-graphics")
    if lstopo:  # hwloc's own writing of it, as users pass such files around
        subprocess.run([lstopo, "--input", path, "--of", "xml", "-f", path], check=True, capture_output=True)
    return path


def timed(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, check=True, capture_output=True)  # warm-up
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    exe = os.path.join(os.path.dirname(sys.executable), "tilewise")
    with tempfile.TemporaryDirectory() as d:
        xml = os.path.join(d, "512.xml")
        subprocess.run([exe, "topo", "--topology", SYNTH, "--export", xml], check=True, capture_output=True)
        big = big_numa_export(os.path.join(d, "24x4096.xml"))
        cases = {
            "topo synthetic": [exe, "topo", "--topology", SYNTH],
            "topo xml": [exe, "topo", "--topology", xml],
            "topo xml --json": [exe, "topo", "--topology", xml, "--json"],
            "plan wicp xml": [exe, "plan", "--topology", xml, "--policy", "wicp"],
            "plan auto xml --json": [exe, "plan", "--topology", xml, "--json"],
            "plan wic synthetic": [exe, "plan", "--topology", SYNTH, "--policy", "wic"],
            "topo (this machine)": [exe, "topo"],
            "topo 24-node 4096-PU xml": [exe, "topo", "--topology", big],
            "topo 24-node 4096-PU --json": [exe, "topo", "--topology", big, "--json"],
            "plan auto 24-node 4096-PU": [exe, "plan", "--topology", big],
        }
        rows = {}
        for name, argv in cases.items():
            ts = timed(argv, a.runs)
            rows[name] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "runs": a.runs}
    if a.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(f"{'command':28} {'median':>8} {'min':>8} {'max':>8}   (budget 0.5 s, {a.runs} runs)")
    for name, r in rows.items():
        flag = "" if r["median_s"] < 0.5 else "  OVER BUDGET"
        print(f"{name:28} {r['median_s']:8.3f} {r['min_s']:8.3f} {r['max_s']:8.3f}{flag}")


if __name__ == "__main__":
    main()
