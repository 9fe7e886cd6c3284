"""The far-memory study (bench --mem-variants): the variants' deployments on a machine with two CXL
nodes, the per-query slowdown against near memory with its interval and verdict, and a machine
without a far tier, where the command says so and runs nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fixtures import hmat as H
from tilewise.bench import far_memory as F
from tilewise.errors import UsageError
from tilewise.topology import sysfs


@pytest.fixture(scope="module")
def cxl2(tmp_path_factory):
    root = H.write(H.epyc9654x2_cxl2(), tmp_path_factory.mktemp("cxl2"))
    return sysfs.load(root / "devices" / "system")


def test_variants_are_deployments_of_their_own(cxl2):
    plans = dict(F.variant_plans(cxl2, "win", "win", None, False, F.parse_variants("far,interleave,weighted")))
    assert list(plans) == ["win:near", "win:far", "win:interleave", "win:weighted"]  # near always first
    mem = {k: [(i.mem_policy, i.mem_nodes, i.weights) for i in p.instances] for k, p in plans.items()}
    assert mem["win:near"] == [("membind", (0,), {}), ("membind", (1,), {})]
    assert mem["win:far"] == [("membind", (2,), {}), ("membind", (3,), {})]
    assert mem["win:interleave"] == [("interleave", (0, 2), {}), ("interleave", (1, 3), {})]
    assert mem["win:weighted"] == [("weighted-interleave", (0, 2), {0: 7, 2: 1}), ("weighted-interleave", (1, 3), {1: 14, 3: 1})]
    assert all(p.instances[0].cpus == plans["win:near"].instances[0].cpus for p in plans.values())


def test_one_instance_over_both_sockets_gets_both_cxl_nodes(cxl2):
    (_, near), (_, far) = F.variant_plans(cxl2, "wim", "wim", None, False, ("near", "far"))
    assert near.instances[0].far_nodes == (2, 3) and far.instances[0].mem_nodes == (2, 3)


def test_instances_without_a_far_tier_are_refused(tmp_path):
    spec = H.epyc9654x2_cxl2()  # the same machine with one expander, on socket 0 only
    m = spec.machine
    m.node_mem_gib.pop(3)
    m.distances = [row[:3] for row in m.distances[:3]]
    spec.hmat.pop(3)
    spec.tiers = {4: (0, 1), 5: (2,)}
    root = H.write(spec, tmp_path)
    t = sysfs.load(root / "devices" / "system")
    with pytest.raises(UsageError, match="instance\\(s\\) 1 have no far tier \\(only 1 of 2 have\\)"):
        F.variant_plans(t, "win", "win", None, False, ("near", "far"))


def rec(times: dict) -> dict:
    return {"queries": {q: {"times_s": t} for q, t in times.items()}}


def test_slowdown_interval_and_verdict():
    doc = {"policies": {
        "win:near": rec({"q1": [1.0, 1.02, 0.98], "q6": [0.5, 0.51, 0.49], "q9": [2.0, 2.0, 2.0]}),
        "win:far": rec({"q1": [1.03, 1.05, 1.01], "q6": [1.0, 1.02, 0.98], "q9": [2.6, 2.1, 3.1]}),
        "win:weighted": rec({"q1": [1.0], "q6": [0.5], "q9": [2.0]}),
    }}
    s = F.summarize(doc)["deployments"]["win"]
    far = s["far"]["queries"]
    assert far["q1"]["verdict"].startswith("usable") and far["q1"]["slowdown"] == pytest.approx(1.03, rel=0.01)
    assert far["q6"]["verdict"].startswith("hurts") and far["q6"]["slowdown"] == pytest.approx(2.0, rel=0.01)
    assert far["q9"]["verdict"].startswith("costs") and far["q9"]["ci95"][0] < 1.25 < far["q9"]["ci95"][1]
    assert s["far"]["usable"] == ["q1"] and s["far"]["hurts"] == ["q6"]
    assert "geometric-mean slowdown" in s["far"]["verdict"]
    assert all(v["verdict"].startswith("one run") for v in s["weighted"]["queries"].values())


def test_bad_variants():
    with pytest.raises(UsageError, match="unknown variant far-away"):
        F.parse_variants("near,far-away")
    with pytest.raises(UsageError):
        F.parse_variants(" , ")


def test_no_far_tier_says_so_and_runs_nothing(tmp_path):
    from tilewise import topology

    t = topology.load(None)
    if any(n.cpuless for n in t.numa_nodes):
        pytest.skip("this machine has CPU-less memory nodes")
    out = tmp_path / "study"
    cp = subprocess.run([sys.executable, "-m", "tilewise", "bench", "tpch", "--sf", "0.01", "--policies", "wim",
                         "--mem-variants", "near,far", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 1 and cp.stderr.startswith("Error: no far memory tier for wim") and "nothing was run" in cp.stderr
    assert cp.stderr.count("\n") == 1 and not out.exists()
