"""Thread placement orders, memory policy specs, the `tilewise workload` command end to end."""

from __future__ import annotations

import json

import pytest

from tilewise import topology
from tilewise.errors import UsageError
from tilewise.tune import knobs

EPYC = "synthetic:Package:2 [NUMANode(memory=256GB)] L3Cache:2(size=32MB) Core:2 PU:2"


@pytest.fixture
def epyc():
    return topology.load(EPYC)


def _node_l3(t, cpu):
    c = t.core_of_cpu[cpu]
    return c.numa_node, c.l3


def test_dense_fills_an_l3_then_a_node(epyc):
    order = knobs.thread_order(epyc, "dense", 8)
    where = [_node_l3(epyc, c) for c in order]
    assert where[:2] == [where[0]] * 2  # one L3 first
    assert {n for n, _ in where[:4]} == {where[0][0]}  # then the rest of the node
    assert len(set(order)) == 8 and all(epyc.core_of_cpu[c].pus[0] == c for c in order)  # physical cores first


def test_sparse_round_robins_nodes_then_l3s(epyc):
    order = knobs.thread_order(epyc, "sparse", 4)
    where = [_node_l3(epyc, c) for c in order]
    assert [n for n, _ in where] == [where[0][0], where[1][0]] * 2 and where[0][0] != where[1][0]
    assert len({l3 for _, l3 in where}) == 4  # four threads on four different L3s


def test_smt_siblings_after_all_cores_and_wraparound(epyc):
    order = knobs.thread_order(epyc, "dense", 20)
    assert set(order[:8]) == {c.pus[0] for c in epyc.cores}
    assert set(order[8:16]) == {c.pus[1] for c in epyc.cores}
    assert order[16:] == order[:4]


def test_placement_none_and_allowed_cpus(epyc):
    assert knobs.thread_order(epyc, "none", 4) is None
    allowed = {c.pus[0] for c in epyc.cores[:2]}
    assert set(knobs.thread_order(epyc, "sparse", 4, allowed)) == allowed
    with pytest.raises(UsageError):
        knobs.thread_order(epyc, "diagonal", 4)


def test_memory_policy_specs(epyc):
    assert knobs.parse_mem("interleave", epyc) == ("interleave", (0, 1))
    assert knobs.parse_mem("localalloc", epyc) == ("local", ())
    assert knobs.parse_mem("preferred:1", epyc) == ("preferred", (1,))
    assert knobs.parse_mem("membind:0", epyc) == ("membind", (0,))
    assert knobs.parse_mem("first-touch", epyc) == ("first-touch", ())
    for bad in ("membind:7", "preferred:0-1", "sideways", "local:0"):
        with pytest.raises(UsageError):
            knobs.parse_mem(bad, epyc)
    assert knobs.split_list("interleave:0,1,first-touch,membind:0-1") == ["interleave:0,1", "first-touch", "membind:0-1"]


def test_config_file_round_trip_and_version_check(tmp_path):
    cfg = knobs.Config("jemalloc", "interleave", (0, 1), "sparse", "never", "0")
    p = tmp_path / "tuned.json"
    knobs.save_config(str(p), knobs.TunedFile(cfg, {"workload": "W1"}, {"median_s": 1.0}))
    assert knobs.load_config(str(p)).config == cfg
    doc = json.loads(p.read_text())
    doc["version"] = 99
    p.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="version"):
        knobs.load_config(str(p))


def test_reproduce_line_uses_numactl_and_preload():
    cfg = knobs.Config("system", "interleave", (0, 1))
    assert cfg.reproduce_env(["./x", "a b"]) == "numactl --interleave=0-1 ./x 'a b'"


def test_cli_workload_json(cli):
    cp = cli("workload", "W2", "--records", "20K", "--groups", "100", "--mem", "interleave", "--placement", "sparse", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    r = doc["result"]
    assert r["workload"] == "W2" and r["records"] == 20000 and r["result_rows"] == 100
    assert doc["config"]["mem"] == "interleave" and r["pinned_cpus"] != ""
    assert doc["verification"]["mem_policy"].startswith("interleave")
    assert set(doc["os_switches"]) == {"thp", "autonuma"}


def test_cli_workload_readable_and_errors(cli):
    cp = cli("workload", "alloc", "--ops", "20K", "--slots", "1000")
    assert cp.returncode == 0, cp.stderr
    assert "overhead" in cp.stdout and "allocator  system" in cp.stdout
    cp = cli("workload", "W9")
    assert cp.returncode == 2 and cp.stderr.startswith("Error: unknown workload") and "Traceback" not in cp.stderr
    cp = cli("workload", "W3", "--groups", "10")
    assert cp.returncode == 2 and "--groups" in cp.stderr
    cp = cli("workload", "W1", "--thp", "never")
    assert cp.returncode == 2 and "--apply-os" in cp.stderr


def test_cli_workload_dry_run_on_a_loaded_topology(cli):
    cp = cli("workload", "W1", "--dry-run", "--topology", EPYC, "--placement", "sparse", "--threads", "4", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert len(doc["pin"]) == 4 and "--pin" in doc["argv"]
