"""TPC-H data cache and the 22 queries."""

from __future__ import annotations

import json

import pytest

from tilewise.benchmarks import sqlshape
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.benchmarks.tpch import queries
from tilewise.errors import UsageError


def test_ensure_data_generates_caches_and_repairs(tmp_path):
    d = tpch_data.ensure_data(0.01, tmp_path)
    assert d == tmp_path / "sf0.01"
    assert sorted(p.name for p in d.glob("*.parquet")) == sorted(f"{t}.parquet" for t in tpch_data.TABLES)
    man = json.loads((d / "manifest.json").read_text())
    assert man["tables"]["region"]["rows"] == 5 and man["tables"]["nation"]["rows"] == 25
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sf0.01.tmp")]  # no half set left
    mtime = (d / "lineitem.parquet").stat().st_mtime_ns
    assert tpch_data.ensure_data(0.01, tmp_path) == d  # cached: not regenerated
    assert (d / "lineitem.parquet").stat().st_mtime_ns == mtime
    # corrupt a table: detected and regenerated
    with open(d / "orders.parquet", "r+b") as f:
        f.truncate(100)
    assert not tpch_data.is_valid(d)
    tpch_data.ensure_data(0.01, tmp_path)
    assert tpch_data.is_valid(d)
    assert (d / "orders.parquet").stat().st_size == man["tables"]["orders"]["bytes"]


def test_default_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tpch_data.sf_dir(1) == tmp_path / "tilewise" / "tpch" / "sf1"
    assert tpch_data.sf_dir(0.1).name == "sf0.1"


@pytest.mark.parametrize("bad", [0, -1, "abc", float("nan")])
def test_bad_scale_factor(bad):
    with pytest.raises(UsageError):
        tpch_data.sf_dir(bad)


def test_queries_all_22_with_validation_parameters():
    qs = queries.all()
    assert sorted(qs) == list(range(1, 23))
    assert "date '1998-09-02'" in qs[1]          # DELTA = 90
    assert "p_size = 15" in qs[2] and "'EUROPE'" in qs[2]
    assert "'BUILDING'" in qs[3]
    assert "with revenue0 as" in qs[15].lower() and "create view" not in qs[15].lower()
    assert "'SAUDI ARABIA'" in qs[21]
    assert not any(q.rstrip().endswith(";") for q in qs.values())
    with pytest.raises(UsageError):
        queries.load(23)


def test_order_by_detection_ignores_subqueries():
    assert sqlshape.has_order_by(queries.load(1))
    assert not sqlshape.has_order_by(queries.load(6))
    assert not sqlshape.has_order_by(queries.load(17))
    assert not sqlshape.has_order_by("select * from (select a from t order by a) x")


def test_query_selection():
    assert queries.parse_selection("1,6,10-12") == [1, 6, 10, 11, 12]
    assert queries.parse_selection(None) == list(range(1, 23))
    for bad in ("0", "x", "3-25"):
        with pytest.raises(UsageError):
            queries.parse_selection(bad)
