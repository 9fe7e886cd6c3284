"""`tilewise up/status/down` without starting a JVM: bad input, state files, memory sizing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_cli
from tilewise import cluster, plan, topology
from tilewise.binding import Binding
from tilewise.engines import memory
from tilewise.engines import procgroup as sc
from tilewise.engines.spark.runtime import spark_schema
from tilewise.errors import TilewiseError, UsageError


@pytest.fixture
def state_env(tmp_path, monkeypatch):
    d = tmp_path / "clusters"
    monkeypatch.setenv("TILEWISE_CLUSTER_DIR", str(d))
    return {"TILEWISE_CLUSTER_DIR": str(d)}


@pytest.mark.parametrize("args, needle", [
    (("up", "--engine", "oracle"), "'oracle' is not one of"),
    (("up", "--engine", "duckdb", "--join", "127.0.0.1:1"), "duckdb workers cannot join"),
    (("up", "--engine", "duckdb", "--coordinator-memory", "1g"), "sizes the Trino coordinator"),
    (("join", "--engine", "duckdb", "--coordinator", "127.0.0.1:1"), "'duckdb' is not one of"),
    (("join", "--engine", "trino", "--coordinator", "nohost"), "not a Trino coordinator address"),
    (("join", "--engine", "spark", "--coordinator", "http://x"), "not a Spark master address"),
    (("query", "SELECT 1"), "no cluster named 'default'"),
    (("query", "--timeout", "0", "SELECT 1"), "'--timeout': '0' is out of range: it must be > 0"),
    (("query",), "give one SQL statement"),
    (("up", "--worker-memory", "12k"), "below the 512 MiB"),
    (("up", "--worker-memory", "lots"), "cannot read size"),
    (("up", "--name", "a/b"), "bad cluster name"),
    (("up", "--topology", "synthetic:Package:2 [NUMANode] Core:4 PU:1"), "not this machine"),
    (("up", "--policy", "wicp-foo"), "wicp-foo"),
    (("up", "--sf", "0"), "scale factor must be > 0"),
    (("up", "--join", "http://x"), "not a Spark master address"),
    (("status",), "no cluster named 'default'"),
    (("down", "--name", "nope"), "no cluster named 'nope'"),
])
def test_bad_input_is_one_clear_error(state_env, args, needle):
    cp = run_cli(*args, env=state_env, timeout=60)
    assert cp.returncode == 2, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: ") and needle in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr
    d = Path(state_env["TILEWISE_CLUSTER_DIR"])
    assert not list(d.glob("*.json")) if d.exists() else True  # nothing recorded, nothing left


def _state(name="c1", fmt=cluster.FORMAT):
    return cluster.ClusterState(name, "spark", "tok", "running", 1.0, "/nonexistent", {"instances": []},
                                endpoint="spark://127.0.0.1:1")


def test_state_roundtrip_is_atomic(state_env):
    st = _state()
    cluster.save(st)
    files = os.listdir(state_env["TILEWISE_CLUSTER_DIR"])
    assert files == ["c1.json"]  # no temp file left behind
    back = cluster.load("c1")
    assert back.to_json() == st.to_json()
    assert cluster.names() == ["c1"]


def test_format_1_state_is_upgraded_on_load(state_env):
    d = cluster.state_dir()
    d.mkdir(parents=True)
    old = {"format": "tilewise-cluster/1", "name": "v1", "engine": "spark", "token": "t", "state": "running",
           "created": 1.0, "root": "/nonexistent", "plan": {"instances": []}, "master_url": "spark://127.0.0.1:7",
           "joined": False, "members": []}
    (d / "v1.json").write_text(json.dumps(old))
    st = cluster.load("v1")
    assert st.endpoint == st.master_url == "spark://127.0.0.1:7" and st.placement == {}
    assert type(st.cluster()).__name__ == "SparkCluster"


def test_unknown_format_and_damaged_state_are_errors(state_env):
    d = cluster.state_dir()
    d.mkdir(parents=True)
    (d / "old.json").write_text(json.dumps({"format": "tilewise-cluster/99", "name": "old"}))
    with pytest.raises(TilewiseError, match="unknown format"):
        cluster.load("old")
    (d / "bad.json").write_text("{not json")
    with pytest.raises(TilewiseError, match="not valid JSON"):
        cluster.load("bad")
    cp = run_cli("status", "--name", "bad", env=state_env)
    assert cp.returncode == 1 and "not valid JSON" in cp.stderr and "Traceback" not in cp.stderr


def test_status_of_dead_cluster_reports_crash_not_hang(state_env):
    # a recorded cluster whose processes are long gone (pid 1's start time never matches 0.0)
    st = _state("ghost")
    st.members = [sc.Member("worker", 0, 1, 0.0, Binding((0,)), "/nonexistent.log", 1, 512).to_json()]
    st.plan = {"policy": "wim", "instances": [{"id": 0, "cpus": [0]}]}
    cluster.save(st)
    cp = run_cli("status", "--name", "ghost", "--json", env=state_env)
    assert cp.returncode == 3, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["healthy"] is False
    w = doc["members"][0]
    assert w["healthy"] is False and "exited" in w["detail"]
    cp = run_cli("down", "--name", "ghost", "--json", env=state_env)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["stopped_pids"] == []
    assert cluster.load("ghost") is None


def test_worker_memory_split_per_node():
    t = topology.load("synthetic:Package:2 [NUMANode(memory=64GB)] L3Cache:2(size=32MB) Core:4 PU:2")
    node_mem = {n.id: n.memory_bytes for n in t.numa_nodes}
    win = plan.plan(t, "win")
    mem = memory.worker_memory_mb(win, node_mem)
    assert len(mem) == 2 and len(set(mem.values())) == 1
    assert mem[0] == int(node_mem[0] * memory.MEMORY_FRACTION / 2**20)
    wicp = plan.plan(t, "wicp")  # two instances per node share it
    mem2 = memory.worker_memory_mb(wicp, node_mem)
    assert all(abs(v - mem[0] / 2) <= 1 for v in mem2.values())
    huge = topology.load("synthetic:Package:1 [NUMANode(memory=1TB)] Core:4 PU:1")
    assert memory.worker_memory_mb(plan.plan(huge, "wim"), {0: 2**40})[0] == memory.MEMORY_CAP_MB
    with pytest.raises(UsageError):
        memory.worker_memory_mb(win, node_mem, fraction=0)


@pytest.mark.parametrize("text, mb", [("4g", 4096), ("512m", 512), ("1.5G", 1536), ("2GiB", 2048), ("1024", 1024)])
def test_parse_size(text, mb):
    assert memory.parse_size_mb(text) == mb


def test_spark_schema_from_parquet(tmp_path):
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    tbl = pa.table({"k": pa.array([1], pa.int64()), "n": pa.array([2], pa.int32()),
                    "p": pa.array([decimal.Decimal("1.25")], pa.decimal128(15, 2)),
                    "s": pa.array(["x"], pa.string()), "d": pa.array([datetime.date(1995, 1, 1)], pa.date32())})
    pq.write_table(tbl, tmp_path / "t.parquet")
    assert spark_schema(str(tmp_path / "t.parquet")) == \
        "`k` BIGINT, `n` INT, `p` DECIMAL(15,2), `s` STRING, `d` DATE"
    pq.write_table(pa.table({"b": pa.array([[1]])}), tmp_path / "u.parquet")
    assert spark_schema(str(tmp_path / "u.parquet")) is None  # unmapped: Spark infers


@pytest.mark.parametrize("engine, runtime, extra", [
    ("duckdb", "DuckDBServers", {"socket": "/nonexistent/sockets/instance-0.sock"}),
    ("spark", "SparkCluster", {}),
    ("trino", "TrinoCluster", {"node_id": "worker-0-abcd", "port": 1}),
])
def test_format_2_state_of_each_engine_loads_into_its_runtime(state_env, engine, runtime, extra):
    """State files written before the engine contract (tilewise-cluster/2) load as they are."""
    d = cluster.state_dir()
    d.mkdir(parents=True)
    old = {"format": "tilewise-cluster/2", "name": "c2", "engine": engine, "token": "t", "state": "running",
           "created": 1.0, "root": "/nonexistent", "plan": {"policy": "wim", "instances": [{"id": 0, "cpus": [0]}]},
           "host": "127.0.0.1", "endpoint": "x", "joined": False,
           "data": {"label": "TPC-H SF 0.01", "sf": 0.01, "tables": {"lineitem": "/nonexistent/lineitem.parquet"}},
           "members": [{"role": "worker", "instance": 0, "pid": 1, "create_time": 0.0, "start": None, "token": None,
                        "binding": {"cpus": [0], "mem_policy": "first-touch", "mem_nodes": [], "allocator": "system"},
                        "log": "/nonexistent.log", "cores": 1, "memory_mb": 512, "extra": extra}],
           "placement": {}, "tilewise_version": "0.x"}
    (d / "c2.json").write_text(json.dumps(old))
    st = cluster.load("c2")
    cl = st.cluster()
    assert type(cl).__name__ == runtime and cl.spec.name == engine and cl.data == old["data"]
    assert [m.extra for m in cl.members] == [extra] and st.to_json()["members"] == old["members"]
    doc = cluster.status(st)  # pid 1's start time never matches: reported as exited, not hung on
    assert doc["healthy"] is False and "exited" in doc["members"][0]["detail"]


def test_join_refuses_an_impossible_port_before_anything_starts(state_env):
    import time

    t0 = time.monotonic()
    cp = run_cli("join", "--engine", "spark", "--coordinator", "127.0.0.1:99999", "--name", "j", env=state_env,
                 timeout=60)
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [
        "Error: port 99999 of 'spark://127.0.0.1:99999' is out of range; a TCP port is 1..65535"], cp.stderr
    assert time.monotonic() - t0 < 30  # refused at once, not when a worker fails to register
    assert not list(Path(state_env["TILEWISE_CLUSTER_DIR"]).glob("*.json"))


def test_status_says_when_the_data_is_gone_or_the_cracker_died(tmp_path):
    import subprocess

    from tilewise import procs

    f = tmp_path / "lineitem.parquet"
    f.write_bytes(b"x")
    data = {"tables": {"lineitem": str(f)}}
    assert cluster.data_problems(dict(data)) == []
    f.unlink()  # the data directory deleted under a running deployment
    [p] = cluster.data_problems(dict(data))
    assert p.startswith("1 data file(s) are gone") and str(f) in p
    gone = subprocess.Popen(["sleep", "30"])
    start = procs.start_time(gone.pid)
    gone.kill()  # the cracker killed with kill -9
    gone.wait()
    died = {"crack": {"state": "running", "pid": gone.pid, "start": start, "log": "/x/crack.log"}}
    [p] = cluster.data_problems(died)
    assert died["crack"]["state"] == "dead" and "died before it finished" in p and "/x/crack.log" in p
    me = {"crack": {"state": "running", "pid": os.getpid(), "start": procs.start_time(os.getpid())}}
    assert cluster.data_problems(me) == [] and me["crack"]["state"] == "running"
