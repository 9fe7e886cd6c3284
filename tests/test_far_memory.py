"""The far-memory study (bench --mem-variants): the variants' deployments on a machine with two CXL
nodes, the per-query slowdown against near memory with its interval and verdict, and a machine
without a far tier, where the command says so and runs nothing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from conftest import FIXTURES
from fixtures import hmat as H
from tilewise.bench import far_memory as F
from tilewise.errors import TilewiseError, UsageError
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


# ---- the workloads W1-W4: `tilewise workload W2 --mem-variants` (tune.far_memory) ---------------------

def _study(**kw):
    from tilewise.tune import far_memory as FM
    from tilewise.tune import workloads as wl

    return FM.Config("W2", wl.Params(records=1000), F.parse_variants(kw.pop("variants", "far,interleave,weighted")),
                     **kw)


def test_workload_variants_bind_one_tile(cxl2):
    from tilewise.tune import far_memory as FM

    vs = FM.variants(cxl2, _study(instance=1))
    assert [v.name for v in vs] == ["near", "far", "interleave", "weighted"]
    assert [(v.binding.mem_policy, v.binding.mem_nodes, v.binding.weights) for v in vs] == [
        ("membind", (1,), ()), ("membind", (3,), ()), ("interleave", (1, 3), ()),
        ("weighted-interleave", (1, 3), ((1, 14), (3, 1)))]
    assert len({v.binding.cpus for v in vs}) == 1 and set(vs[0].binding.cpus) <= set(cxl2.node_by_id[1].cpus)
    with pytest.raises(UsageError, match="instance 2 does not exist: the win plan has 2"):
        FM.variants(cxl2, _study(instance=2))
    with pytest.raises(UsageError, match="applies to the workloads W1, W2, W3, W4, not alloc"):
        FM.variants(cxl2, dataclasses.replace(_study(), workload="alloc"))


def test_workload_study_runs_every_variant_and_judges_it(cxl2, monkeypatch):
    """Each variant runs warm-up + timed runs under its own binding; the weights are set (through the
    change-and-undo layer: recorded here) only around the weighted variant's runs; the slowdown and
    verdict against near memory; a variant that computes another answer fails the study after writing."""
    from tilewise.tune import far_memory as FM
    from tilewise.tune import workloads as wl

    speed = {(1,): 1.0, (3,): 2.0, (1, 3): 1.5}
    calls, weights_live = [], []
    monkeypatch.setattr(FM, "check_binding", lambda b: None)  # this host may not allocate on nodes 1-3
    monkeypatch.setattr(FM, "ensure_mem_policy_supported", lambda p: None)
    admitted = []
    monkeypatch.setattr(FM, "admit_weights", admitted.append)  # up front, before the first variant runs

    def set_weights(session, ws):
        weights_live.append(tuple(ws))
        return [f"weighted interleave: {ws}"]

    monkeypatch.setattr(FM, "set_interleave_weights", set_weights)

    def runner(w, p, knobs, t, *, timeout, binding):
        calls.append((binding.mem_policy, binding.mem_nodes, len(weights_live)))
        k = sum(1 for c in calls if c[:2] == (binding.mem_policy, binding.mem_nodes))
        res = {"time_s": speed[binding.mem_nodes] * (1 + 0.01 * k), "result_rows": 10, "checksum": 99}
        return wl.RunResult(res, 0.1, knobs, {"ok": True, "checks": {"memory": {"got": binding.mem_policy}}}, True)

    written = []
    doc = FM.run(_study(instance=1, runs=3, warmup=1), cxl2, runner=runner, writer=lambda d: written.append(d["kind"]))
    assert doc["kind"] == "workload.far_memory" and doc["complete"] is True and doc["wrong_answers"] == []
    assert len(calls) == 16 and [c[2] for c in calls] == [0] * 12 + [1] * 4  # weights set for the weighted runs only
    assert weights_live == [((1, 14), (3, 1))] and admitted[0] == [(1, 14), (3, 1)]
    assert {v: len(r["times_s"]) for v, r in doc["variants"].items()} == {"near": 3, "far": 3, "interleave": 3, "weighted": 3}
    study = doc["far_memory"]["deployments"]["W2 win#1"]
    assert study["far"]["queries"]["W2"]["slowdown"] == pytest.approx(2.0, rel=0.02)
    assert study["far"]["queries"]["W2"]["verdict"].startswith("hurts")
    assert {m["name"] for m in doc["metrics"]} == {"W2/near/time", "W2/far/time", "W2/interleave/time", "W2/weighted/time"}
    assert len(written) >= 4
    from tilewise.results import report

    console = __import__("rich.console", fromlist=["Console"]).Console(record=True, width=200)
    report.render(doc, console)
    text = console.export_text()
    assert "far-memory study in tile win #1" in text and "hurts" in text and "membind:3" in text

    def wrong(w, p, knobs, t, *, timeout, binding):
        r = runner(w, p, knobs, t, timeout=timeout, binding=binding)
        if binding.mem_nodes == (3,):
            r.result["checksum"] = 98
        return r

    with pytest.raises(TilewiseError, match="another answer than near memory: far run 1: result_rows 10, checksum 98"):
        FM.run(_study(instance=1, variants="far", runs=2, warmup=0), cxl2, runner=wrong)


def test_workload_study_bad_input_and_no_far_tier(cli, tmp_path):
    from tilewise import topology

    if any(n.cpuless for n in topology.load(None).numa_nodes):
        pytest.skip("this machine has CPU-less memory nodes")
    out = tmp_path / "study"
    cp = cli("workload", "W2", "--mem-variants", "near,far", "--records", "1000", "--out", str(out))
    assert cp.returncode == 1 and cp.stderr.startswith("Error: no far memory tier for W2 in win") and "nothing was run" in cp.stderr
    assert cp.stderr.count("\n") == 1 and not out.exists()
    for args, msg in ((["T1", "--mem-variants", "near"], "--mem-variants applies to the workloads W1-W4, not T1"),
                      (["W2", "--mem-variants", "near", "--mem", "local"], "--mem-variants cannot be combined with --mem"),
                      (["W2", "--mem-variants", "near,faraway"], "--mem-variants: unknown variant faraway"),
                      (["W2", "--runs", "2"], "--runs applies to the tensor workloads")):
        cp = cli("workload", *args)
        assert cp.returncode == 2 and cp.stderr.startswith(f"Error: {msg}") and cp.stderr.count("\n") == 1, (args, cp.stderr)
    dry = cli("workload", "W3", "--mem-variants", "far,interleave", "--topology", str(FIXTURES / "epyc9654_cxl.xml"),
              "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert [(v["name"], v["binding"]["mem_policy"], v["binding"]["mem_nodes"]) for v in doc["variants"]] == [
        ("near", "membind", [0]), ("far", "membind", [1]), ("interleave", "interleave", [0, 1])]
