"""The elastic daemon on a server's whole process tree (paper 002 under a process-per-connection
DBMS such as PostgreSQL): a child the target forks after the start (a new backend, a parallel
worker) is measured and re-bound within one tick, and adaptive mode's pages per node are summed
over the tree with shared memory (the server's shared buffers) counted once.

The target here is a small forking server (a parent that forks a child on request, the child
resetting its own CPU mask to every CPU, as a program may); tests/test_postgres_elastic.py does
the same with a real PostgreSQL server where one is installed."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from tilewise import topology
from tilewise.elastic import daemon, enforce, modes, petri
from tilewise.elastic.metrics import ProcFS, tree_pages

FORKER = r"""
import os, sys, time
flag, out = sys.argv[1], sys.argv[2]
spin = len(sys.argv) < 4  # "sleep": the child idles (the load stays low: the daemon keeps one core)
print("ready", flush=True)
while not os.path.exists(flag):
    time.sleep(0.005)
pid = os.fork()
if pid == 0:  # the new "backend": resets its mask to every CPU, then works
    os.sched_setaffinity(0, range(os.cpu_count()))
    with open(out + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(out + ".tmp", out)
    t = time.perf_counter()
    while time.perf_counter() - t < 30:
        if not spin:
            time.sleep(0.05)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / "journals"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_child_born_after_the_start_is_bound_within_one_tick(tmp_path, state_dir):
    flag, out = tmp_path / "fork", tmp_path / "child.pid"
    p = subprocess.Popen([sys.executable, "-c", FORKER, str(flag), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        t = topology.load(None)
        target = daemon.PidTarget(p.pid, rescan_s=3600.0)  # no full scan during the test: the tick must find it
        pool = modes.make_pool(t, target.allowed_cpus())
        unit = daemon.Unit(target.name, pool, petri.NetConfig(10, 100, pool.n_total), "dense", target)
        unit.enforcer = enforce.choose("affinity", p.pid, None)
        recs = []
        d = daemon.Daemon([unit], interval=0.1, log=recs.append)
        with d:
            d.start()
            assert len(unit.cpus) == 1 and os.sched_getaffinity(p.pid) == set(unit.cpus)
            time.sleep(0.1)
            d.tick()
            flag.touch()
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            child = int(out.read_text())
            assert len(os.sched_getaffinity(child)) > len(unit.cpus)  # it left the parent's mask
            d.tick()  # one tick: the child is in the tree, measured and bound
            assert os.sched_getaffinity(child) == set(unit.cpus), "the new child was not bound within one tick"
            assert child in set(target.tasks(None).values())
            assert recs[-1]["threads"] == 2  # the parent's thread and the child's, measured this tick
            assert recs[-1]["processes"] == 2 and recs[-1]["cpu_s"] >= 0
            # one journal entry covers every process the tree gains; none is written per new process
            journal = json.loads(unit.enforcer.session.journal.path.read_text())
            kinds = [(c["target"]["kind"], c["target"].get("pid")) for c in journal["changes"]]
            assert ("affinity-born-since", p.pid) in kinds and ("affinity", child) not in kinds, kinds
        assert not list(state_dir.glob("*.json"))  # restored: the child's mask was journaled and put back
        assert os.sched_getaffinity(child) == set(target.allowed_cpus())  # what the target had at the start
    finally:
        p.kill()
        p.wait()
        try:
            os.kill(int(out.read_text()), 9)
        except (OSError, ValueError):
            pass


def test_tree_pages_count_shared_objects_once():
    """Pure: private pages add up over the processes, a shared object counts once (per node, the
    most any process maps)."""
    shm = ("00:01", 7, 0)
    lib = ("08:01", 42, 0)
    postmaster = ({0: 100}, {shm: {0: 800, 1: 200}, lib: {0: 50}})
    backend1 = ({1: 300}, {shm: {0: 600, 1: 400}, lib: {0: 50}})
    backend2 = ({0: 10, 1: 20}, {shm: {0: 100}})
    assert tree_pages([postmaster, backend1, backend2]) == {0: 100 + 10 + 800 + 50, 1: 300 + 20 + 400}
    assert tree_pages([]) == {}


def test_tree_pages_of_a_real_tree_count_the_shared_segment_once():
    """A parent touches a 32 MiB shared segment, three forked children read all of it: the tree
    holds the segment once (a plain sum over the processes would count it four times)."""
    size = 32 << 20
    seg = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
    for i in range(0, size, 4096):
        seg[i] = 1
    kids = []
    r, w = os.pipe()
    try:
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(r)
                s = sum(seg[i] for i in range(0, size, 4096))
                os.write(w, b"x" if s == size // 4096 else b"!")
                time.sleep(60)
                os._exit(0)
            kids.append(pid)
        os.close(w)
        got = b""
        while len(got) < 3:
            got += os.read(r, 3)
        assert got == b"xxx"
        proc = ProcFS()
        pids = [os.getpid(), *kids]
        def plain_sum():
            return sum(sum(proc.numa_pages(p).values()) for p in pids)

        # the test process (pytest) can grow between reads: read the plain sum before and after
        before = plain_sum()
        once = sum(proc.tree_pages(pids).values())
        summed = max(before, plain_sum())
        seg_pages = size // 4096
        assert summed >= 4 * seg_pages  # every process maps the whole segment
        assert seg_pages <= once <= summed - 3 * seg_pages + 3 * 64, (once, summed)
    finally:
        for k in kids:
            os.kill(k, 9)
            os.waitpid(k, 0)
        seg.close()


DAEMON = r"""
import os, sys, time
from tilewise import topology
from tilewise.elastic import daemon, enforce, modes, petri
pid, started, child_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
t = topology.load(None)
target = daemon.PidTarget(pid, rescan_s=3600.0)
pool = modes.make_pool(t, target.allowed_cpus())
unit = daemon.Unit(target.name, pool, petri.NetConfig(10, 100, pool.n_total), "dense", target)
unit.enforcer = enforce.choose("affinity", pid, None)
d = daemon.Daemon([unit], interval=0.1)
d.start()
open(started, "w").close()
while not os.path.exists(child_file):
    time.sleep(0.01)
time.sleep(0.1)
d.tick()
print("bound", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_restore_after_kill_9_gives_the_children_born_meanwhile_their_cpus_back(tmp_path):
    """The daemon is killed hard after binding a child born during its run: `tilewise restore`
    gives the target and that child (journaled only through the tree's one entry) every CPU back."""
    flag, out, started = tmp_path / "fork", tmp_path / "child.pid", tmp_path / "started"
    allowed = os.sched_getaffinity(0)
    p = subprocess.Popen([sys.executable, "-c", FORKER, str(flag), str(out), "sleep"], stdout=subprocess.PIPE, text=True)
    dmn = None
    try:
        assert p.stdout.readline().strip() == "ready"
        dmn = subprocess.Popen([sys.executable, "-c", DAEMON, str(p.pid), str(started), str(out)],
                               stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        flag.touch()
        assert dmn.stdout.readline().strip() == "bound"
        child = int(out.read_text())
        assert len(os.sched_getaffinity(child)) == 1 and len(os.sched_getaffinity(p.pid)) == 1
        dmn.kill()
        dmn.wait()
        cp = run_cli("restore", "--json")
        assert cp.returncode == 0, cp.stderr
        assert os.sched_getaffinity(p.pid) == allowed
        assert os.sched_getaffinity(child) == allowed, "the child born during the run was not given its CPUs back"
    finally:
        for proc in (dmn, p):
            if proc is not None:
                proc.kill()
                proc.wait()
        try:
            os.kill(int(out.read_text()), 9)
        except (OSError, ValueError):
            pass
