"""Cracking (`tilewise up --crack`): a deployment starts on raw CSV and its tables are transformed in
the background; a query loop keeps running, every answer is checked against the reference, and
each table is seen switching to its copy (on every engine that reads files in place and switches
a table: DuckDB, ClickHouse); a cracker killed with SIGKILL in the
middle of a table leaves the raw data untouched and its partial copy unread, and a restart sweeps
it and finishes. The background budget's decision is a pure function."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import run_cli
from tilewise import topology
from tilewise.data import layouts as L
from tilewise.elastic import budget, modes

Q6 = 6


@pytest.fixture(scope="module")
def tpch_dir(tmp_path_factory):
    """TPC-H SF 0.01: the Parquet set (the references) and the raw CSV, generated once."""
    from tilewise.benchmarks.tpch import data

    d = tmp_path_factory.mktemp("tpch")
    data.dataset(0.01, d)
    data.raw_dataset(0.01, "csv", d)
    return d


def _up(env, d, *extra, engine="duckdb"):
    cp = run_cli("up", "--engine", engine, "--policy", "wim", "--sf", "0.01", "--data-dir", str(d), "--raw", "csv",
                 "--name", "ck", *extra, env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr
    return cp


def _state(env):
    from tilewise import cluster

    old = os.environ.get("TILEWISE_CLUSTER_DIR")
    os.environ["TILEWISE_CLUSTER_DIR"] = env["TILEWISE_CLUSTER_DIR"]
    try:
        return cluster.load("ck")
    finally:
        if old is None:
            del os.environ["TILEWISE_CLUSTER_DIR"]
        else:
            os.environ["TILEWISE_CLUSTER_DIR"] = old


def _ask(st, ref):
    """Q6 on the deployment: (valid, the copy lineitem was read from before it ran)."""
    cl = st.cluster()
    try:
        before = cl.info(0)["tables"]["lineitem"]
        r = cl.run_query(ref.spec.catalog.text(Q6))
    finally:
        cl.close()
    return ref.check(Q6, list(r.rows)).ok, before


def _sums(d: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(d.glob("*.csv"))}


@pytest.mark.parametrize("engine", ["duckdb", "clickhouse"])
def test_queries_keep_running_and_switch_to_each_checked_copy(tpch_dir, state_env, engine, tmp_path):
    from tilewise.benchmarks.validate import Reference
    from tilewise.data import Dataset

    ref = Reference(Dataset.at(tpch_dir / "sf0.01", benchmark="tpch", sf=0.01))
    # a store of its own: every copy is made while the queries run (none is reused from another test)
    _up(state_env, tpch_dir, "--crack", "parquet-2", "--crack-pause", "0.4", "--layout-dir", str(tmp_path / "store"),
        engine=engine)
    try:
        seen, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            st = _state(state_env)
            ok, copy = _ask(st, ref)
            assert ok, f"a wrong answer while lineitem was read from {copy}"
            seen.append(copy)
            if st.data["crack"]["state"] in ("done", "failed") and copy == "parquet-2":
                break
        crack = _state(state_env).data["crack"]
        assert crack["state"] == "done", crack
        assert seen[0] == "csv" and seen[-1] == "parquet-2", seen  # the switch-over, seen by the queries
        assert all(v["state"] == "switched" and v["cost"]["bytes_written"] > 0 for v in crack["tables"].values())
        assert list(crack["tables"])[0] == "lineitem"  # largest first
        cp = run_cli("status", "--name", "ck", env=state_env)
        assert "cracking into parquet-2: done, 8 of 8 tables switched" in cp.stdout
    finally:
        cp = run_cli("down", "--name", "ck", env=state_env)
        assert cp.returncode == 0, cp.stderr


def test_a_killed_cracker_leaves_raw_data_untouched_and_a_restart_finishes(tpch_dir, state_env, tmp_path):
    from tilewise.benchmarks.validate import Reference
    from tilewise.data import Dataset

    ref = Reference(Dataset.at(tpch_dir / "sf0.01", benchmark="tpch", sf=0.01))
    raw = tpch_dir / "sf0.01-csv"
    before = _sums(raw)
    store = tmp_path / "store"
    _up(state_env, tpch_dir, "--crack", "parquet-2", "--layout-dir", str(store), "--crack-pause", "60")
    try:
        deadline = time.monotonic() + 60
        partial = []
        while not partial and time.monotonic() < deadline:  # the first file of lineitem is written
            partial = [p for p in (store / "lineitem").glob(".parquet-2.tmp-*") if (p / "part-00000.parquet").exists()]
            time.sleep(0.1)
        assert partial, "the cracker never wrote a file"
        pid = _state(state_env).data["crack"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        st = _state(state_env)
        assert st.data["crack"]["tables"]["lineitem"]["state"] == "transforming"  # it died in the middle
        ok, copy = _ask(st, ref)
        assert ok and copy == "csv"  # the half-made copy is never read
        assert not (store / "lineitem" / "parquet-2").exists() and partial[0].exists()
    finally:
        assert run_cli("down", "--name", "ck", env=state_env).returncode == 0
    assert _sums(raw) == before  # the raw data is untouched
    _up(state_env, tpch_dir, "--crack", "parquet-2", "--layout-dir", str(store))
    try:
        deadline = time.monotonic() + 120
        while _state(state_env).data["crack"]["state"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.3)
        st = _state(state_env)
        assert st.data["crack"]["state"] == "done", st.data["crack"]
        assert not list(store.glob("*/.*.tmp-*"))  # the partial copy was swept by the restart
        ok, copy = _ask(st, ref)
        assert ok and copy == "parquet-2"
        made = L.Store(store).lookup(L.TableSource.from_json(st.data["crack"]["raw"]["lineitem"]), L.CopySpec(2))
        assert made is not None and made.source.rows == 60175
    finally:
        assert run_cli("down", "--name", "ck", env=state_env).returncode == 0
    assert _sums(raw) == before


def test_crack_refuses_what_it_cannot_do(tpch_dir, state_env):
    cp = run_cli("up", "--engine", "duckdb", "--sf", "0.01", "--crack", "auto", "--name", "ck", env=state_env)
    assert cp.returncode == 2 and "start on them with --data DIR or --sf N --raw csv" in cp.stderr
    cp = run_cli("up", "--engine", "duckdb", "--policy", "wim", "--sf", "0.01", "--data-dir", str(tpch_dir), "--raw",
                 "csv", "--crack", "parquet-2+sorted-l_shipdate", "--name", "ck", env=state_env)
    assert cp.returncode == 2 and "a second copy needs each query routed" in cp.stderr
    assert not _state(state_env)  # nothing is left running or recorded


def test_the_background_budget_is_the_cores_the_allocator_would_not_give_the_deployment():
    t = topology.load("synthetic:Package:1 [NUMANode] L3Cache:1 Core:4 PU:1")
    pool = modes.make_pool(t)
    assert budget.background(pool, [0]) == (1, 2, 3)
    assert budget.background(pool, [0, 1, 2, 3]) == ()

    class Proc:  # a deployment whose one thread runs all the time, then not at all
        def __init__(self):
            self.busy, self.ns = True, 0

        def tree(self, pid):
            return {pid: pid}

        def times(self, tasks):
            return {t: (self.ns, 0) for t in tasks}

    clock = iter(range(1000))
    proc = Proc()
    b = budget.Budget(pool, [1], proc=proc, clock=lambda: float(next(clock)))
    for _ in range(6):  # busy on its one core: the net allocates one more core per tick
        proc.ns += 1_000_000_000 * len(b.allocated)
        cpus = b.tick()
    assert cpus == () and len(b.allocated) == 4
    for _ in range(6):  # idle: it releases them again, down to one core
        cpus = b.tick()
    assert len(b.allocated) == 1 and len(cpus) == 3
