"""An engine from outside tilewise's tree, registered through the entry-point group tilewise.engines:
SQLite (tests/fixtures/engine_plugin/tilewise_sqlite, the example of docs/adding-an-engine.md), one
bound server process per instance. It is put on PYTHONPATH with a .dist-info holding its entry
point (nothing is installed, nothing in tilewise is edited), then driven through the real CLI:
`engines list`, `bench tpch --queries 1,6` (every answer validated against the reference), `up`,
`status`, `query`, `down`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import psutil
import pytest

from conftest import FIXTURES, run_cli, wait_gone
from tilewise import cpulist, engines, plan, topology
from tilewise.benchmarks.tpch import data as tpch_data


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-data")
    tpch_data.ensure_data(0.01, root)
    return root


@pytest.fixture
def plugin_env(tmp_path, state_env):
    """The plug-in's package and its .dist-info on PYTHONPATH, as `pip install` would leave them."""
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "engine_plugin", site)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**state_env, "PYTHONPATH": path, "TILEWISE_TEST_TAG": str(tmp_path)}


def _policy() -> str:
    return "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"


def test_the_plugin_is_not_part_of_tilewise():
    assert "sqlite" not in engines.names()  # only an entry point on PYTHONPATH makes it an engine


def test_plugin_engine_listed_benchmarked_validated(plugin_env, data_root, tmp_path):
    cp = run_cli("engines", "list", "--json", env=plugin_env)
    assert cp.returncode == 0, cp.stderr
    rows = {r["engine"]: r for r in json.loads(cp.stdout)}
    assert rows["sqlite"]["usable"] is True and "tilewise.engines of tilewise-sqlite" in rows["sqlite"]["origin"]
    policies = ",".join(dict.fromkeys(["wim", _policy()]))
    out = tmp_path / "res"
    cp = run_cli("bench", "tpch", "--engine", "sqlite", "--sf", "0.01", "--queries", "1,6", "--policies", policies,
                 "--runs", "1", "--no-plots", "--out", str(out), "--data-dir", str(data_root), "--json",
                 env=plugin_env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["params"]["engine"] == "sqlite" and doc["environment"]["engines"]["sqlite"].startswith("sqlite 3.")
    assert doc["refresh"]["applied"] is False and "cannot write" in doc["refresh"]["reason"]  # its spec says so
    want = {label: plan.plan(topology.load(None), label) for label in policies.split(",")}
    for label, pol in doc["policies"].items():
        if pol.get("same_as"):
            continue
        assert pol["complete"] is True
        for q in ("q1", "q6"):  # exactly the reference's answers (floats rounding to its decimals)
            assert pol["queries"][q]["valid"] is True, (label, q, pol["queries"][q])
        for inst, rec in zip(want[label].instances, pol["instances"]):
            assert rec["binding_verified"] is True and rec["cpus"] == list(inst.cpus)
            assert rec["threads"] == 1 and rec["load_s"] > 0  # its settings, as its server reports them
    # the replicas served the throughput test: one stream per instance at least
    assert doc["params"]["streams"] >= max(len(p.instances) for p in want.values())
    assert not wait_gone("TILEWISE_TEST_TAG", plugin_env["TILEWISE_TEST_TAG"]), "servers left after the benchmark"


def test_plugin_engine_up_status_query_down(plugin_env, data_root):
    d = plugin_env["TILEWISE_CLUSTER_DIR"]
    want = plan.plan(topology.load(None), _policy())
    bad = run_cli("up", "--engine", "sqlite", "--worker-memory", "1g", env=plugin_env)
    assert bad.returncode == 2 and "sqlite has no memory setting" in bad.stderr
    bad = run_cli("join", "--engine", "sqlite", "--coordinator", "127.0.0.1:1", env=plugin_env)
    assert bad.returncode == 2 and "'sqlite' is not one of" in bad.stderr  # its spec: workers cannot join
    cp = run_cli("up", "--engine", "sqlite", "--policy", _policy(), "--sf", "0.01", "--data-dir", str(data_root),
                 "--name", "sq", "--json", env=plugin_env, timeout=240)
    try:
        assert cp.returncode == 0, cp.stderr
        doc = json.loads(cp.stdout)
        assert doc["healthy"] and doc["engine"] == "sqlite"
        workers = sorted(doc["members"], key=lambda m: m["instance"])
        assert [m["role"] for m in workers] == ["worker"] * len(want.instances)
        for w, inst in zip(workers, want.instances):  # bound through the process edge, read back here too
            assert tuple(sorted(psutil.Process(w["pid"]).cpu_affinity())) == tuple(inst.cpus)
            assert w["cpus"] == cpulist.format(inst.cpus) and w["binding_verified"] is True and w["threads"] == 1
        st = run_cli("status", "--name", "sq", "--json", env=plugin_env, timeout=60)
        assert st.returncode == 0 and json.loads(st.stdout)["healthy"] is True
        lineitem = Path(json.loads(st.stdout)["data"]["tables"]["lineitem"])
        n, qty = duckdb.connect().execute(f"SELECT count(*), sum(l_quantity) FROM read_parquet('{lineitem}')").fetchone()
        for inst in want.instances:  # each instance answers from its own copy
            q = run_cli("query", "--name", "sq", "--instance", str(inst.id), "--json",
                        "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem", env=plugin_env, timeout=60)
            assert q.returncode == 0, q.stderr
            qd = json.loads(q.stdout)
            assert qd["instance"] == inst.id and qd["columns"] == ["n", "q"]
            assert qd["rows"][0][0] == n and qd["rows"][0][1] == float(qty)
        q = run_cli("query", "--name", "sq", "SELECT * FROM nope", env=plugin_env, timeout=60)
        assert q.returncode == 1 and "no such table: nope" in q.stderr
    finally:
        dn = run_cli("down", "--name", "sq", "--json", env=plugin_env, timeout=60)
    assert dn.returncode == 0, dn.stderr
    assert not wait_gone("TILEWISE_CLUSTER_DIR", d), "SQLite servers left after down"
    assert not list(Path(d).glob("*.json"))


@pytest.fixture
def direct_env(tmp_path, state_env):
    """An engine whose runtime implements engines.contract.Runtime itself (no ProcessCluster)."""
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "engine_plugin_direct", site)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**state_env, "PYTHONPATH": path}


def test_an_engine_written_against_the_contract_alone_is_driven_by_up_status_query_down(direct_env):
    import sys

    sys.path.insert(0, str(FIXTURES / "engine_plugin_direct"))
    try:
        from tilewise_direct.runtime import DirectRuntime
    finally:
        sys.path.pop(0)
    from tilewise.engines.procgroup import ProcessCluster

    assert not issubclass(DirectRuntime, ProcessCluster)
    d = direct_env["TILEWISE_CLUSTER_DIR"]
    want = plan.plan(topology.load(None), _policy())
    cp = run_cli("up", "--engine", "direct", "--policy", _policy(), "--name", "dr", "--json", env=direct_env, timeout=120)
    try:
        assert cp.returncode == 0, cp.stderr
        doc = json.loads(cp.stdout)
        assert doc["healthy"] is True and doc["engine"] == "direct" and doc["endpoint"]
        for w, inst in zip(sorted(doc["members"], key=lambda m: m["instance"]), want.instances):
            assert tuple(sorted(psutil.Process(w["pid"]).cpu_affinity())) == tuple(inst.cpus)
            assert w["binding_verified"] is True
        st = run_cli("status", "--name", "dr", "--json", env=direct_env, timeout=60)
        assert st.returncode == 0 and json.loads(st.stdout)["healthy"] is True
        for inst in want.instances:
            q = run_cli("query", "--name", "dr", "--instance", str(inst.id), "--json", "SELECT 6 * 7 AS x",
                        env=direct_env, timeout=60)
            assert q.returncode == 0, q.stderr
            assert json.loads(q.stdout)["rows"] == [[42]] and json.loads(q.stdout)["instance"] == inst.id
        bad = run_cli("query", "--name", "dr", "SELECT * FROM nope", env=direct_env, timeout=60)
        assert bad.returncode == 1 and "no such table: nope" in bad.stderr
        pids = [m["pid"] for m in doc["members"]]
    finally:
        dn = run_cli("down", "--name", "dr", "--json", env=direct_env, timeout=60)
    assert dn.returncode == 0, dn.stderr
    assert set(pids) <= set(json.loads(dn.stdout)["stopped_pids"])
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert not list(Path(d).glob("*.json")) and not (Path(d) / "dr").exists()
    assert not list(Path(d).glob(".*.lock"))  # the lock file goes with the state it guarded
