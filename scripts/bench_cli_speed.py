#!/usr/bin/env python3
"""Benchmark: wall time of `tilewise topo` and `tilewise plan` on a 512-PU topology, and of loading a
24-node, 4,096-PU hwloc export with a full distance matrix and memory attributes (budget: 0.5 s each).

Runs each command as a user would (a fresh process each time), after one warm-up, and prints the
median and spread of N runs' wall time, and the median CPU time (user + system) of the command's
process, which other work on the machine disturbs less than its wall time. The "load ... in-process"
rows time `topology.load` alone in this interpreter (no start-up, no imports, no printing).
Usage: scripts/bench_cli_speed.py [--runs 10] [--only SUBSTRING] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of each run of argv, after one warm-up."""
    subprocess.run(argv, check=True, capture_output=True)  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = _children_cpu(), time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        wall.append(time.perf_counter() - t0)
        cpu.append(_children_cpu() - c0)
    return wall, cpu


def timed_load(src: str, runs: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of topology.load(src) in this process, after one warm-up."""
    from tilewise import topology

    topology.load(src)
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        topology.load(src)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--only", default="", metavar="SUBSTRING", help="only the cases whose name contains it")
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
        loads = {"load 512-PU xml in-process": xml, "load 24-node 4096-PU in-process": big}
        rows = {}
        for name in [n for n in (*cases, *loads) if a.only in n]:
            wall, cpu = timed(cases[name], a.runs) if name in cases else timed_load(loads[name], a.runs)
            rows[name] = {"median_s": statistics.median(wall), "min_s": min(wall), "max_s": max(wall),
                          "cpu_median_s": statistics.median(cpu), "runs": a.runs}
    load = os.getloadavg()
    if a.json:
        json.dump({"cases": rows, "loadavg": load, "cpus": os.cpu_count()}, sys.stdout, indent=2)
        print()
        return
    print(f"{'command':32} {'median':>8} {'min':>8} {'max':>8} {'cpu':>8}   (seconds; budget 0.5 s, {a.runs} runs)")
    for name, r in rows.items():
        flag = "" if r["median_s"] < 0.5 else "  OVER BUDGET"
        print(f"{name:32} {r['median_s']:8.3f} {r['min_s']:8.3f} {r['max_s']:8.3f} {r['cpu_median_s']:8.3f}{flag}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPU(s)"
          + ("  (the machine is busy: wall times are not trustworthy)" if load[0] > 0.5 * (os.cpu_count() or 1) else ""))


if __name__ == "__main__":
    main()
