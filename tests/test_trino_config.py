"""Trino settings and the Hive view of a data set, without starting a JVM: derived from the plan and
the node's memory, and the data set served through hard links (no copy) with statistics prepared once."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tilewise import plan, topology
from tilewise.benchmarks.tpch.data import TABLES
from tilewise.data import Dataset
from tilewise.engines import memory
from tilewise.engines.trino import runtime as tc
from tilewise.engines.trino import hive as th
from tilewise.errors import TilewiseError, UsageError


@pytest.mark.parametrize("cores, want", [(1, 1), (2, 2), (3, 2), (8, 8), (12, 8), (0, 1)])
def test_task_concurrency_is_a_power_of_two_within_the_cores(cores, want):
    assert tc.task_concurrency(cores) == want


def test_jvm_options_follow_the_instance():
    opts = tc.jvm_options(3072, 8)
    assert "-Xmx3072m" in opts and "-XX:+UseG1GC" in opts  # G1 even when pinned to few CPUs
    assert "-XX:ParallelGCThreads=8" in opts and "-XX:ConcGCThreads=2" in opts
    one = tc.jvm_options(1024, 1)
    assert "-XX:ParallelGCThreads=1" in one and "-XX:ConcGCThreads=1" in one and "-XX:+UseG1GC" in one
    unbound = tc.jvm_options(1024, None)  # not bound: the JVM sizes itself
    assert not any(o.startswith("-XX:ParallelGCThreads") for o in unbound)


def test_memory_settings_fit_in_the_heap():
    s = tc.memory_settings(2000)
    q = int(s["query.max-memory-per-node"].removesuffix("MB"))
    h = int(s["memory.heap-headroom-per-node"].removesuffix("MB"))
    assert q == 800 and h == 500 and q + h < 2000  # Trino refuses to start when they exceed the heap


def test_heap_derived_from_node_memory_split_between_instances():
    t = topology.load("synthetic:Package:2 [NUMANode(memory=64GB)] L3Cache:2(size=32MB) Core:4 PU:1")
    mem = {n.id: n.memory_bytes for n in t.numa_nodes}
    win = tc.TrinoCluster.default_memory_mb(plan.plan(t, "win"), mem)
    wicp = tc.TrinoCluster.default_memory_mb(plan.plan(t, "wicp"), mem)
    assert win[0] == int(mem[0] * memory.MEMORY_FRACTION / 2**20)
    assert all(abs(v - win[0] / 2) <= 1 for v in wicp.values())  # two instances share each node
    assert tc.coordinator_memory_mb(win) == tc.COORDINATOR_MAX_MB  # big nodes: capped
    assert tc.coordinator_memory_mb({0: 1024}) == tc.COORDINATOR_MIN_MB


def test_node_and_cluster_properties():
    node = tc.node_properties("worker-1-ab", th.Path("/d"), "127.0.0.1")
    assert node["node.internal-address"] == node["node.bind-ip"] == "127.0.0.1"
    assert node["node.id"] == "worker-1-ab" and node["node.data-dir"] == "/d"
    c = tc.coordinator_config(8080, "10.0.0.1", 1024, 4000, th.Path("/p"))
    assert c["coordinator"] == "true" and c["node-scheduler.include-coordinator"] == "false"
    assert c["discovery.uri"] == "http://10.0.0.1:8080" and c["query.max-memory"] == "4000MB"
    w = tc.worker_config(9000, "http://10.0.0.1:8080", 2048, 3, th.Path("/p"))
    assert w["coordinator"] == "false" and w["task.concurrency"] == "2" and w["task.max-worker-threads"] == "6"
    assert w["http-server.http.port"] == "9000" and w["plugin.dir"] == "/p"
    assert tc.properties_text({"a": "1", "b": "x"}) == "a=1\nb=x\n"


def test_start_timeout_from_the_environment(monkeypatch):
    monkeypatch.delenv("TILEWISE_TRINO_START_TIMEOUT", raising=False)
    assert tc.ready_timeout_s() == tc.READY_TIMEOUT_S
    monkeypatch.setenv("TILEWISE_TRINO_START_TIMEOUT", "600")
    assert tc.ready_timeout_s() == 600
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv("TILEWISE_TRINO_START_TIMEOUT", bad)
        with pytest.raises(UsageError, match="TILEWISE_TRINO_START_TIMEOUT"):
            tc.ready_timeout_s()


@pytest.mark.parametrize("text, want", [("10.0.0.1:8080", ("10.0.0.1", 8080)),
                                        ("http://h:1/", ("h", 1)), ("https://h.example:443", ("h.example", 443))])
def test_coordinator_address(text, want):
    assert tc.coordinator_address(text) == want


@pytest.mark.parametrize("text", ["h", "h:0", "h:70000", "spark://h:1", ""])
def test_bad_coordinator_address(text):
    with pytest.raises(UsageError):
        tc.coordinator_address(text)


# ---- the Hive view -----------------------------------------------------------------------------

def _dataset(tmp_path, **kw) -> Dataset:
    d = tmp_path / "sf0.01"
    d.mkdir()
    import datetime
    import decimal

    for t in TABLES:
        pq.write_table(pa.table({f"{t}_key": pa.array([1, 2], pa.int64()),
                                 "price": pa.array([decimal.Decimal("1.25")] * 2, pa.decimal128(15, 2)),
                                 "name": pa.array(["a", "b"], pa.string()),
                                 "day": pa.array([datetime.date(1995, 1, 1)] * 2, pa.date32())}), d / f"{t}.parquet")
    return Dataset("tpch", 0.01, d, table_names=TABLES, **kw)


def test_schema_name_per_data_set(tmp_path):
    assert th.schema_name(Dataset("tpch", 1.0, tmp_path)) == "tpch_sf1"
    assert th.schema_name(Dataset("tpch", 0.01, tmp_path)) == "tpch_sf0_01"
    assert th.schema_name(Dataset("jcch", 10, tmp_path, seed=7)) == "jcch_sf10_s7"


def test_types_and_ddl(tmp_path):
    ds = _dataset(tmp_path)
    cols = th.parquet_columns(ds.tables["nation"])
    assert cols == [("nation_key", "bigint"), ("price", "decimal(15,2)"), ("name", "varchar"), ("day", "date")]
    ddl = th.table_ddl("tpch_sf0_01", "nation", cols, tmp_path / "x")
    assert ddl.startswith('CREATE TABLE hive."tpch_sf0_01"."nation" ("nation_key" bigint, "price" decimal(15,2)')
    assert f"external_location = 'local://{(tmp_path / 'x').resolve()}'" in ddl and "format = 'PARQUET'" in ddl
    with pytest.raises(TilewiseError):
        th.trino_type(pa.list_(pa.int8()))
    props = th.catalog_properties(tmp_path / "ms")
    assert props["hive.metastore"] == "file" and props["fs.native-local.enabled"] == "true"
    assert props["local.location"] == "/" and props["hive.metastore.catalog.dir"] == f"local://{tmp_path / 'ms'}"


def test_tables_are_hard_links_not_copies(tmp_path):
    ds = _dataset(tmp_path)
    wh = th.Warehouse(ds)
    assert wh.dir == ds.dir / "trino" and wh.cached
    dirs = wh.link_tables()
    for t, d in dirs.items():
        (f,) = list(d.iterdir())  # a directory per table holding only its file
        assert os.path.samefile(f, ds.tables[t]) and not f.is_symlink()
        assert os.stat(ds.tables[t]).st_nlink == 2
    wh.link_tables()  # idempotent
    assert all(os.stat(p).st_nlink == 2 for p in ds.tables.values())


def test_statistics_prepared_once_and_again_when_the_data_change(tmp_path):
    ds = _dataset(tmp_path)
    wh = th.Warehouse(ds)
    sql: list[str] = []

    def run(s):
        sql.append(s)
        if s.startswith("CREATE SCHEMA"):  # what the file metastore would write
            (wh.metastore / wh.schema).mkdir(parents=True, exist_ok=True)
        return []

    info = wh.prepare(run, "476")
    assert info == {"schema": "tpch_sf0_01", "prepared": True, "cached": True}
    assert sum(s.startswith("CREATE TABLE") for s in sql) == 8
    assert sum(s.startswith("ANALYZE") for s in sql) == 8
    n = len(sql)
    assert wh.prepare(run, "476")["prepared"] is False and len(sql) == n  # cached: nothing re-run
    assert wh.prepare(run, "477")["prepared"] is True  # another Trino version: prepared again
    # the data set regenerated (new file): its statistics are stale
    p = ds.tables["orders"]
    tmp = p.with_suffix(".new")
    pq.write_table(pa.table({"o": pa.array([1, 2, 3], pa.int64())}), tmp)
    os.replace(tmp, p)
    m = len(sql)
    assert wh.prepare(run, "477")["prepared"] is True and len(sql) > m
    assert os.path.samefile(wh.tables_dir / "orders" / "orders.parquet", p)  # the link follows the new file


def test_unwritable_data_set_uses_the_cluster_directory(tmp_path):
    ds = _dataset(tmp_path)
    (ds.dir / "trino").write_text("not a directory")  # <data>/trino cannot be made (as on a read-only mount)
    wh = th.Warehouse(ds, fallback_dir=tmp_path / "cluster")
    assert wh.dir == tmp_path / "cluster" / "warehouse" and not wh.cached


def test_a_query_refused_for_no_nodes_right_after_start_runs_once_when_they_appear(monkeypatch):
    """CI, load 3: the coordinator listed the worker as active, yet the first benchmark query got
    NO_NODES_AVAILABLE (the scheduler's view lags). Such a query was never scheduled: it is run again
    for up to NO_NODES_GRACE_S; any other error, and NO_NODES after the grace, is one error line."""
    calls = []

    def fake(host, port, sql, **kw):
        calls.append(sql)
        if len(calls) < 3:
            raise RuntimeError('TrinoQueryError(type=INSUFFICIENT_RESOURCES, name=NO_NODES_AVAILABLE, '
                               'message="No worker nodes available")')
        return ["x"], [(1,)], 0.01

    c = object.__new__(tc.TrinoCluster)
    c.endpoint = "http://127.0.0.1:1"
    monkeypatch.setattr(c, "check_alive", lambda what: None, raising=False)
    monkeypatch.setattr(tc, "run_sql", fake)
    monkeypatch.setattr(tc.time, "sleep", lambda s: None)
    assert c._sql("SELECT 1")[1] == [(1,)] and calls == ["SELECT 1"] * 3
    monkeypatch.setattr(tc, "NO_NODES_GRACE_S", 0.0)
    calls.clear()
    with pytest.raises(TilewiseError, match="trino query failed: .*NO_NODES_AVAILABLE"):
        c._sql("SELECT 1")
    assert len(calls) == 1

    def other(host, port, sql, **kw):
        calls.append(sql)
        raise RuntimeError("SYNTAX_ERROR: line 1:1: mismatched input")

    monkeypatch.setattr(tc, "NO_NODES_GRACE_S", 60.0)
    monkeypatch.setattr(tc, "run_sql", other)
    calls.clear()
    with pytest.raises(TilewiseError, match="SYNTAX_ERROR"):
        c._sql("SELEC 1")
    assert len(calls) == 1
