"""JCC-H on Spark through the real CLI: the JCC-H renderings that differ from TPC-H's texts (Q3's
invalid skewed date run as 1993-06-01, Q7/Q10 date parameters, Q13's patterns, Q18's extra filter,
Q22's codes) are valid Spark SQL and give the reference's answers."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from tilewise.benchmarks.jcch import data as jcch

# with the slow tests (`make test-all`): Spark's engine path is the TPC-H end-to-end test's
# (test_spark_tpch_e2e.py, in the default suite); this one adds JCC-H's data and parameters (31 s)
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_jcch_on_spark_validated(tmp_path):
    data = tmp_path / "data"
    jcch.ensure_data(0.01, data)
    out = tmp_path / "res"
    cp = run_cli("bench", "jcch", "--engine", "spark", "--params", "skewed", "--seed", "3",
                 "--sf", "0.01", "--policies", "wim", "--tests", "power", "--runs", "1", "--no-warmup", "--no-plots",
                 "--queries", "3,7,10,13,18,22", "--out", str(out), "--data-dir", str(data), "--json", timeout=600,
                 env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["params"]["benchmark"] == "jcch" and doc["params"]["engine"] == "spark"
    q3 = doc["query_parameters"]["streams"]["0"]["q3"]
    assert q3["date"] == "1993-05-32" and q3["date_used"] == "1993-06-01"
    pol = doc["policies"]["wim"]
    assert pol["complete"] is True
    for name, q in pol["queries"].items():
        assert q["valid"] is True, (name, q)
