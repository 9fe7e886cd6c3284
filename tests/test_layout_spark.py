"""Spark on a layout (slow: a Spark cluster of two tiles takes a minute to start on 2 cores): the
tables read in place from K Parquet files, every answer checked, and per tile the files and row
groups its tasks get (predicted by Spark's split rule) beside what its executor read per query."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_on_a_layout_shows_how_the_scan_splits_over_the_tiles(tmp_path):
    cp = run_cli("bench", "tpch", "--engine", "spark", "--sf", "0.01", "--data-dir", str(tmp_path / "data"),
                 "--queries", "1,6", "--policies", "n=2", "--runs", "1", "--tests", "power", "--no-plots",
                 "--layout", "parquet-4", "--out", str(tmp_path / "out"), "--json", timeout=900)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    pol = doc["policies"]["n=2"]
    assert all(q["valid"] is True for q in pol["queries"].values())
    tiles = pol["tiles"]
    pred = tiles["predicted"]["lineitem"]
    assert [t["tile"] for t in pred] == [0, 1] and sum(t["files"] for t in pred) == 4
    assert sum(t["rows"] for t in pred) == 60175  # every row group read by exactly one tile
    for q in ("q1", "q6"):
        measured = tiles["queries"][q]
        assert [t["tile"] for t in measured] == [0, 1]
        assert all(t["tasks"] >= 1 and t["input_bytes"] > 0 for t in measured)  # both tiles scanned
    cp = run_cli("report", str(tmp_path / "out"), env={"COLUMNS": "200"})
    assert "lineitem per tile, predicted by the engine's split rule" in cp.stdout
