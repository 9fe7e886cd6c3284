"""The DuckDB worker path (what tilewise adds to each query): Arrow answers equal to fetchall's,
threads reused across queries (leader/followers), concurrent clients; and the plain-DuckDB baseline
the overhead benchmark compares with."""

from __future__ import annotations

import decimal
import json
import os
import subprocess
import sys
import threading

import duckdb
import pytest

from tilewise import plan, topology
from tilewise.benchmarks.tpch import queries
from tilewise.data import Dataset
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.engines.contract import ArrowRows
from tilewise.engines.duckdb.runtime import DuckDBServers as DuckDBEngine
from tilewise.engines.duckdb.server import SMALL


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-data")
    tpch_data.ensure_data(0.01, root)
    return root


# ---- the plain baseline ------------------------------------------------------------------------

def test_plain_baseline_runs_the_given_sql_in_order(data_root, tmp_path):
    sql = [{"query": 6, "sql": queries.load(6)}, {"query": 1, "sql": queries.load(1)}]
    (tmp_path / "q.json").write_text(json.dumps(sql))
    for fetch in ("worker", "rows"):
        cp = subprocess.run([sys.executable, "-m", "tilewise.bench.plain_duckdb", "--sf", "0.01", "--runs", "2",
                             "--data", str(data_root / "sf0.01"), "--sql", str(tmp_path / "q.json"), "--fetch", fetch,
                             "--cpus", "0", "--json"], capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, cp.stderr
        doc = json.loads(cp.stdout)
        assert doc["order"] == [6, 1] and list(doc["queries"]) == ["q6", "q1"] and doc["fetch"] == fetch
        assert doc["threads"] == 1 and doc["cpus"] == [0]  # bound before DuckDB sized its pool
        assert len(doc["run_wall_s"]) == 2 and all(len(v) == 2 for v in doc["queries"].values())
        assert all(w >= sum(v[i] for v in doc["queries"].values()) for i, w in enumerate(doc["run_wall_s"]))


def test_plain_baseline_says_when_data_is_missing(tmp_path):
    for args, says in ((["--tables", "region,nation"], "has no region.parquet"), ([], "has no <table>.parquet")):
        cp = subprocess.run([sys.executable, "-m", "tilewise.bench.plain_duckdb", "--data", str(tmp_path), *args],
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode != 0 and cp.stderr.startswith("Error:") and says in cp.stderr, cp.stderr


# ---- the worker path ---------------------------------------------------------------------------

def test_answers_equal_fetchall_values_and_types(data_root):
    ds = Dataset.at(data_root / "sf0.01", sf=0.01)
    con = duckdb.connect()
    for t, p in ds.tables.items():
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{p}')")
    p = plan.plan(topology.load(None), "wim")
    with DuckDBEngine() as eng:
        eng.start(p, dataset=ds)
        for n in queries.NUMBERS:
            r = eng.run_query(queries.load(n))
            want = con.execute(queries.load(n)).fetchall()
            assert isinstance(r.rows, ArrowRows) == (len(want) >= SMALL) and len(r.rows) == len(want)
            got = list(r.rows)
            assert got == want, n
            assert [[type(v) for v in row] for row in got] == [[type(v) for v in row] for row in want], n
        # a large answer of every type TPC-H uses, and HUGEINT (exported losslessly, back as int)
        sql = ("SELECT i, i::HUGEINT * 170141183460469231731687303715 AS h, (i % 7)::UHUGEINT AS u, "
               "CASE WHEN i % 5 = 0 THEN NULL ELSE i::HUGEINT END AS n, (i / 8)::DECIMAL(15,2) AS d, "
               "DATE '1995-01-01' + i::INTEGER AS dt, 'x' || i AS s, i / 3 AS f FROM range(3 * 1000 + 7) t(i)")
        r = eng.run_query(sql)
        want = con.execute(sql).fetchall()
        assert isinstance(r.rows, ArrowRows) and len(r.rows) == len(want) == 3007
        assert r.rows.table.num_rows == 3007 - SMALL  # the first SMALL rows came as tuples
        assert list(r.rows) == want and r.rows[SMALL + 5] == want[SMALL + 5]
        assert [type(v) for v in r.rows[-1]] == [type(v) for v in want[-1]]
        assert r.columns == ["i", "h", "u", "n", "d", "dt", "s", "f"]
        assert list(eng.run_query("SELECT 1 WHERE false").rows) == []
        small = eng.run_query("SELECT 2::HUGEINT, 2.5::DECIMAL(38,1)")
        assert small.rows == [(2, decimal.Decimal("2.5"))] and isinstance(small.rows, list)


def test_concurrent_clients_get_their_own_answers_and_no_thread_per_query(data_root):
    ds = Dataset.at(data_root / "sf0.01", sf=0.01)
    p = plan.plan(topology.load(None), "wim")
    with DuckDBEngine() as eng:
        eng.start(p, dataset=ds)
        pid = eng.status()[0].pid
        for _ in range(5):
            eng.run_query("SELECT 1")
        before = len(os.listdir(f"/proc/{pid}/task"))
        for i in range(40):
            assert list(eng.run_query(f"SELECT {i}").rows) == [(i,)]
        assert len(os.listdir(f"/proc/{pid}/task")) <= before + 1  # threads are reused, not one per query
        errors: list = []

        def client(k: int) -> None:
            try:
                for i in range(25):
                    rows = list(eng.run_query(f"SELECT {k} * 100 + {i}, count(*) FROM nation").rows)
                    if rows != [(k * 100 + i, 25)]:
                        errors.append((k, i, rows))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ts = [threading.Thread(target=client, args=(k,)) for k in range(5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors
        with pytest.raises(Exception, match="rejected the query"):
            eng.run_query("SELECT * FROM no_such_table")
        assert list(eng.run_query("SELECT 42").rows) == [(42,)]  # the instance is still fine
