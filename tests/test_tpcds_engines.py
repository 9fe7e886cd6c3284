"""TPC-DS through `tilewise bench tpcds` on the JVM engines (marked spark / trino, like their TPC-H
end-to-end tests) and PostgreSQL (slow): a handful of statements at SF 0.01 that exercise what differs per engine: the
engine's NULL order (ROLLUP answers), its dialect rewrites (integer division, quoted aliases), AVG
behind SELECT * (the division slack), every answer validated. The whole 103-statement table per
engine is in docs/tpcds.md ("Engines")."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from tilewise.benchmarks.tpcds import data as tpcds_data


# q7 plain; q16 a double-quoted alias (Spark: backquotes); q21 integer division (Spark: div); q36 a
# ROLLUP ordered with NULLs; q47 AVG behind SELECT *; q59 a tie group cut by the LIMIT
SPARK_QUERIES, SPARK_REWRITTEN = "7,16,21,36,47,59", {"q16", "q21"}
# q21 integer division as written (Trino truncates, as the standard); q16 a date compared with a
# string (Trino: cast); q36 a rank by a quotient (Trino: decimal(38,10) first); q72 date + 5 (interval)
TRINO_QUERIES, TRINO_REWRITTEN = "7,16,21,36,72", {"q16", "q36", "q72"}
# q21 integer division as written (PostgreSQL truncates, as the standard); q2 and q49 derived tables
# without an alias (PostgreSQL 15: an alias); q36 a ROLLUP ordered by an expression of an output
# alias (PostgreSQL: the expression); q1 a correlated average (PostgreSQL: a grouped join); q59 a tie
# group cut by the LIMIT
POSTGRES_QUERIES, POSTGRES_REWRITTEN = "1,2,7,21,36,49,59", {"q1", "q2", "q36", "q49"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tpcds_data.dataset(tpcds_data.MIN_SF, tmp_path_factory.mktemp("tpcds-data"))


def _bench(engine: str, queries: str, data, tmp_path, *extra: str, timeout: float = 590) -> dict:
    cp = run_cli("bench", "tpcds", "--engine", engine, "--sf", str(tpcds_data.MIN_SF), "--policies", "wim",
                 "--runs", "1", "--tests", "power", "--no-warmup", "--no-plots", "--params", "qualification",
                 "--queries", queries, "--data-dir", str(data.dir.parent), "--out", str(tmp_path / "res"), "--json",
                 *extra, timeout=timeout, env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout)


@pytest.mark.spark
@pytest.mark.slow  # 38 s; Spark's path is covered by the TPC-H end-to-end test, TPC-DS by DuckDB's
def test_bench_tpcds_spark_validated(data, tmp_path):
    doc = _bench("spark", SPARK_QUERIES, data, tmp_path)
    qs = doc["policies"]["wim"]["queries"]
    assert doc["validation"]["null_order"] == "nulls_min"  # Spark: NULLs first ascending, last descending
    assert all(q["valid"] is True for q in qs.values()), {k: q.get("error") for k, q in qs.items()}
    assert {k for k, q in qs.items() if q.get("rewritten")} == SPARK_REWRITTEN


@pytest.mark.trino
@pytest.mark.slow  # 57 s; Trino's bench path and its typing are covered by its TPC-H end-to-end test
@pytest.mark.usefixtures("trino_ready")
def test_bench_tpcds_trino_validated(data, tmp_path):
    doc = _bench("trino", TRINO_QUERIES, data, tmp_path, "--worker-memory", "1g")
    qs = doc["policies"]["wim"]["queries"]
    assert doc["validation"]["null_order"] == "nulls_last"
    assert all(q["valid"] is True for q in qs.values()), {k: q.get("error") for k, q in qs.items()}
    assert {k for k, q in qs.items() if q.get("rewritten")} == TRINO_REWRITTEN


@pytest.mark.slow
def test_bench_tpcds_postgres_validated(data, tmp_path):
    from tilewise import engines

    why = engines.get("postgres").missing()
    if why:
        pytest.skip(f"postgres: {why}")
    doc = _bench("postgres", POSTGRES_QUERIES, data, tmp_path, "--query-timeout", "300", timeout=900)
    qs = doc["policies"]["wim"]["queries"]
    assert doc["validation"]["null_order"] == "nulls_max"  # PostgreSQL: NULLs last ascending, first descending
    assert all(q["valid"] is True for q in qs.values()), {k: q.get("error") for k, q in qs.items()}
    assert {k for k, q in qs.items() if q.get("rewritten")} == POSTGRES_REWRITTEN
