"""`tilewise bench elastic` end to end at a tiny scale (SF 0.01, 1 s per case), and its use case
(elastic.experiment.run) refusing bad input before anything is generated, started or written."""

import json
import os

import pytest

from conftest import elastic_groups, run_cli, wait_gone
from tilewise.elastic import experiment
from tilewise.errors import UsageError


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_bench_elastic_tiny(tmp_path):
    out = tmp_path / "out"
    groups_before = elastic_groups()  # groups other runs on this machine left are not this test's
    cp = run_cli("bench", "elastic", "--sf", "0.01", "--clients", "2", "--duration", "1", "--workloads", "q6",
                 "--configs", "os,adaptive", "--out", str(out), "--data-dir", str(tmp_path / "data"), "--json",
                 env={"TILEWISE_STATE_DIR": str(tmp_path / "state")}, timeout=240)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["format"] == "tilewise-results" and doc["kind"] == "elastic" and doc["complete"]
    assert {m["name"] for m in doc["metrics"]} >= {"q6/os/throughput", "q6/adaptive/throughput"}
    os_case, el = doc["cases"]
    assert os_case["config"] == "os" and el["config"] == "adaptive"
    for c in (os_case, el):
        assert c["queries_done"] > 0 and c["cpu_s"] > 0 and c["latency_ms"]["p50"] > 0
        assert list(c["per_query_ms"]) == ["6"]
    assert el["daemon"]["ticks"] >= 5 and 1 <= el["cores_mean"] <= el["cores_total"]
    assert os_case["cores_mean"] == os_case["cores_total"]
    assert (out / "elastic.png").stat().st_size > 1000
    log = out / "logs" / "q6-adaptive.jsonl"  # the daemon's log: a results document of kind elastic.log
    lines = log.read_text().splitlines()
    head, end = json.loads(lines[0]), json.loads(lines[-1])
    assert (head["kind"], head["params"]["mode"], end["event"]) == ("elastic.log", "adaptive", "end")
    cp = run_cli("report", str(log))
    assert cp.returncode == 0 and f"{el['daemon']['ticks']} ticks" in cp.stdout, cp.stderr
    journals = tmp_path / "state" / "journals"
    assert journals.is_dir() and not list(journals.glob("*.json"))  # the run journaled its changes, then undid them
    assert elastic_groups() <= groups_before  # the group it made is gone


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_bench_elastic_manages_a_process_per_connection_server(tmp_path, forking_env, tpch_sf001):
    """The instance is a process tree (the stand-in forks a child per connection, which runs the
    queries): the daemon manages the child too, the CPU it used is counted, the load steps are timed."""
    out = tmp_path / "out"
    cp = run_cli("bench", "elastic", "--engine", "forking", "--sf", "0.01", "--clients", "2", "--duration", "1.5",
                 "--idle", "0.5", "--workloads", "mixed", "--queries", "1,6", "--configs", "os,dense", "--out", str(out),
                 "--data-dir", str(tpch_sf001), "--json", env=forking_env, timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["params"]["engine"] == "forking" and doc["params"]["queries"] == [1, 6]
    static, el = doc["cases"]
    for c in (static, el):
        assert c["queries_done"] > 0 and set(c["per_query_ms"]) <= {"1", "6"}
        assert c["processes_max"] >= 2  # the server and the child serving the clients' connection
        assert c["cpu_s"] > 0.1 and c["cores_used_mean"] > 0  # the child's CPU (the queries run there) counted
        assert all(len(x) == 4 for x in c["timeline"])
    assert static["reaction"] is None and static["enforce"] == "none (static)"
    assert el["reaction"]["up"]["ticks"] >= 1 and el["enforce"] in ("affinity", "cgroup-v1", "cgroup-v2", "cgroup-v2 in place")
    assert {m["name"] for m in doc["metrics"]} >= {"mixed/dense/core_seconds", "mixed/dense/reaction_up"}
    assert not wait_gone("TILEWISE_TEST_TAG", forking_env["TILEWISE_TEST_TAG"]), "engine processes left behind"


@pytest.mark.parametrize("kw, message", [
    ({"th_min": 70.0, "th_max": 70.0}, "--th-min must be below --th-max"),
    ({"workloads": "q6,nope"}, "unknown workload"),
    ({"configs": "os,nope"}, "unknown config"),
    ({"topology_src": "synthetic:Package:1 [NUMANode] L3Cache:1 Core:2 PU:1"}, "needs this machine's topology"),
])
def test_run_refuses_before_any_data_or_process(tmp_path, kw, message):
    cfg = experiment.Config(data_dir=str(tmp_path / "data"), out=str(tmp_path / "out"), **kw)
    with pytest.raises(UsageError, match=message):
        experiment.run(cfg)
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()
