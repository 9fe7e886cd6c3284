"""`tilewise up --engine duckdb`: detached, bound DuckDB servers (one per instance) recorded in the
cluster state, shown by status with their bindings read back, queried with `tilewise query`, driven
by `elastic --instances`, and stopped by `down` leaving nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from conftest import run_cli, wait_gone
from tilewise import cpulist, plan, topology
from tilewise.benchmarks.tpch import data as tpch_data


@pytest.fixture
def env(state_env, tmp_path):
    data = tmp_path / "data"
    tpch_data.ensure_data(0.01, data)
    return {**state_env, "DATA": str(data)}


def test_up_status_query_elastic_down(env):
    d = env["TILEWISE_CLUSTER_DIR"]
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    want = plan.plan(topology.load(None), policy)
    cp = run_cli("up", "--engine", "duckdb", "--policy", policy, "--sf", "0.01", "--data-dir", env["DATA"],
                 "--name", "db", "--worker-memory", "512m", "--json", env=env, timeout=240)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["healthy"] and doc["engine"] == "duckdb" and doc["data"]["sf"] == 0.01
    assert any("tilewise query --name db" in line for line in doc["connect"])
    workers = sorted(doc["members"], key=lambda m: m["instance"])
    assert [m["role"] for m in workers] == ["worker"] * len(want.instances)
    for w, inst in zip(workers, want.instances):
        assert tuple(sorted(psutil.Process(w["pid"]).cpu_affinity())) == tuple(inst.cpus)  # read back here too
        assert w["cpus"] == cpulist.format(inst.cpus) and w["binding_verified"] is True
        assert w["threads"] == len(inst.cpus) and w["memory_mb"] == 512
        assert Path(w["socket"]).exists() and oct(Path(w["socket"]).stat().st_mode & 0o777) == "0o600"
    # usable: each instance answers, from its own copy of the tables
    for inst in want.instances:
        q = run_cli("query", "--name", "db", "--instance", str(inst.id), "--json",
                    "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem", env=env, timeout=60)
        assert q.returncode == 0, q.stderr
        qd = json.loads(q.stdout)
        assert qd["instance"] == inst.id and qd["columns"] == ["n", "q"] and qd["rows"][0][0] == 60175
    # what does not fit memory_limit spills into the deployment's own directory (removed by down), not ./.tmp
    spill = run_cli("query", "--name", "db", "--json", "SELECT current_setting('temp_directory') AS d",
                    env=env, timeout=60)
    assert spill.returncode == 0, spill.stderr
    assert json.loads(spill.stdout)["rows"][0][0] == str(Path(d) / "db" / "work" / "instance-0" / "spill")
    text = run_cli("query", "--name", "db", "SELECT 6 * 7 AS answer", env=env, timeout=60)
    assert text.returncode == 0 and "42" in text.stdout and "on instance 0" in text.stdout
    bad = run_cli("query", "--name", "db", "SELECT * FROM nope", env=env, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("Error: ") and "nope" in bad.stderr
    assert run_cli("query", "--name", "db", "--instance", "9", "SELECT 1", env=env).returncode == 2
    # elastic drives the servers as instances of the cluster
    el = run_cli("elastic", "--instances", "--cluster", "db", "--dry-run", "--duration", "1", "--interval", "0.2",
                 "--json", env=env, timeout=120)
    assert el.returncode == 0, el.stderr
    assert sorted(json.loads(el.stdout)["target"]) == sorted(f"instance db/{i.id}" for i in want.instances)
    # a killed server: status says so (exit 3), quickly
    victim = workers[-1]["pid"]
    os.kill(victim, signal.SIGKILL)
    st = run_cli("status", "--name", "db", "--json", env=env, timeout=60)
    assert st.returncode == 3
    dead = [m for m in json.loads(st.stdout)["members"] if m["pid"] == victim][0]
    assert dead["healthy"] is False and "exited" in dead["detail"]
    dn = run_cli("down", "--name", "db", "--json", env=env, timeout=60)
    assert dn.returncode == 0, dn.stderr
    assert not wait_gone("TILEWISE_CLUSTER_DIR", d), "DuckDB servers left after down"
    assert not list(Path(d).glob("*.json")) and not (Path(d) / "db").exists()


def test_a_refused_connection_to_a_dead_server_says_how_it_ended(tmp_path):
    """A client connecting after its server was killed names the pid and the signal, not 'refused'."""
    import subprocess
    import sys
    import time

    from tilewise import procs
    from tilewise.binding import Binding
    from tilewise.engines.procgroup import Member
    from tilewise.engines.replicas import Client, InstanceDied, ServerError

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    m = Member("worker", 0, p.pid, time.time(), Binding(cpus=sorted(os.sched_getaffinity(0))), "", proc=p,
               start=procs.stat(p.pid).start)
    path = str(tmp_path / "gone.sock")
    with pytest.raises(ServerError, match="cannot connect"):  # alive but not listening: the plain error
        Client(path, 0, "DuckDB", m).connect(timeout_s=1)
    p.kill()
    p.wait()
    with pytest.raises(InstanceDied, match=rf"DuckDB instance 0 \(pid {p.pid}\) was killed by SIGKILL"):
        Client(path, 0, "DuckDB", m).connect(timeout_s=1)


def test_a_long_tmpdir_does_not_make_the_sockets_too_long():
    from tilewise.dirs import SHORT_TMP, scratch_base

    assert scratch_base("/tmp") == "/tmp"
    long = "/tmp/" + "x" * 120
    assert len(long) > SHORT_TMP and scratch_base(long) == "/tmp"
    assert scratch_base("/var/tmp") == "/var/tmp"


def test_up_is_all_or_nothing_until_it_has_said_it_is_up(tmp_path, monkeypatch, state_env):
    """A Ctrl-C after the servers answer but before `up` has its status to say (here: in what
    starts beside the deployment) stops everything it started and records nothing."""
    from tilewise import cluster

    for k, v in state_env.items():
        monkeypatch.setenv(k, v)
    started = {}

    def interrupted(st, log):  # the servers are up and recorded; the user presses Ctrl-C now
        started["token"], started["pids"] = st.token, [m["pid"] for m in st.members]
        raise KeyboardInterrupt

    cfg = cluster.Config("duckdb", lambda t: plan.plan(t, "wim"), name="aon", background=interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.start(cfg)
    assert started["pids"] and not [p for p in started["pids"] if psutil.pid_exists(p)
                                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert cluster.load("aon") is None and not wait_gone("TILEWISE_CLUSTER_TOKEN", started["token"], 5)
    assert not list(Path(state_env["TILEWISE_CLUSTER_DIR"]).glob(".aon.lock"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (two instances)")
def test_a_stopped_server_is_skipped_bounded_and_stopped(state_env):
    """SIGSTOP on one server: status calls it stopped, a query without --instance runs on the
    other, --timeout bounds a query sent to it, and down stops it within its grace period."""
    import time

    cp = run_cli("up", "--engine", "duckdb", "--policy", "wic", "--name", "stp", "--json", env=state_env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    workers = sorted((m for m in json.loads(cp.stdout)["members"] if m["role"] == "worker"),
                     key=lambda m: m["instance"])
    try:
        os.kill(workers[0]["pid"], signal.SIGSTOP)
        st = run_cli("status", "--name", "stp", "--json", env=state_env, timeout=60)
        doc = json.loads(st.stdout)
        assert st.returncode == 3 and not doc["healthy"] and "stopped (SIGSTOP)" in " ".join(doc["problems"])
        q = run_cli("query", "--name", "stp", "--json", "SELECT 42 AS x", env=state_env, timeout=60)
        assert q.returncode == 0 and json.loads(q.stdout)["instance"] == workers[1]["instance"], q.stderr
        t0 = time.monotonic()
        q = run_cli("query", "--name", "stp", "--instance", str(workers[0]["instance"]), "--timeout", "2",
                    "SELECT 42", env=state_env, timeout=60)
        assert q.returncode == 1 and "within 2 s" in q.stderr and time.monotonic() - t0 < 15, q.stderr
    finally:
        t0 = time.monotonic()
        dn = run_cli("down", "--name", "stp", "--json", env=state_env, timeout=120)
    assert dn.returncode == 0 and time.monotonic() - t0 < 20, dn.stderr
    assert not [w for w in workers if psutil.pid_exists(w["pid"])
                and psutil.Process(w["pid"]).status() != psutil.STATUS_ZOMBIE]


def test_a_deployment_whose_state_file_is_gone_is_found_by_its_processes(state_env):
    cp = run_cli("up", "--engine", "duckdb", "--policy", "wim", "--name", "lost", "--json", env=state_env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    pids = [m["pid"] for m in json.loads(cp.stdout)["members"]]
    (Path(state_env["TILEWISE_CLUSTER_DIR"]) / "lost.json").unlink()  # the state file deleted
    again = run_cli("up", "--engine", "duckdb", "--policy", "wim", "--name", "lost", env=state_env, timeout=120)
    assert again.returncode == 2 and "has lost its state file" in again.stderr and str(pids[0]) in again.stderr
    st = run_cli("status", "--name", "lost", env=state_env, timeout=60)
    assert st.returncode == 1 and "no state file" in st.stderr and "tilewise down --name lost" in st.stderr
    assert all(psutil.pid_exists(p) for p in pids)  # nothing of it was touched by the refusals
    dn = run_cli("down", "--name", "lost", "--json", env=state_env, timeout=60)
    assert dn.returncode == 0 and set(pids) <= set(json.loads(dn.stdout)["stopped_pids"]), dn.stderr
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not (Path(state_env["TILEWISE_CLUSTER_DIR"]) / "lost").exists()
    gone = run_cli("down", "--name", "lost", env=state_env, timeout=60)
    assert gone.returncode == 2 and "no cluster named 'lost'" in gone.stderr
