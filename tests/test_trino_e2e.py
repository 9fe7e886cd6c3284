"""Trino end to end (marked trino: skipped when Trino is not installed, required under
TILEWISE_TRINO_E2E=1 as in CI): TPC-H queries through the harness (the typing cases by default, all
22 with --run-slow), every answer validated;
a detached cluster whose coordinator and workers are bound and verified, queried, and stopped by
`down` leaving nothing. SF 0.01, JVMs of 768 MiB - 1 GiB."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from conftest import run_cli, wait_gone
from tilewise import cluster, cpulist, plan, topology
from tilewise.benchmarks.tpch import queries as Q
from tilewise.benchmarks import validate
from tilewise.benchmarks.tpch import data as tpch_data

pytestmark = [pytest.mark.trino, pytest.mark.usefixtures("trino_ready")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("trino-data")
    return tpch_data.dataset(0.01, d)


# the typing cases (avg(decimal), decimal division: Q1, Q8, Q14, Q17) and a plain one by default;
# all 22 with --run-slow (the trial: about 30-70 s more on 2 cores)
@pytest.mark.parametrize("queries", ["1,6,8,14,17", pytest.param("1-22", marks=pytest.mark.slow)])
def test_bench_tpch_trino_validated(data, tmp_path, queries):
    out = tmp_path / "res"
    tag = {"TILEWISE_TEST_TAG": str(tmp_path)}
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    cp = run_cli("bench", "tpch", "--engine", "trino", "--sf", "0.01", "--policies", policy, "--runs", "1",
                 "--tests", "power", "--no-warmup", "--no-plots", "--worker-memory", "1g", "--out", str(out), "--queries", queries,
                 "--data-dir", str(data.dir.parent), "--json", timeout=590, env=tag)
    try:
        assert cp.returncode == 0, cp.stderr[-3000:]
        doc = json.loads(cp.stdout)
        assert doc["params"]["engine"] == "trino" and doc["params"]["tests"] == ["power"]
        assert doc["refresh"]["applied"] is False  # Trino does not write our tables: said, not faked
        pol = doc["policies"][policy]
        assert pol["complete"] is True
        assert sorted(pol["queries"]) == sorted(f"q{n}" for n in Q.parse_selection(queries))
        for name, q in pol["queries"].items():
            assert q["valid"] is True, (name, q)
        want = plan.plan(topology.load(None), policy)
        for inst, rec in zip(want.instances, pol["instances"]):
            assert rec["binding_verified"] is True and rec["healthy"] is True and rec["cpus"] == list(inst.cpus)
        # statistics were gathered once, in the data set's directory, over hard links (no copy)
        assert (data.dir / "trino" / "ready.json").exists()
        assert os.path.samefile(data.dir / "trino" / "tables" / "lineitem" / "lineitem.parquet",
                                data.tables["lineitem"])
    finally:
        assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path)), "JVMs left after the benchmark"


def test_up_bound_query_down_leaves_nothing(data, tmp_path, monkeypatch):
    d = str(tmp_path / "clusters")
    env = {"TILEWISE_CLUSTER_DIR": d}
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    want = plan.plan(topology.load(None), policy)
    try:
        cp = run_cli("up", "--engine", "trino", "--policy", policy, "--sf", "0.01", "--data-dir",
                     str(data.dir.parent), "--worker-memory", "1g", "--coordinator-memory", "768m", "--name", "t",
                     "--json", env=env, timeout=480)
        assert cp.returncode == 0, cp.stderr[-3000:]
        doc = json.loads(cp.stdout)
        assert doc["healthy"] and doc["endpoint"].startswith("http://127.0.0.1:")
        assert doc["data"]["schema"] == "tpch_sf0_01"
        roles = sorted((m["role"], m["instance"] if m["instance"] is not None else -1) for m in doc["members"])
        assert roles == [("coordinator", -1)] + [("worker", i.id) for i in want.instances]
        coord = next(m for m in doc["members"] if m["role"] == "coordinator")
        # the coordinator is placed by the plan: loopback has no NIC, so it shares instance 0's CPUs
        assert doc["placement"]["coordinator_instance"] == 0 and coord["cpus"] == cpulist.format(want.instances[0].cpus)
        for m in doc["members"]:
            assert m["binding_verified"] is True and m["healthy"] is True, m
            p = psutil.Process(m["pid"])
            assert "java" in " ".join(p.cmdline()[:1]) and "-XX:+UseG1GC" in p.cmdline()  # the JVM itself
            if m["role"] == "worker":
                inst = want.instances[m["instance"]]
                assert tuple(sorted(p.cpu_affinity())) == tuple(inst.cpus)
                assert f"-XX:ParallelGCThreads={len(inst.cpus)}" in p.cmdline() and "-Xmx1024m" in p.cmdline()
            conns = [c for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            assert conns and all(c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1") for c in conns)  # loopback only
        # a few queries on the running cluster, validated like the benchmark's; and one through the CLI
        ref = validate.Reference(data)
        monkeypatch.setenv("TILEWISE_CLUSTER_DIR", d)
        st_t = cluster.load("t")
        for n in (1, 14, 17):  # avg(decimal) and decimal division stay decimals in Trino
            cols, rows, elapsed, inst = cluster.query(st_t, Q.load(n))
            chk = ref.check(n, rows)
            assert chk.ok and inst == -1 and elapsed > 0, (n, chk.detail)
        q = run_cli("query", "--name", "t", "--json", "SELECT count(*) AS n FROM lineitem", env=env, timeout=120)
        assert q.returncode == 0, q.stderr
        assert json.loads(q.stdout)["rows"] == [[60175]]
        q = run_cli("query", "--name", "t", "--json", "-f", "-", input=Q.load(6) + ";\n", env=env, timeout=120)
        assert q.returncode == 0, q.stderr  # a file (here stdin) starting with a -- comment
        assert json.loads(q.stdout)["columns"] == ["revenue"]
        st = run_cli("status", "--name", "t", "--json", env=env, timeout=60)
        assert st.returncode == 0 and json.loads(st.stdout)["healthy"] is True
    finally:
        dn = run_cli("down", "--name", "t", "--json", env=env, timeout=120)
    assert dn.returncode == 0, dn.stderr
    assert len(json.loads(dn.stdout)["stopped_pids"]) >= 1 + len(want.instances)
    assert not wait_gone("TILEWISE_CLUSTER_DIR", d), "JVMs left after down"
    assert not list(Path(d).glob("*.json"))
