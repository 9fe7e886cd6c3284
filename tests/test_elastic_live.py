"""The elastic daemon on real processes of this machine (needs 2 CPUs; cgroup parts need root).

Each test is a few seconds: a child that burns CPU while a flag file exists, a daemon ticking at
100 ms (driven tick by tick here, so the assertions do not depend on timing), and checks that
everything is restored.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import elastic_groups, run_cli
from tilewise import topology
from tilewise.elastic import daemon, enforce, modes, petri

BURNER = r"""
import os, sys, time
flag = sys.argv[1]
print("ready", flush=True)
while True:
    if os.path.exists(flag):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            pass
    else:
        time.sleep(0.01)
"""

# quiet: the daemon's demand counts the time a task waits for a CPU, and the QEMU guests beside the
# other tests keep both CPUs busy (an idle child waited 320 ms in 2 ticks and got a second core)
pytestmark = [pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"), pytest.mark.quiet]


@pytest.fixture
def burner(tmp_path):
    flag = tmp_path / "burn"
    p = subprocess.Popen([sys.executable, "-c", BURNER, str(flag)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p, flag
    p.kill()
    p.wait()


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(d))
    return d / "journals"


def cgroup_v1_writable():
    m = enforce.mounts()["v1"]
    return bool(m) and os.access(m, os.W_OK)


def make_daemon(pid, kind):
    t = topology.load(None)
    target = daemon.PidTarget(pid)
    pool = modes.make_pool(t, target.allowed_cpus())
    unit = daemon.Unit(target.name, pool, petri.NetConfig(10, 70, pool.n_total), "dense", target)
    unit.enforcer = enforce.choose(kind, pid, None)
    return daemon.Daemon([unit], interval=0.1), unit


def tick_until(d, unit, want, max_ticks):
    for i in range(1, max_ticks + 1):
        time.sleep(0.1)
        d.tick()
        if unit.state.n_alloc == want:
            return i
    return None


@pytest.mark.parametrize("kind", ["affinity", "cgroup"])
def test_load_step_gets_a_core_and_gives_it_back(burner, kind, state_dir):
    if kind == "cgroup" and not cgroup_v1_writable():
        pytest.skip("cgroup v1 cpuset not writable here")
    p, flag = burner
    before = os.sched_getaffinity(p.pid)
    group_before = enforce.task_cgroup(p.pid, 1)
    d, unit = make_daemon(p.pid, kind)
    with d:
        d.start()
        assert os.sched_getaffinity(p.pid) == set(unit.cpus) and len(unit.cpus) == 1
        for _ in range(2):  # idle child: stays at one core
            time.sleep(0.1)
            d.tick()
        assert unit.state.n_alloc == 1
        flag.touch()
        # within two ticks of the load step (the first tick may see only part of the step)
        assert tick_until(d, unit, 2, 2) is not None, "no second core within two ticks"
        assert len(os.sched_getaffinity(p.pid)) == 2
        flag.unlink()
        assert tick_until(d, unit, 1, 4) is not None, "the core was not given back"
        assert len(os.sched_getaffinity(p.pid)) == 1
        if kind == "cgroup":
            assert unit.enforcer.kind == "cgroup-v1" and os.path.isdir(unit.enforcer.path)
            created = unit.enforcer.path
    assert os.sched_getaffinity(p.pid) == before
    assert not list(state_dir.glob("*.json"))  # journal removed after a clean restore
    if kind == "cgroup":
        assert not os.path.exists(created)
        assert enforce.task_cgroup(p.pid, 1) == group_before


def test_sigterm_restores_and_removes(burner, state_dir, tmp_path):
    p, flag = burner
    before = os.sched_getaffinity(p.pid)
    group_before = enforce.task_cgroup(p.pid, 1)
    log = tmp_path / "el.jsonl"
    exe = os.path.join(os.path.dirname(sys.executable), "tilewise")
    d = subprocess.Popen([exe, "elastic", "--pid", str(p.pid), "--log", str(log), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if log.exists() and sum(1 for _ in log.open()) >= 3:  # header, start, one tick
                break
            time.sleep(0.05)
        else:
            pytest.fail("daemon did not start ticking")
        assert len(os.sched_getaffinity(p.pid)) == 1
        d.send_signal(signal.SIGTERM)
        out, err = d.communicate(timeout=30)
    finally:
        if d.poll() is None:
            d.kill()
    assert d.returncode == 130, err
    assert "Traceback" not in err
    assert os.sched_getaffinity(p.pid) == before
    assert enforce.task_cgroup(p.pid, 1) == group_before
    assert not [g for g in elastic_groups() if f"-{d.pid}-" in g]
    assert not list(state_dir.glob("*.json"))
    summary = json.loads(out)
    assert summary["stop_reason"] == "stopped by signal" and summary["restored"]
    end = json.loads(log.read_text().splitlines()[-1])
    assert end["event"] == "end"
    replay = run_cli("elastic", "--replay", str(log), check=True).stdout
    assert "stopped by signal; original CPUs restored" in " ".join(replay.split())


def test_vanished_target_ends_the_daemon_cleanly(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.5)"])
    cp = run_cli("elastic", "--pid", str(child.pid), "--json", "--enforce", "affinity", timeout=60,
                 env={"TILEWISE_STATE_DIR": str(tmp_path)})
    child.wait()
    assert cp.returncode == 0, cp.stderr
    s = json.loads(cp.stdout)
    assert s["stop_reason"] == "target exited" and s["restored"]
    assert not list((tmp_path / "journals").glob("*.json"))


def _elastic(pid, *extra, log=None):
    exe = os.path.join(os.path.dirname(sys.executable), "tilewise")
    # --th-max 100: only a saturated core adds another, so the idle burner stays on one core even
    # when the machine is busy (these tests are about restoring, not about deciding)
    args = [exe, "elastic", "--pid", str(pid), "--th-max", "100", *extra] + (["--log", str(log)] if log else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ticking(log, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and sum(1 for _ in log.open()) >= 3:  # header, start, one tick
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail("daemon did not start ticking")


@pytest.mark.parametrize("kind", ["affinity", "auto"])
def test_two_daemons_on_one_pid_the_second_refuses_and_the_target_ends_as_it_began(burner, tmp_path, kind):
    p, _ = burner
    before = os.sched_getaffinity(p.pid)
    group_before = enforce.task_cgroup(p.pid, 1)
    first = _elastic(p.pid, "--enforce", kind, log=tmp_path / "a.jsonl")
    try:
        _wait_ticking(tmp_path / "a.jsonl", first)
        assert len(os.sched_getaffinity(p.pid)) == 1  # the first one holds it on one core
        second = _elastic(p.pid, "--enforce", kind, "--json")
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1, (out, err)
        assert err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err
        assert f"pid {p.pid} is already controlled by pid {first.pid} (tilewise elastic --pid {p.pid}" in err
        assert " since " in err
        # the second recorded nothing: the only journal is the first one's
        assert [json.loads(j.read_text())["owner"]["pid"] for j in state_dir_files()] == [first.pid]
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert first.returncode == 130
    assert os.sched_getaffinity(p.pid) == before
    assert enforce.task_cgroup(p.pid, 1) == group_before
    assert not list(state_dir_files())


def state_dir_files():
    from tilewise import changes

    return (changes.state_dir() / "journals").glob("*.json")


def test_sighup_is_handled_like_sigterm(burner, tmp_path):
    p, _ = burner
    before = os.sched_getaffinity(p.pid)
    d = _elastic(p.pid, "--enforce", "affinity", "--json", log=tmp_path / "el.jsonl")
    _wait_ticking(tmp_path / "el.jsonl", d)
    d.send_signal(signal.SIGHUP)
    out, err = d.communicate(timeout=30)
    assert d.returncode == 130, err
    assert "Error: interrupted (SIGHUP)" in err and "Traceback" not in err
    assert json.loads(out)["restored"] is True
    assert os.sched_getaffinity(p.pid) == before and not list(state_dir_files())


@pytest.mark.parametrize("kind", ["affinity", "cgroup"])
def test_kill_9_of_the_daemon_then_restore_undoes_it(burner, tmp_path, kind):
    if kind == "cgroup" and not cgroup_v1_writable():
        pytest.skip("cgroup v1 cpuset not writable here")
    p, _ = burner
    before = os.sched_getaffinity(p.pid)
    group_before = enforce.task_cgroup(p.pid, 1)
    d = _elastic(p.pid, "--enforce", kind, log=tmp_path / "el.jsonl")
    _wait_ticking(tmp_path / "el.jsonl", d)
    assert len(os.sched_getaffinity(p.pid)) == 1
    d.kill()
    d.communicate(timeout=30)
    assert len(os.sched_getaffinity(p.pid)) == 1 and list(state_dir_files())  # left as it was
    if kind == "cgroup":
        assert [g for g in elastic_groups() if f"-{d.pid}-" in g]
    cp = run_cli("restore", "--json")
    assert cp.returncode == 0, cp.stderr
    [j] = json.loads(cp.stdout)["journals"]
    assert j["state"] == "restored" and j["owner"]["pid"] == d.pid
    assert os.sched_getaffinity(p.pid) == before
    assert enforce.task_cgroup(p.pid, 1) == group_before
    assert not [g for g in elastic_groups() if f"-{d.pid}-" in g]
    assert not list(state_dir_files())
