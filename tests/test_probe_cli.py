"""End-to-end probes at tiny sizes on 2 CPUs: shapes, sane ranges, files, round trip, bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from conftest import run_cli
from tilewise import native, topology

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
PAIR = f"{CPUS[0]},{CPUS[-1]}" if len(CPUS) >= 2 else "0"


def _json(cp):
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


@two_cpus
def test_latency_matrix_shape_range_and_files(tmp_path):
    doc = _json(run_cli("probe", "latency", "--cpus", PAIR, "--samples", "5", "--iters", "50", "--json",
                        "--out", str(tmp_path)))
    assert doc["format"] == "tilewise-results" and doc["kind"] == "probe.latency"
    assert doc["complete"] and doc["unit"] == "ns" and doc["metrics"]
    assert doc["cpus"] == [CPUS[0], CPUS[-1]]
    for mode in ("cas", "rw"):
        m = doc["matrices"][mode]
        assert len(m) == 2 and all(len(r) == 2 for r in m)
        assert m[0][0] == 0 and m[1][1] == 0
        for v in (m[0][1], m[1][0]):
            assert 0 < v < 10_000, f"{mode} latency {v} ns out of range"
        p10, p90 = doc["spread"][mode]["p10"][0][1], doc["spread"][mode]["p90"][0][1]
        assert p10 <= m[0][1] <= p90
        assert sum(s["pairs"] for s in doc["summary"][mode].values()) == 2
    assert len(doc["raw"]) == 4
    for name in ("latency.json", "latency_cas.csv", "latency_rw.csv", "latency_cas.png", "latency_rw.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = (tmp_path / "latency_cas.csv").read_text().splitlines()
    assert rows[0] == f"cpu,{CPUS[0]},{CPUS[-1]}" and len(rows) == 3


@two_cpus
def test_bandwidth_matrix_range():
    doc = _json(run_cli("probe", "bandwidth", "--cpus", PAIR, "--size", "64KiB", "--samples", "5", "--json"))
    m = doc["matrices"]["bw"]
    assert len(m) == 2 and m[0][0] == 0
    assert m[0][1] > 0.1 and m[1][0] > 0.1
    assert doc["written"] == []


@two_cpus
def test_stream_two_layouts(tmp_path):
    doc = _json(run_cli("probe", "stream", "--cpus", PAIR, "--policies", "wim,wic", "--sizes", "1MB,2MB",
                        "--ntimes", "3", "--json", "--out", str(tmp_path)))
    assert doc["complete"] and len(doc["cases"]) == 4
    by = {(c["policy"], c["size_bytes"]): c for c in doc["cases"]}
    assert by[("wim", 1_000_000)]["instances"] == 1 and by[("wic", 1_000_000)]["instances"] == 2
    for c in doc["cases"]:
        for k in ("copy", "scale", "add", "triad"):
            assert c["kernels"][k]["best_gbs"] > 0.1
            assert len(c["kernels"][k]["reps"]) == 2
        assert sum(len(i["cpus"]) for i in c["layout"]) == 2
    assert (tmp_path / "stream.png").stat().st_size > 0
    assert len((tmp_path / "stream.csv").read_text().splitlines()) == 5


@two_cpus
def test_topo_measure_export_round_trip_and_auto(tmp_path):
    xml = tmp_path / "m.xml"
    doc = _json(run_cli("topo", "--measure", "--export", str(xml), "--json"))
    assert doc["measure_notes"]
    t = topology.load(str(xml))
    for key in ("latency_ns", "bandwidth_gbs"):
        m = t.measurements[key]
        n = len(m["cpus"])
        assert n == len(CPUS) and len(m["values"]) == n
        for i, row in enumerate(m["values"]):
            assert row[i] == 0
            assert all(not math.isnan(v) and v >= 0 for v in row)
        assert m["values"][0][1] > 0
        # the XML keeps thousandths: within rounding of what was measured
        assert m["values"][0][1] == pytest.approx(doc["measurements"][key]["values"][0][1], abs=1e-3)
    p = _json(run_cli("plan", "--policy", "auto", "--topology", str(xml), "--json"))
    assert p["policy"] in ("wim", "win", "wicp", "wicp-mixed", "wic", "spread")


def test_bad_input_errors_are_one_line():
    cases = [
        (("probe", "latency", "--cpus", "9999"), "9999"),
        (("probe", "latency", "--cpus", "0-"), "--cpus"),
        (("probe", "latency", "--modes", "foo"), "foo"),
        (("probe", "bandwidth", "--size", "12parsecs"), "--size"),
        (("probe", "stream", "--policies", "bogus", "--sizes", "1MB"), "bogus"),
        (("probe", "stream", "--sizes", "abc"), "--sizes"),
        (("probe", "latency", "--topology", "synthetic:Package:2 [NUMANode] L3Cache:8 Core:8 PU:2"), "not this machine"),
        (("topo", "--measure", "--topology", "synthetic:Package:2 [NUMANode] L3Cache:8 Core:8 PU:2"), "this machine"),
    ]
    for args, needle in cases:
        cp = run_cli(*args)
        assert cp.returncode != 0, args
        lines = cp.stderr.strip().splitlines()
        assert lines and lines[-1].startswith("Error:") and needle in lines[-1], (args, cp.stderr)
        assert "Traceback" not in cp.stderr


def test_one_cpu_is_not_measured():
    cp = run_cli("probe", "latency", "--cpus", str(CPUS[0]))
    assert cp.returncode != 0 and "not measured" in cp.stderr and "Traceback" not in cp.stderr


def test_native_tools_reject_bad_pairs():
    for tool in ("tw_latency", "tw_bandwidth"):
        cp = subprocess.run([native.binary(tool)], input=f"{CPUS[0]} {CPUS[0]}\n", capture_output=True, text=True,
                            timeout=30)
        assert cp.returncode != 0 and "two different CPUs" in cp.stderr
    cp = subprocess.run([native.binary("tw_stream"), "--elements", "0"], capture_output=True, text=True, timeout=30)
    assert cp.returncode != 0 and "--elements" in cp.stderr
