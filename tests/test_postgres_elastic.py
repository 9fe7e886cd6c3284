"""The elastic daemon on a real PostgreSQL server (paper 002 under a process-per-connection DBMS):
a backend the postmaster forks for a new connection, and the parallel workers it forks for a
parallel query, are part of the tree and bound at the first tick after they appear (and, with a
cgroup v1 cpuset, born inside the daemon's group and put back with it). Each new
process first gets every CPU back (as a program may reset its own mask), so the tick, not
inheritance, is what binds it. Skipped where PostgreSQL is not installed (`make setup`)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tilewise import benchmarks, engines, plan, procs, topology
from tilewise.elastic import daemon, enforce, modes, petri

pytestmark = [pytest.mark.skipif(bool(engines.missing("postgres")), reason=f"PostgreSQL: {engines.missing('postgres')}"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")]

ALL = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def server(tmp_path_factory, tpch_sf001):
    """One PostgreSQL server on every CPU serving TPC-H SF 0.01 (and a small table of the tests)."""
    os.environ.setdefault("TILEWISE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    data = benchmarks.get("tpch").data.dataset(0.01, tpch_sf001)
    rt = engines.get("postgres").runtime_class()()
    rt.start(plan.plan(topology.load(None), "wim"), dataset=data)
    try:
        rt.run_query("CREATE TABLE IF NOT EXISTS tw_elastic AS SELECT g FROM generate_series(1, 3000) g")
        rt.run_query("ANALYZE tw_elastic")
        yield rt
    finally:
        rt.stop()


@pytest.fixture
def controlled(server, tmp_path, monkeypatch):
    """The daemon on the postmaster's tree (affinity, one core, no full scan during the test)."""
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(tmp_path / "state"))
    server.close()  # no idle connection left: a query's backend is born after the start
    pid = server.status()[0].pid
    target = daemon.PidTarget(pid, rescan_s=3600.0)
    pool = modes.make_pool(topology.load(None), target.allowed_cpus())
    unit = daemon.Unit(target.name, pool, petri.NetConfig(10, 100, pool.n_total), "dense", target)
    unit.enforcer = enforce.choose("affinity", pid, None)
    recs: list[dict] = []
    d = daemon.Daemon([unit], interval=0.1, log=recs.append)
    with d:
        d.start()
        yield d, unit, target, recs
    assert sorted(os.sched_getaffinity(pid)) == ALL  # restored


def _escape(pid: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), ALL)


def _children(pid: int, what: str) -> list[int]:
    table = procs.scan()
    out = []
    for p in procs.descendants([pid], table):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if what.encode() in f.read():
                    out.append(p)
        except OSError:
            continue
    return out


def test_a_new_backend_is_bound_within_one_tick(server, controlled):
    d, unit, target, recs = controlled
    hold = threading.Thread(target=server.run_query, args=("SELECT pg_sleep(3)",))  # keeps a connection busy
    hold.start()
    try:
        time.sleep(0.3)
        backend = server.run_query("SELECT pg_backend_pid()").rows[0][0]  # a new connection: a new backend
        _escape(backend)
        assert sorted(os.sched_getaffinity(backend)) == ALL
        d.tick()
        assert sorted(os.sched_getaffinity(backend)) == sorted(unit.cpus), "the new backend was not bound in one tick"
        assert backend in set(target.tasks(None).values())
        assert recs[-1]["processes"] == len(set(target.tasks(None).values())) >= 3  # postmaster, its helpers, 2 backends
    finally:
        hold.join()


def test_parallel_workers_are_bound_within_one_tick(server, controlled):
    d, unit, target, recs = controlled
    for setting in ("max_parallel_workers_per_gather = 2", "parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                    "min_parallel_table_scan_size = 0", "parallel_leader_participation = off"):
        server.run_query(f"SET {setting}")  # the pooled connection keeps its session settings
    sql = "SELECT count(*) FROM tw_elastic WHERE pg_sleep(0.001) IS NOT NULL"
    plan_text = " ".join(r[0] for r in server.run_query("EXPLAIN " + sql).rows)
    assert "Parallel Seq Scan" in plan_text, plan_text
    root = target.pid
    q = threading.Thread(target=server.run_query, args=(sql,))
    q.start()
    try:
        deadline = time.monotonic() + 20
        workers: list[int] = []
        while not workers and time.monotonic() < deadline:
            workers = _children(root, "parallel worker")
            time.sleep(0.01)
        assert workers, "no parallel worker appeared"
        for w in workers:
            _escape(w)
        d.tick()
        live = [w for w in workers if os.path.exists(f"/proc/{w}")]
        assert live, "the workers ended before the tick (the query was too short)"
        for w in live:
            assert sorted(os.sched_getaffinity(w)) == sorted(unit.cpus), f"parallel worker {w} not bound in one tick"
    finally:
        q.join()


def test_cgroup_mode_holds_the_whole_server(server, tmp_path, monkeypatch):
    """cgroup v1 (this host's cpuset hierarchy): the postmaster's tree is moved into a group of the
    daemon's own; a backend born later is born inside it (no journal entry of its own) and is put
    back with the rest when the group is removed."""
    m = enforce.mounts()["v1"]
    if not m or not os.access(m, os.W_OK):
        pytest.skip("no writable cgroup v1 cpuset hierarchy here")
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(tmp_path / "state"))
    pid = server.status()[0].pid
    before = enforce.task_cgroup(pid, 1)
    target = daemon.PidTarget(pid, rescan_s=3600.0)
    pool = modes.make_pool(topology.load(None), target.allowed_cpus())
    unit = daemon.Unit(target.name, pool, petri.NetConfig(10, 100, pool.n_total), "dense", target)
    unit.enforcer = enforce.choose("cgroup", pid, None, tree_pids=set(target.tasks().values()))
    d = daemon.Daemon([unit], interval=0.1)
    server.close()  # no idle connection left: the next query's backend is born after the start
    hold = threading.Thread(target=server.run_query, args=("SELECT pg_sleep(1)",))
    with d:
        d.start()
        group = unit.enforcer.path
        ours = "/" + os.path.relpath(group, m)
        try:
            hold.start()
            time.sleep(0.3)
            backend = server.run_query("SELECT pg_backend_pid()").rows[0][0]
            d.tick()
            assert enforce.task_cgroup(backend, 1) == ours
            assert sorted(os.sched_getaffinity(backend)) == sorted(unit.cpus)
            journal = unit.enforcer.session.journal.path.read_text()
            assert f'"pid": {backend},' not in journal  # born inside: nothing journaled for it
        finally:
            hold.join()
    assert not os.path.exists(group)
    assert enforce.task_cgroup(pid, 1) == before and enforce.task_cgroup(backend, 1) == before
    assert sorted(os.sched_getaffinity(backend)) == ALL
