"""Pure parts of the probes: pair classes, sampling, grouping a matrix by the topology, STREAM maths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tilewise import plan, topology
from tilewise.errors import UsageError
from tilewise.probes import pairs
from tilewise.probes.stream import aggregate

FIX = Path(__file__).resolve().parent / "fixtures"
# 2 packages, each one NUMA node with 2 L3 domains of 2 cores of 2 PUs: every class exists
SMALL = "synthetic:Package:2 [NUMANode(memory=8GB)] L3Cache:2(size=32MB) Core:2 PU:2"
CLASS_VALUE = {"smt": 10.0, "l3": 20.0, "node": 80.0, "package": 150.0, "remote": 200.0}


def synthetic_matrix(t, cpus):
    return [[0.0 if a == b else CLASS_VALUE[pairs.pair_class(t, a, b)] + (0.5 if a < b else -0.5) for b in cpus]
            for a in cpus]


def test_pair_classes_on_loaded_topology():
    t = topology.load(SMALL)
    c0 = t.cores[0]
    sib = c0.pus[1]
    same_l3 = next(c for c in t.cores if c.l3 == c0.l3 and c.id != c0.id).pus[0]
    other_l3 = next(c for c in t.cores if c.l3 != c0.l3 and c.numa_node == c0.numa_node).pus[0]
    remote = next(c for c in t.cores if c.package != c0.package).pus[0]
    assert pairs.pair_class(t, c0.pus[0], sib) == "smt"
    assert pairs.pair_class(t, c0.pus[0], same_l3) == "l3"
    assert pairs.pair_class(t, c0.pus[0], other_l3) == "node"
    assert pairs.pair_class(t, c0.pus[0], remote) == "remote"
    with pytest.raises(UsageError):
        pairs.pair_class(t, 0, 9999)


def test_group_matrix_means_per_class():
    t = topology.load(SMALL)
    cpus = list(t.pus)
    g = pairs.group_matrix(t, cpus, synthetic_matrix(t, cpus))
    assert set(g) == {"smt", "l3", "node", "remote"}  # no "package" class: one node per package
    for cls, s in g.items():
        assert s["mean"] == pytest.approx(CLASS_VALUE[cls])  # +-0.5 cancel out over ordered pairs
        assert s["min"] == CLASS_VALUE[cls] - 0.5 and s["max"] == CLASS_VALUE[cls] + 0.5
    n = len(cpus)
    assert sum(s["pairs"] for s in g.values()) == n * (n - 1)
    assert g["smt"]["pairs"] == 16  # 8 cores, 2 ordered sibling pairs each


def test_group_matrix_skips_unmeasured_and_checks_shape():
    t = topology.load(SMALL)
    cpus = list(t.pus)
    m = synthetic_matrix(t, cpus)
    for i in range(len(cpus)):
        for j in range(len(cpus)):
            if pairs.pair_class(t, cpus[i], cpus[j]) == "remote":
                m[i][j] = None if (i + j) % 2 else 0.0
    g = pairs.group_matrix(t, cpus, m)
    assert "remote" not in g
    with pytest.raises(UsageError):
        pairs.group_matrix(t, cpus, m[:-1])


def test_snc_machine_has_package_class():
    t = topology.load(str(FIX / "spr8480x2_snc4.xml"))
    cpus = [c.pus[0] for c in t.cores]
    g = pairs.group_matrix(t, cpus, synthetic_matrix(t, cpus))
    assert g["package"]["mean"] == pytest.approx(150.0)
    assert g["remote"]["mean"] == pytest.approx(200.0)


def test_sampling_on_a_big_machine_covers_every_class_and_every_block():
    t = topology.load(str(FIX / "epyc7713x2.xml"))
    cpus = list(t.pus)
    chosen, desc = pairs.select_pairs(t, cpus)
    n = len(cpus)
    assert len(chosen) < n * (n - 1) and "sampled" in desc
    assert {pairs.pair_class(t, a, b) for a, b in chosen} == {"smt", "l3", "node", "remote"}
    blocks = {(t.core_of_cpu[a].l3, t.core_of_cpu[b].l3) for a, b in chosen}
    assert len(blocks) == len(t.l3_domains) ** 2
    assert all(a != b for a, b in chosen) and len(set(chosen)) == len(chosen)
    again, _ = pairs.select_pairs(t, cpus)
    assert again == chosen  # deterministic
    full, desc = pairs.select_pairs(t, cpus[:20], full=True)
    assert len(full) == 20 * 19 and desc.startswith("all")


def test_sampling_needs_two_cpus():
    t = topology.load(SMALL)
    with pytest.raises(UsageError, match="two CPUs"):
        pairs.select_pairs(t, [0])


def test_measurement_form_never_has_nan_or_none():
    m = pairs.to_measurement([0, 1, 2], [[5.0, None, 3.0], [float("nan"), 7.0, 1.0], [2.0, 2.0, 0.0]])
    assert m["cpus"] == [0, 1, 2]
    assert [m["values"][i][i] for i in range(3)] == [0.0, 0.0, 0.0]
    assert m["values"][0][1] == 0.0 and m["values"][1][0] == 0.0
    assert all(not math.isnan(v) for r in m["values"] for v in r)


def test_auto_plan_reads_a_synthetic_measured_matrix():
    t = topology.load("synthetic:Package:1 [NUMANode(memory=64GB)] L3Cache:4(size=32MB) Core:4 PU:1")
    cpus = list(t.pus)
    chiplet = [[0.0 if a == b else (25.0 if pairs.pair_class(t, a, b) == "l3" else 110.0) for b in cpus] for a in cpus]
    t.measurements["latency_ns"] = pairs.to_measurement(cpus, chiplet)
    assert plan.measured_chiplet_ratio(t) == pytest.approx(110 / 25)
    assert plan.plan(t, "auto").policy == "wicp"
    flat = [[0.0 if a == b else 50.0 for b in cpus] for a in cpus]
    t.measurements["latency_ns"] = pairs.to_measurement(cpus, flat)
    assert plan.plan(t, "auto").policy != "wicp"


def test_stream_aggregate_uses_first_start_to_last_end():
    # two processes, 3 repetitions; repetition 0 is a warm-up and is ignored
    p1 = "\n".join(f"{k} {r} {1000 * r} {1000 * r + 100} 1000" for r in range(3) for k in ("copy", "scale", "add", "triad"))
    p2 = "\n".join(f"{k} {r} {1000 * r + 50} {1000 * r + 200} 3000" for r in range(3) for k in ("copy", "scale", "add", "triad"))
    agg = aggregate([p1 + "\nok 1\n", p2 + "\nok 1\n"], 3)
    # (1000 + 3000) bytes over 200 ns = 20 bytes/ns = 20 GB/s
    assert agg["kernels"]["copy"]["best_gbs"] == pytest.approx(20.0)
    assert len(agg["kernels"]["triad"]["reps"]) == 2
    with pytest.raises(Exception, match="validate"):
        aggregate([p1 + "\nbad 1\n"], 3)
