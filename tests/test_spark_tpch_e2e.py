"""End to end through the real harness: `tilewise bench tpch --engine spark` at SF 0.01, all 22
queries, every answer validated against the independent reference engine."""

from __future__ import annotations

import json

import psutil
import pytest

from conftest import run_cli
from tilewise.benchmarks.tpch import data as tpch_data

pytestmark = pytest.mark.spark


def test_bench_tpch_spark_all_22_validated(tmp_path):
    data = tmp_path / "data"
    tpch_data.ensure_data(0.01, data)
    out = tmp_path / "res"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cp = run_cli("bench", "tpch", "--engine", "spark", "--sf", "0.01", "--policies", "wim", "--runs", "1",
                 "--tests", "power", "--no-warmup", "--no-plots", "--out", str(out), "--data-dir", str(data), "--json", timeout=600,
                 env={"TILEWISE_TEST_TAG": str(tmp_path)}, cwd=cwd)
    assert cp.returncode == 0, cp.stderr[-3000:]
    # nothing in the user's current directory (Spark's default warehouse would be ./spark-warehouse)
    assert list(cwd.iterdir()) == []
    doc = json.loads(cp.stdout)
    assert doc["params"]["engine"] == "spark" and doc["params"]["tests"] == ["power"]
    # Spark cannot write its tables: no refresh functions, and the results say so
    assert doc["refresh"]["applied"] is False and any("without refresh functions" in n for n in doc["notes"])
    assert doc["policies"]["wim"]["runs"][0]["power_at_size"] > 0
    pol = doc["policies"]["wim"]
    assert pol["complete"] is True
    assert sorted(pol["queries"]) == sorted(f"q{n}" for n in range(1, 23))
    for name, q in pol["queries"].items():
        assert q["valid"] is True, (name, q)
        assert len(q["times_s"]) == 1 and q["times_s"][0] > 0
    inst = pol["instances"][0]
    assert inst["binding_verified"] is True and inst["healthy"] is True
    # nothing the run started is left (every child inherited TILEWISE_TEST_TAG)
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TILEWISE_TEST_TAG") == str(tmp_path) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.Error:
            continue
    assert not left, [p.cmdline()[:3] for p in left]
