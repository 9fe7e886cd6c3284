"""Integration: bound processes on this machine, checked through /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tilewise import allocators, cpulist, launch, plan, procs, topology, verification
from tilewise.binding import Binding

from conftest import FIXTURES

PY = sys.executable
LAST_CPU = max(os.sched_getaffinity(0))
REPORT = ("import os;"
          "s=open('/proc/self/status').read().splitlines();"
          "print([l.split(':')[1].strip() for l in s if l.startswith('Cpus_allowed_list')][0]);"
          "print(open('/proc/self/numa_maps').readline().split()[1]);"
          "print(any('{lib}' in l for l in open('/proc/self/maps')))")


def test_exec_binds_the_child(cli):
    last = plan.plan(topology.load(None), "wic", mem="membind").instances[-1]  # this machine's last core
    cp = cli("exec", "--policy", "wic", "--instance", str(last.id), "--mem", "membind",
             "--", PY, "-c", REPORT.format(lib="libc"), check=True)
    cpus, policy, _ = cp.stdout.split()
    assert cpus == cpulist.format(last.cpus)
    assert policy == f"bind:{cpulist.format(last.mem_nodes)}"  # the node holding that core
    assert "verified" in cp.stderr


@pytest.mark.parametrize("name", [n for n in allocators.names() if n != "system"])
def test_exec_preloads_the_allocator(cli, name):
    lib = os.path.basename(allocators.find_library(name))
    cp = cli("exec", "--policy", "wim", "--allocator", name, "--json", "--",
             PY, "-c", REPORT.format(lib=lib) + ";import time;time.sleep(0.3)", check=True)
    doc = json.loads(cp.stdout)
    assert doc["verification"]["allocator_loaded"] is True
    assert doc["verification"]["ok"] is True
    assert doc["binding"]["allocator"] == name
    assert "True" in cp.stderr.split()  # the child saw the library in its own /proc/self/maps


def test_exec_json_and_exit_code(cli):
    cp = cli("exec", "--policy", "wim", "--mem", "interleave", "--json", "--", "sh", "-c", "exit 3")
    assert cp.returncode == 3
    doc = json.loads(cp.stdout)
    assert doc["returncode"] == 3 and doc["policy"] == "wim"
    assert doc["verification"]["cpus"] and doc["instance"]["mem_policy"] == "interleave"


@pytest.mark.parametrize("args,msg", [
    (["--allocator", "hoard", "--", "true"], "unknown allocator"),
    (["--policy", "wic", "--instance", "99", "--", "true"], "instance 99 does not exist"),
    (["--", "/nonexistent/cmd"], "command not found"),
    (["--topology", str(FIXTURES / "epyc7713x2.xml"), "--policy", "wicp", "--", "true"], "not this machine"),
])
def test_exec_errors(cli, args, msg):
    cp = cli("exec", *args)
    assert cp.returncode != 0
    assert msg in cp.stderr and cp.stderr.startswith("Error: ") and "Traceback" not in cp.stderr


def test_exec_spread_needs_two_nodes_with_cpus(cli):
    """Refused in one line on a one-node machine; runs where there are several (the QEMU guests)."""
    cp = cli("exec", "--policy", "spread", "--", "true")
    if len(topology.load(None).cpu_nodes) < 2:
        assert cp.returncode == 2 and cp.stderr.startswith("Error: spread needs at least 2 NUMA nodes")
        assert cp.stderr.count("\n") == 1
    else:
        assert cp.returncode == 0, cp.stderr


def test_exec_with_saved_plan(cli, tmp_path):
    saved = tmp_path / "plan.json"
    cli("plan", "--policy", "wic", "--save", str(saved), "--json", check=True)
    cp = cli("exec", "--plan", str(saved), "--instance", "0", "--", PY, "-c", REPORT.format(lib="libc"), check=True)
    assert cp.stdout.split()[0] == str(min(os.sched_getaffinity(0)))


def test_exported_topology_of_this_machine_is_runnable(cli, tmp_path):
    xml = tmp_path / "here.xml"
    cli("topo", "--export", str(xml), check=True)
    cp = cli("exec", "--topology", str(xml), "--policy", "wim", "--", "true")
    assert cp.returncode == 0, cp.stderr


def _binding_for_this_machine(policy="wim", **kw) -> Binding:
    p = plan.plan(topology.load(None), policy, **kw)
    return Binding.from_instance(p.instances[0])


def test_verify_reports_a_mismatch():
    proc = subprocess.Popen(["sleep", "5"])
    try:
        wrong = Binding((0,) if LAST_CPU else (0, 1), "membind", (0,))
        v = verification.verify(proc.pid, wrong)
        if os.sched_getaffinity(0) != {0}:
            assert not v.ok
            assert v.checks["cpus"].state == "mismatch"
            assert any(p.startswith("cpus: MISMATCH: wanted") for p in v.problems)
        assert v.checks["memory"].state == "mismatch" and v.checks["memory"].got == "default"
        assert any("memory: MISMATCH: wanted bind:0, process has default" in p for p in v.problems)
        assert not v.ok and not v.verified and v.verdict is False
    finally:
        proc.kill()
        proc.wait()


def test_spawn_and_verify_each_policy():
    for mem in ("first-touch", "membind", "interleave", "preferred", "local"):
        b = _binding_for_this_machine("wic", mem=mem)
        proc = launch.spawn(["sleep", "2"], b)
        try:
            v = verification.verify(proc.pid, b)
            assert v.ok, (mem, v.problems)
            assert v.cpus == b.cpus
        finally:
            procs.stop(proc)


def test_binding_of_a_child_is_inherited_by_grandchildren():
    b = _binding_for_this_machine("wic")
    proc = launch.spawn(["sh", "-c", "sleep 3 & wait"], b)
    try:
        time.sleep(0.3)
        import psutil

        kids = psutil.Process(proc.pid).children()
        assert kids
        assert verification.verify(kids[0].pid, b).ok
    finally:
        procs.stop(proc)


def test_supervisor_leaves_no_orphans():
    import psutil

    b = _binding_for_this_machine("wim")
    with launch.Supervisor() as sup:
        s = sup.start("tree", ["sh", "-c", "sleep 30 & sleep 30 & wait"], b)
        time.sleep(0.3)
        tree = [s.pid] + [c.pid for c in psutil.Process(s.pid).children(recursive=True)]
        assert len(tree) >= 3
    time.sleep(0.1)
    for pid in tree:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_supervisor_detects_a_crashed_child():
    b = _binding_for_this_machine("wim")
    with launch.Supervisor() as sup:
        sup.start("crasher", ["sh", "-c", "exit 7"], b, verify_binding=False)
        sup.start("sleeper", ["sleep", "10"], b)
        deadline = time.time() + 5
        while not sup.check() and time.time() < deadline:
            time.sleep(0.05)
        dead = sup.check()
        assert [(s.name, rc) for s, rc in dead] == [("crasher", 7)]


def test_bad_cpu_binding_is_a_clear_error():
    with pytest.raises(launch.LaunchError, match="could not bind"):
        launch.spawn(["true"], Binding((4095,)))


def test_exec_sigterm_stops_the_child(tmp_path):
    import psutil

    exe = os.path.join(os.path.dirname(PY), "tilewise")
    p = subprocess.Popen([exe, "exec", "--policy", "wim", "--", "sleep", "30"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    kids = []
    while time.time() < deadline and not kids:
        kids = [c for c in psutil.Process(p.pid).children() if c.name() == "sleep"]
        time.sleep(0.05)
    assert kids
    p.terminate()
    p.wait(timeout=10)
    assert p.returncode == 128 + 15  # forwarded: the command died of SIGTERM, as in a shell
    time.sleep(0.1)
    assert not psutil.pid_exists(kids[0].pid) or kids[0].status() == psutil.STATUS_ZOMBIE

