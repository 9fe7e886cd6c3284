"""`tilewise probe memory`: the initiator x target matrix. Pure parts on fixture machines (a CPU-less
CXL node, SNC with HBM nodes), the tool's output, the result kind (tables, CSV, heatmaps), and a tiny
real run on whatever machine runs the tests: every cell measured, every page on its target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilewise import native, topology
from tilewise.errors import UsageError
from tilewise.probes import memory as M
from tilewise.results.kinds import memory as K
from tilewise.results import report

FIX = Path(__file__).parent / "fixtures"
CXL = topology.load(str(FIX / "epyc9654_cxl.xml"))  # node 0: 96 cores SMT2; node 1: CPU-less CXL memory
SNC = topology.load(str(FIX / "spr8480x2_snc4.xml"))
CLI = [sys.executable, "-m", "tilewise"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


# ---- initiators, targets, thread counts (pure) ------------------------------------------------------

def test_default_initiators_are_nodes_with_cpus_and_targets_every_node_with_memory():
    inits, notes = M.choose_initiators(CXL, None, None, CXL.pus)
    assert [(i.name, i.node) for i in inits] == [("node 0", 0)]
    assert len(inits[0].cpus) == 96  # one thread per core unless --smt
    assert len(M.choose_initiators(CXL, None, None, CXL.pus, smt=True)[0][0].cpus) == 192
    targets, tnotes = M.choose_targets(CXL, None)
    assert targets == [0, 1] and not tnotes and not notes
    inits, _ = M.choose_initiators(SNC, None, None, SNC.pus)
    assert [i.node for i in inits] == list(range(8)) and all(len(i.cpus) == 14 for i in inits)


def test_initiators_limited_to_allowed_cpus_say_so():
    allowed = SNC.node_by_id[1].cpus
    inits, notes = M.choose_initiators(SNC, None, None, allowed)
    assert [i.node for i in inits] == [1]
    assert any("node 0 is not an initiator here" in n for n in notes)


def test_a_cpu_set_is_one_initiator():
    inits, _ = M.choose_initiators(CXL, None, "0-3", CXL.pus)
    assert [(i.name, i.node, i.cpus) for i in inits] == [("cpus 0-3", None, (0, 1, 2, 3))]
    whole = ",".join(map(str, CXL.node_by_id[0].cpus))
    assert M.choose_initiators(CXL, None, whole, CXL.pus)[0][0].node == 0


@pytest.mark.parametrize("nodes, cpus, msg", [
    ("1", None, "CPU-less node\\(s\\) cannot initiate"),
    ("7", None, "no such NUMA node|not in"),
    ("0", "0-3", "cannot be combined"),
    (None, "999", "not CPUs of this machine|not in"),
])
def test_bad_initiators(nodes, cpus, msg):
    with pytest.raises(UsageError, match=msg):
        M.choose_initiators(CXL, nodes, cpus, CXL.pus)


def test_initiator_whose_cpus_are_not_allowed():
    with pytest.raises(UsageError, match="may use none of node 0's CPUs"):
        M.choose_initiators(CXL, "0", None, [])


def test_targets_must_exist_have_memory_and_be_allowed():
    with pytest.raises(UsageError, match="no such NUMA node|not in"):
        M.choose_targets(CXL, "5")
    with pytest.raises(UsageError, match="may not allocate there"):
        M.choose_targets(CXL, "1", mems_allowed=[0])
    t, notes = M.choose_targets(CXL, None, mems_allowed=[0])
    assert t == [0] and "node 1 is not a target" in notes[0]
    nomem = topology.load("synthetic:Package:2 [NUMANode(memory=0)] L3Cache:1 Core:2 PU:1")
    with pytest.raises(UsageError, match="without memory cannot be a target"):
        M.choose_targets(nomem, "0")
    with pytest.raises(UsageError, match="no node with memory"):
        M.choose_targets(nomem, None)


@pytest.mark.parametrize("text, n, want", [(None, 1, [1]), (None, 2, [1, 2]), (None, 6, [1, 2, 4, 6]),
                                           (None, 8, [1, 2, 4, 8]), ("4,1,2,2", 8, [1, 2, 4])])
def test_thread_counts(text, n, want):
    assert M.thread_counts(text, n) == want


@pytest.mark.parametrize("text", ["0", "-1", "x", ",", "1,two"])
def test_bad_thread_counts(text):
    with pytest.raises(UsageError):
        M.thread_counts(text, 4)


def test_default_size_is_far_above_the_l3():
    size, why = M.default_size(CXL)
    assert size >= 8 * CXL.total_l3_bytes and size % 2**21 == 0 and "8x" in why


def test_emulation_is_recognised():
    assert "TCG" in M.emulation(None, "TCGTCGTCGTCG")
    assert "TCG" in M.emulation("model name\t: QEMU TCG CPU version 2.5+\n", None)
    assert M.emulation("model name\t: AMD EPYC\n", "KVMKVMKVM") is None


# ---- the tool's output (pure) ----------------------------------------------------------------------

GOOD = """info page_bytes 4096
info hugepages madvise
info hypervisor none
placement before target=1 pages=16384 on_target=16384 other=- missing=0 policy=bind:1 maps=1:16384
result latency 1 120.5 118.0 119.0 125.0 ns 3 1000
values latency 1 119.0 120.5 125.0
result read_seq 1 10.0 11.0 9.5 10.8 GB/s 3 4
values read_seq 1 9.5 10.0 10.8
result read_seq 2 18.0 19.0 17.0 18.5 GB/s 3 8
values read_seq 2 17.0 18.0 18.5
result write_nt 0 nan nan nan nan GB/s 0 0
placement after target=1 pages=16384 on_target=16384 other=- missing=0 policy=bind:1 maps=1:16384
ok 0
"""


def test_parse_output_measured():
    r = M.parse_output(GOOD)
    assert r["status"] == "measured" and r["placement"]["before"]["policy"] == "bind:1"
    assert r["placement"]["after"]["numa_maps"] == {1: 16384}
    assert r["results"]["latency"]["1"]["median"] == 120.5 and r["results"]["latency"]["1"]["values"] == [119.0, 120.5, 125.0]
    assert set(r["results"]["read_seq"]) == {"1", "2"}
    assert r["results"]["write_nt"]["0"] == {"unsupported": True, "unit": "GB/s"}


def test_parse_output_not_measured_is_never_a_number():
    text = ("placement before target=2 pages=100 on_target=60 other=0:40 missing=0 policy=bind:0 maps=0:40,2:60\n"
            "not_measured 40 of 100 pages are not on node 2 (elsewhere: 0:40, not present: 0)\n")
    r = M.parse_output(text)
    assert r["status"] == "not_measured" and r["results"] == {} and "40 of 100" in r["reason"]
    assert r["placement"]["before"]["elsewhere"] == {0: 40} and r["placement"]["before"]["numa_maps"] == {0: 40, 2: 60}
    # numa_maps, the second view, disagrees with move_pages: not measured either
    text = ("placement before target=2 pages=100 on_target=100 other=- missing=0 policy=bind:2 maps=0:1,2:99\n"
            "not_measured /proc/self/numa_maps counts the buffer's pages as 0:1,2:99, not all 100 on node 2\n")
    assert M.parse_output(text)["status"] == "not_measured"


@pytest.mark.parametrize("text", ["", "result latency 1 1 1 1 1 ns 1 1\n",  # no verdict
                                  "result latency 1 1 1 1 1 ns 3 1\nok 0\n",  # measured without a page check
                                  "placement before target=1 pages=2 on_target=1 other=0:1 missing=0 policy=bind:1 maps=0:1,1:1\nok 0\n",
                                  # numa_maps counts a page elsewhere, yet the tool measured
                                  "placement before target=1 pages=2 on_target=2 other=- missing=0 policy=bind:1 maps=0:1,1:1\nok 0\n",
                                  # a tool that does not report numa_maps' counts
                                  "placement before target=1 pages=2 on_target=2 other=- missing=0 policy=bind:1\nok 0\n",
                                  "values read_seq 1 1.0\nok 0\n", "placement garbage\nok 0\n"])
def test_parse_output_refuses_incomplete_output(text):
    with pytest.raises(M.MemoryProbeError):
        M.parse_output(text)


# ---- the result kind (pure) -------------------------------------------------------------------------

def doc_of(cells, **extra) -> dict:
    from tilewise.results import model

    d = model.new("probe.memory", topo=CXL, params={}, environment={"topology": {}})
    d.update({"probe": "memory", "initiators": [{"name": "node 0", "node": 0, "cpus": [0, 1]}], "targets": [0, 1],
              "size_bytes": 2**28, "size_rule": "test", "tests": ["latency", "read_seq", "write_nt"], "cells": cells,
              "firmware": {}, "emulated": None, "notes": [], "references": []} | extra)
    return model.finish(d, complete=True)


def measured_cell(target: int) -> dict:
    return {"initiator": "node 0", "target": target, "threads": [1, 2], "size_bytes": 2**28} | M.parse_output(
        GOOD.replace(" target=1 ", f" target={target} ").replace("bind:1", f"bind:{target}").replace("maps=1:", f"maps={target}:"))


def test_result_kind_matrix_metrics_csv_and_heatmaps(tmp_path):
    missing = {"initiator": "node 0", "target": 1, "threads": [1, 2], "status": "not_measured",
               "reason": "40 of 100 pages are not on node 1"}
    d = doc_of([measured_cell(0), missing])
    t = K.KIND.view(d)  # the kind's typed document
    assert t.to_json() == d
    inits, targets, vals = K.grid(t, "read_seq")
    assert (inits, targets, vals) == (["node 0"], [0, 1], [[18.0, None]])  # best over thread counts; n/m stays None
    assert K.grid(t, "latency")[2] == [[120.5, None]]
    names = {m["name"]: m for m in K.metrics(t)}
    assert names["node 0->node 0/read_seq/2"]["values"] == [17.0, 18.0, 18.5]
    assert names["node 0->node 0/latency/1"]["better"] == "lower"
    assert not any("node 1" in n for n in names)
    csv = K.csv_files(t)["memory.csv"].splitlines()
    assert csv[0].startswith("initiator,target,status") and any("not_measured" in ln and "40 of 100" in ln for ln in csv)
    from rich.console import Console

    con = Console(record=True, width=160)
    report.render(d, con)
    text = con.export_text()
    assert "n/m" in text and "18.00" in text and "not_measured" in text
    paths = K.plots(t, tmp_path)
    assert sorted(p.name for p in paths) == ["memory_latency.png", "memory_read_seq.png"]  # write_nt unsupported: none
    assert all(p.stat().st_size > 1000 for p in paths)


def test_emulated_documents_say_so_everywhere():
    d = doc_of([measured_cell(0)], emulated="QEMU TCG (emulated CPU): times are the emulator's, not the memory's")
    assert any("emulator" in w for w in M.warnings(d))
    from rich.console import Console

    con = Console(record=True, width=160)
    K.render(K.KIND.view(d), con)
    assert "EMULATED" in con.export_text()
    paths = {m["name"] for m in K.metrics(K.KIND.view(d))}
    assert paths  # the figures are kept (raw), marked in the document
    assert M.measured_paths(d)[(0, 0)]["trusted"] is False


def test_measured_paths_feed_the_tier_decisions():
    d = doc_of([measured_cell(0), measured_cell(1)])
    p = M.measured_paths(d)
    assert p[(0, 1)] == {"latency_ns": 120.5, "read_bw_gbs": 18.0, "trusted": True, "why_untrusted": None}


# ---- the tool and the command, for real on this machine ---------------------------------------------

def tool() -> str:
    try:
        return native.binary("tw_memory")
    except UsageError as e:
        pytest.skip(str(e))


def test_tool_refuses_a_node_that_does_not_exist():
    cp = subprocess.run([tool(), "--target", "4095", "--size", str(2**21)], capture_output=True, text=True)
    assert cp.returncode == 0 and cp.stdout.startswith("not_measured node 4095 does not exist")


def test_tool_bad_arguments_are_one_error_line():
    cp = subprocess.run([tool(), "--target", "0", "--size", "10"], capture_output=True, text=True)
    assert cp.returncode == 2 and cp.stderr.strip() == "error: --size must be at least 1 MiB"
    cp = subprocess.run([tool(), "--target", "0", "--size", str(2**21), "--threads", "4096"], capture_output=True, text=True)
    assert cp.returncode == 2 and "this process may use" in cp.stderr


def test_probe_memory_end_to_end(tmp_path):
    """Every initiator x target of this machine measured at tiny scale, every page on its target,
    bound there; written, re-read and rendered by `tilewise report`."""
    tool()
    out = tmp_path / "mem"
    cp = cli("probe", "memory", "--size", "64MiB", "--reps", "2", "--min-ms", "5", "--threads", "1",
             "--tests", "latency,read_seq,write", "--json", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    live = topology.load(None)
    allowed = set(os.sched_getaffinity(0))
    want_inits = [n.id for n in live.cpu_nodes if set(n.cpus) & allowed]
    assert [i["node"] for i in doc["initiators"]] == want_inits
    assert len(doc["cells"]) == len(want_inits) * len(doc["targets"]) >= 1
    for c in doc["cells"]:
        assert c["status"] == "measured", c
        for when in ("before", "after"):
            p = c["placement"][when]
            assert p["pages"] == 64 * 256 and p["on_target"] == p["pages"] and p["policy"] == f"bind:{c['target']}"
            assert p["numa_maps"] == {str(c["target"]): p["pages"]}  # the kernel's page counts agree (JSON keys)
        lat = c["results"]["latency"]["1"]
        assert 1 < lat["median"] < 100000 and len(lat["values"]) == 1
        assert c["results"]["read_seq"]["1"]["median"] > 0 and c["results"]["write"]["1"]["median"] > 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["memory.csv", "memory.json", "memory_latency.png", "memory_read_seq.png", "memory_write.png"]
    again = cli("report", str(out))
    assert again.returncode == 0 and "idle load latency" in again.stdout and "bind:" in again.stdout


@pytest.mark.parametrize("args, msg", [
    (["--initiators", "4095"], "no such NUMA node|not in"),
    (["--targets", "4095"], "no such NUMA node|not in"),
    (["--tests", "latency,foo"], "unknown test foo"),
    (["--size", "1MiB"], "--size 1MiB: at least"),
    (["--threads", "0"], "--threads 0"),
    (["--reps", "1"], "out of range"),
])
def test_probe_memory_bad_input_is_one_error_line(args, msg):
    cp = cli("probe", "memory", *args)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in cp.stderr
    import re

    assert re.search(msg, lines[0]), lines[0]


def test_topo_measure_memory_keeps_the_figures_in_the_topology(tmp_path):
    """`topo --measure-memory --export`: every node with CPUs x every memory node measured here, kept as
    memattrs in the JSON and in the hwloc XML, and read back from it."""
    tool()
    out = tmp_path / "here.xml"
    cp = cli("topo", "--measure-memory", "--json", "--export", str(out))
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    live = topology.load(None)
    lat = doc["memattrs"]["tilewise:MeasuredLatency"]["values"]
    want = {(n.id, m.id) for n in live.cpu_nodes for m in live.numa_nodes if m.memory_bytes > 0}
    node_of = {live.node_by_id[n].cpus: n for n, _ in want}
    from tilewise import cpulist

    got = {(node_of[cpulist.parse(v["initiator_cpus"])], v["target_node"]) for v in lat}
    assert got == want and all(v["value"] > 0 for v in lat)
    assert {v["value"] for v in doc["memattrs"]["tilewise:MeasuredTrusted"]["values"]} <= {0, 1}
    assert doc["memory_tiers"] and any("measured memory" in n for n in doc["measure_notes"])
    back = topology.load(str(out))
    assert len(back.memattrs["tilewise:MeasuredReadBandwidth"]["values"]) == len(want)
