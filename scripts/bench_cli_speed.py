#!/usr/bin/env python3
"""Benchmark: wall time of `tilewise topo` and `tilewise plan` on a 512-PU topology (budget: 0.5 s).

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
        cases = {
            "topo synthetic": [exe, "topo", "--topology", SYNTH],
            "topo xml": [exe, "topo", "--topology", xml],
            "topo xml --json": [exe, "topo", "--topology", xml, "--json"],
            "plan wicp xml": [exe, "plan", "--topology", xml, "--policy", "wicp"],
            "plan auto xml --json": [exe, "plan", "--topology", xml, "--json"],
            "plan wic synthetic": [exe, "plan", "--topology", SYNTH, "--policy", "wic"],
            "topo (this machine)": [exe, "topo"],
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
