"""`tilewise up/status/down` with a real Spark cluster: bound workers verified from /proc, a crashed
worker reported, nothing left after down or after an interrupted up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_cli, tagged, wait_gone
from tilewise import cpulist, plan, topology
from tilewise.benchmarks.tpch import data as tpch_data

pytestmark = pytest.mark.spark


def _tagged(value: str) -> list[psutil.Process]:
    """Live processes whose environment carries TILEWISE_CLUSTER_DIR=value (inherited by every JVM)."""
    return tagged("TILEWISE_CLUSTER_DIR", value)


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


def _wait_gone(value: str, timeout: float = 15.0) -> list[psutil.Process]:
    return wait_gone("TILEWISE_CLUSTER_DIR", value, timeout)


def test_up_status_crash_down(state_env, tmp_path):
    d = state_env["TILEWISE_CLUSTER_DIR"]
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    want = plan.plan(topology.load(None), policy)
    data = tpch_data.dataset(0.01, tmp_path / "data")
    cp = run_cli("up", "--engine", "spark", "--policy", policy, "--worker-memory", "1g", "--sf", "0.01",
                 "--data-dir", str(data.dir.parent), "--json", env=state_env, timeout=240)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["healthy"] and doc["master_url"].startswith("spark://127.0.0.1:")
    assert any("pyspark --master" in line for line in doc["connect"])
    workers = [m for m in doc["members"] if m["role"] == "worker"]
    assert len(workers) == len(want.instances)
    for w, inst in zip(sorted(workers, key=lambda m: m["instance"]), want.instances):
        # read back from /proc here too, not only what tilewise says
        allowed = tuple(sorted(psutil.Process(w["pid"]).cpu_affinity()))
        assert allowed == tuple(inst.cpus) and w["cpus"] == cpulist.format(inst.cpus)
        assert w["binding_verified"] is True and w["memory_mb"] == 1024
    # the cluster outlived `up`; a second up with the same name refuses
    cp2 = run_cli("up", "--engine", "spark", "--policy", policy, env=state_env, timeout=60)
    assert cp2.returncode == 2 and "already running" in cp2.stderr
    st = run_cli("status", "--json", env=state_env, timeout=60)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["healthy"] is True
    # tilewise query: a driver for this one query (the cluster stays free for users' applications)
    q = run_cli("query", "--json", "SELECT count(*) AS n FROM lineitem", env=state_env, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    qd = json.loads(q.stdout)
    assert qd["rows"] == [[60175]] and qd["columns"] == ["n"] and qd["instance"] == -1
    assert not [p for p in _tagged(d) if "tilewise.engines.spark.driver" in " ".join(p.cmdline())]
    bad = run_cli("query", "--instance", "0", "SELECT 1", env=state_env, timeout=60)
    assert bad.returncode == 2 and "whole cluster" in bad.stderr
    # --join: only bound workers, registered with an existing master (here: ours, over loopback)
    j = run_cli("up", "--engine", "spark", "--policy", "wim", "--name", "extra", "--join", doc["master_url"],
                "--worker-memory", "1g", "--json", env=state_env, timeout=240)
    assert j.returncode == 0, j.stderr
    jdoc = json.loads(j.stdout)
    assert jdoc["joined"] and jdoc["healthy"] and [m["role"] for m in jdoc["members"]] == ["worker"]
    assert run_cli("down", "--name", "extra", env=state_env, timeout=120).returncode == 0
    assert all(m["pid"] not in {p.pid for p in _tagged(d)} for m in jdoc["members"])
    # a crashed worker: reported by status (exit 3), not hung on
    victim = workers[-1]["pid"]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    st = run_cli("status", "--json", env=state_env, timeout=60)
    assert time.monotonic() - t0 < 30
    assert st.returncode == 3, st.stderr
    sdoc = json.loads(st.stdout)
    dead = [m for m in sdoc["members"] if m["pid"] == victim][0]
    assert dead["healthy"] is False and "exited" in dead["detail"]
    assert any(str(victim) in p for p in sdoc["problems"])
    text = run_cli("status", env=state_env, timeout=60)
    assert "DEAD" in text.stdout and "UNHEALTHY" in text.stdout
    dn = run_cli("down", "--json", env=state_env, timeout=120)
    assert dn.returncode == 0, dn.stderr
    assert not _wait_gone(d), "java processes left after down"
    assert not list(Path(d).glob("*.json"))
    assert run_cli("status", env=state_env).returncode == 2


def test_interrupted_up_leaves_nothing(state_env):
    d = state_env["TILEWISE_CLUSTER_DIR"]
    exe = str(Path(sys.executable).parent / "tilewise")
    env = dict(os.environ, **state_env)
    proc = subprocess.Popen([exe, "up", "--engine", "spark", "--policy", "wim", "--worker-memory", "1g"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60

        def started():
            return [p for p in _tagged(d) if p.pid != proc.pid and _name(p) == "java"]

        while not started() and time.monotonic() < deadline:  # a JVM is starting
            time.sleep(0.1)
        assert started(), "up never started a process"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not _wait_gone(d), "processes left after an interrupted up"
    assert not list(Path(d).glob("*.json"))
