"""The PostgreSQL engine's decisions, without a server: settings from the instance, who runs the
servers, why a server did not start (from real PostgreSQL 15 log lines), the keys a load builds,
the CSV COPY reads, the dialect's rewrites, and the validator's rule for a decimal finer than the
float it is compared with."""

from __future__ import annotations

import datetime as dt
import os
import pwd
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tilewise import benchmarks, engines
from tilewise.benchmarks.validate import values_equal
from tilewise.benchmarks.jcch import data as jcch_data
from tilewise.benchmarks.tpch.data import KEYS as TPCH_KEYS
from tilewise.data import Dataset
from tilewise.engines.contract import Query
from tilewise.engines.postgres import home, load, runtime, settings
from tilewise.errors import UsageError


# ---- settings ---------------------------------------------------------------------------------------

def test_memory_settings_follow_the_instance():
    s = settings.memory_settings(16000, 2)
    assert s["shared_buffers"] == "4000MB"  # a quarter
    # the rest (12000 MB) over 2 (hash_mem_multiplier) x 4 nodes x 2 cores
    assert s["work_mem"] == "750MB"
    assert s["maintenance_work_mem"] == "2048MB" and s["effective_cache_size"] == "12000MB"
    one = settings.memory_settings(16000, 1)
    assert settings.mb(one["work_mem"]) == 2 * settings.mb(s["work_mem"])  # fewer cores, more per process
    small = settings.memory_settings(256, 8)
    assert small["shared_buffers"] == "128MB" and small["work_mem"] == "4MB"  # the floors
    huge = settings.memory_settings(1 << 22, 1)
    assert huge["work_mem"] == "2048MB"  # the cap


def test_parallel_and_io_settings():
    assert settings.parallel_settings(1) == {"max_worker_processes": "9", "max_parallel_workers": "1",
                                             "max_parallel_workers_per_gather": "0",
                                             "max_parallel_maintenance_workers": "0"}
    p = settings.parallel_settings(16)
    assert p["max_parallel_workers"] == "16" and p["max_parallel_workers_per_gather"] == "15"
    assert settings.io_settings(False) == {"effective_io_concurrency": "200", "random_page_cost": "1.1"}
    assert settings.io_settings(True) == settings.io_settings(None) == {"effective_io_concurrency": "1",
                                                                         "random_page_cost": "4"}
    s = settings.server_settings(4, 8000, rotational=False)
    assert s["jit"] == ("on" if settings.JIT_DEFAULT else "off") and s["wal_level"] == "minimal"
    assert settings.server_settings(4, 8000, rotational=False, jit=True)["jit"] == "on"
    assert settings.jit_choice({settings.JIT_VAR: "on"}) and not settings.jit_choice({settings.JIT_VAR: "OFF"})
    assert settings.jit_choice({}) == settings.JIT_DEFAULT
    with pytest.raises(UsageError, match=settings.JIT_VAR):
        settings.jit_choice({settings.JIT_VAR: "maybe"})


def test_argv_and_hba():
    argv = settings.argv(Path("/usr/lib/postgresql/15/bin/postgres"), Path("/d"), {"port": "5", "jit": "off"})
    assert argv == ["/usr/lib/postgresql/15/bin/postgres", "-D", "/d", "-c", "port=5", "-c", "jit=off"]
    hba = settings.hba("127.0.0.1")
    assert hba.splitlines()[0] == "local all all trust" and "samenet" not in hba
    assert all("scram-sha-256" in ln for ln in hba.splitlines()[1:])  # TCP asks for the password
    assert "host all all samenet scram-sha-256" in settings.hba("10.0.0.5")


# ---- who runs the servers --------------------------------------------------------------------------

def _pw(name, uid):
    return pwd.struct_passwd((name, "x", uid, uid, "", "/", "/bin/sh"))


def test_run_as():
    me = home.run_as(euid=1000, environ={}, lookup=lambda n: _pw(n, 5))
    assert not me.switch and me.popen_kwargs() == {}
    root = home.run_as(euid=0, environ={}, lookup=lambda n: _pw(n, 999))
    assert root.switch and root.name == "tilewise" and root.popen_kwargs() == {"user": 999, "group": 999,
                                                                                 "extra_groups": []}
    assert root.env({"HOME": "/root", "X": "1"}) == {"HOME": "/", "X": "1", "USER": "tilewise", "LOGNAME": "tilewise"}
    other = home.run_as(euid=0, environ={home.USER_VAR: "pg"}, lookup=lambda n: _pw(n, 70))
    assert other.name == "pg" and other.uid == 70

    def missing(name):
        raise KeyError(name)

    with pytest.raises(UsageError, match="refuses to run as root.*'tilewise'.*does not exist.*useradd"):
        home.run_as(euid=0, environ={}, lookup=missing)
    with pytest.raises(UsageError, match="root too"):
        home.run_as(euid=0, environ={home.USER_VAR: "root"}, lookup=lambda n: _pw(n, 0))


def test_missing_server_binary(monkeypatch, tmp_path):
    monkeypatch.setenv(home.BIN_VAR, str(tmp_path / "nowhere"))
    why = engines.get("postgres").missing()
    assert why and home.BIN_VAR in why and "postgres and initdb" in why


def test_traversable(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    st = os.stat(closed)
    assert runtime.traversable(closed / "x", st.st_uid, {st.st_gid}) is None  # its owner enters
    other = st.st_uid + 12345
    if os.stat(tmp_path).st_mode & 0o001 and all(os.stat(p).st_mode & 0o001 for p in tmp_path.parents):
        assert runtime.traversable(closed / "x", other, {other}) == closed


def test_base_port():
    assert runtime.base_port({}) is None
    assert runtime.base_port({runtime.PORT_VAR: "6000"}) == 6000
    for bad in ("80", "70000", "x"):
        with pytest.raises(UsageError, match=runtime.PORT_VAR):
            runtime.base_port({runtime.PORT_VAR: bad})


# ---- why a server did not start (PostgreSQL 15's own lines) ----------------------------------------------

PORT_IN_USE = """2026-11-27 02:00:01.000 UTC [5] LOG:  could not bind IPv4 address "127.0.0.1": Address already in use
2026-11-27 02:00:01.000 UTC [5] HINT:  Is another postmaster already running on port 5433? If not, wait a few seconds and retry.
2026-11-27 02:00:01.000 UTC [5] WARNING:  could not create listen socket for "127.0.0.1"
2026-11-27 02:00:01.000 UTC [5] FATAL:  could not create any TCP/IP sockets
"""
NO_MEMORY = """2026-11-27 02:00:01.000 UTC [5] FATAL:  could not map anonymous shared memory: Cannot allocate memory
2026-11-27 02:00:01.000 UTC [5] HINT:  This error usually means that PostgreSQL's request for a shared memory segment exceeded available memory, swap space, or huge pages.
"""
BAD_VALUE = """2026-11-27 02:00:01.000 UTC [5] FATAL:  -1 MB is outside the valid range for parameter "work_mem" (64 .. 2147483647)
"""
DENIED = """2026-11-27 02:00:01.000 UTC [5] FATAL:  could not open file "postmaster.pid": Permission denied
"""


def test_failure_names_the_fix():
    what, fix = runtime.failure(PORT_IN_USE)
    assert "port is in use" in what and runtime.PORT_VAR in fix
    what, fix = runtime.failure(NO_MEMORY)
    assert "refused its memory settings" in what and "--worker-memory" in fix
    what, fix = runtime.failure(BAD_VALUE)
    assert "work_mem" in what and "--worker-memory" in fix
    what, fix = runtime.failure(DENIED)
    assert "data directory" in what and runtime.DIR_VAR in fix
    assert runtime.failure("LOG:  starting PostgreSQL 15\n") is None
    assert runtime.failure("FATAL:  something else\n") == ("something else", "")


# ---- the load ---------------------------------------------------------------------------------------

def test_key_statements_tpch_and_jcch():
    tables = {t for t, _ in TPCH_KEYS.primary}
    pks, idx, fks = load.key_statements(TPCH_KEYS, tables)
    assert len(pks) == 8 and len(fks) == 8
    assert any('"lineitem" ADD CONSTRAINT "lineitem_pkey" PRIMARY KEY ("l_orderkey", "l_linenumber")' in s for s in pks)
    # l_orderkey is the primary key's leading column: no second index; (l_partkey, l_suppkey) gets one
    assert not any('("l_orderkey")' in s for s in idx)
    assert any('ON "lineitem" ("l_partkey", "l_suppkey")' in s for s in idx)
    assert not any('"partsupp" ("ps_partkey")' in s for s in idx) and any('"partsupp" ("ps_suppkey")' in s for s in idx)
    assert all(s.endswith("DEFERRABLE INITIALLY DEFERRED") for s in fks)
    jpks, jidx, jfks = load.key_statements(jcch_data.KEYS, tables)
    assert jpks == pks and jidx == idx  # the same indexes ...
    assert jfks == fks  # JCC-H's refresh sets keep every key too: the same constraints
    # keys of tables that are not loaded are left out
    assert load.key_statements(TPCH_KEYS, {"region", "nation"}) == (
        [pks[0], pks[1]], [idx[0]] if "n_regionkey" in idx[0] else [], [fks[0]])


def test_csv_for_copy(tmp_path):
    t = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "s": pa.array(["a,b", "", None], pa.string_view()),
                  "d": pa.array([dt.date(1995, 3, 15), None, dt.date(1998, 12, 1)], pa.date32()),
                  "m": pa.array([Decimal("0.04"), Decimal("-1.10"), None], pa.decimal128(15, 2))})
    f = tmp_path / "t.parquet"
    pq.write_table(t, f)
    text = b"".join(load.csv_chunks(f, batch_rows=2)).decode()
    assert text.splitlines() == ['1,"a,b",1995-03-15,0.04', '2,"",,-1.10', "3,,1998-12-01,"]
    ddl = load.table_ddl("t", f)
    assert ddl == 'CREATE TABLE "t" ("k" bigint, "s" text, "d" date, "m" numeric(15,2))'
    assert load.table_ddl("x", f, temp=True).startswith('CREATE TEMPORARY TABLE "x"')
    assert load.table_ddl("x", f, temp=True).endswith("ON COMMIT DROP")
    assert load.copy_sql("t", freeze=True) == 'COPY "t" FROM STDIN (FORMAT csv, FREEZE)'


def test_template_is_keyed_by_the_data(tmp_path):
    for name in ("region", "nation"):
        pq.write_table(pa.table({"x": [1]}), tmp_path / f"{name}.parquet")
    ds = Dataset.at(tmp_path, table_names=("region", "nation"))
    tpl = load.Template(ds, 15)
    assert tpl.cached and tpl.dir == tmp_path / "postgres" / "pg15" and tpl.ready() is None
    built = tmp_path / "built"
    (built / "sub").mkdir(parents=True)
    (built / "PG_VERSION").write_text("15\n")
    with tpl.use(lambda: tpl.store(built, {"load_s": 1.0}) or {}) as (doc, now):
        assert now and doc["load"] == {"load_s": 1.0} and (tpl.data_dir / "PG_VERSION").exists()
    with tpl.use(lambda: pytest.fail("loaded twice")) as (doc, now):
        assert not now
    assert load.Template(ds, 16).ready() is None  # another major: another cache
    pq.write_table(pa.table({"x": [2]}), tmp_path / "nation.parquet")  # the data changed
    assert tpl.ready() is None


# ---- the dialect --------------------------------------------------------------------------------------

def test_q17_rewrite_tpch_and_jcch():
    spec = engines.get("postgres")
    for bench in ("tpch", "jcch"):
        qs = benchmarks.get(bench).query_set(None, seed=0, sf=0.01)
        sql = spec.sql(qs.sql(17, 0), Query(bench, 17, 0, "q17"))
        assert "cross join lateral" in sql and "part_avg.avg_quantity" in sql and "(\n        select" not in sql
        assert spec.sql(qs.sql(6, 0), Query(bench, 6, 0, "q06")) == qs.sql(6, 0)  # the others as written


@pytest.mark.parametrize("params", ["qualification", None])
def test_tpcds_rewrites_match_every_stream(params):
    from tilewise.engines.postgres.dialect import TPCDS

    spec = engines.get("postgres")
    qs = benchmarks.get("tpcds").query_set(params, seed=0, sf=0.01)
    for q in TPCDS:
        for stream in (0, 1, 2):
            text = qs.sql(q, stream)
            out = spec.sql(text, Query("tpcds", q, stream, q))  # each rule matched as often as it says
            assert out != text and "lochierarchy = 0" not in out


# ---- validation: PostgreSQL's numeric against a float reference -------------------------------------------

def test_decimal_finer_than_the_float_is_compared_as_a_float():
    # TPC-H Q14 SF 0.01: PostgreSQL's numeric, DataFusion's double
    assert values_equal(["dec", "15.5367560122320627"], ["f", "15.536756012232063"], True)
    assert values_equal(["dec", "3.0896144147919913"], ["f", "3.089614414791991"], False)
    assert not values_equal(["dec", "15.5367570122320627"], ["f", "15.536756012232063"], True)  # 1e-7 off
    # a float against a decimal whose places it resolves stays exact (a float sum two ulps off is wrong)
    assert not values_equal(["f", "1029418531.5233523"], ["dec", "1029418531.523350"], False)
    assert values_equal(["f", "1029418531.52335"], ["dec", "1029418531.523350"], False)
    assert not values_equal(["dec", "0.05"], ["f", "0.06"], False)
