"""Answer comparison: tolerance, order, and wrong answers caught."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from tilewise.bench import validate
from tilewise.data import Dataset
from tilewise.data import tpch as tpch_data


def n(rows):
    return validate.norm_rows(rows)


def test_numeric_tolerance_is_relative_1e6():
    assert validate.compare(n([(1.0000001,)]), n([(1.0,)]), True).ok
    assert not validate.compare(n([(1.00001,)]), n([(1.0,)]), True).ok
    assert validate.compare(n([(Decimal("10.50"),)]), n([(10.5,)]), True).ok
    assert not validate.compare(n([(Decimal("10.51"),)]), n([(Decimal("10.50"),)]), True).ok  # same scale: no slack
    # one side printed with fewer decimals (DataFusion AVG): within its last digit
    assert validate.compare(n([(0.0500813390,)]), n([(Decimal("0.050081"),)]), True).ok
    assert not validate.compare(n([(0.0500913390,)]), n([(Decimal("0.050081"),)]), True).ok
    # AVG rounded (Spark) vs truncated (DataFusion) at 6 decimals: one unit apart, both right
    assert validate.compare(n([(Decimal("0.047759"),)]), n([(Decimal("0.047758"),)]), True).ok
    assert not validate.compare(n([(Decimal("0.047761"),)]), n([(Decimal("0.047758"),)]), True).ok


def test_types_nulls_and_row_counts():
    assert validate.compare(n([("a", dt.date(1995, 3, 15), None)]), n([("a", dt.date(1995, 3, 15), None)]), True).ok
    assert not validate.compare(n([(None,)]), n([(0,)]), True).ok
    assert not validate.compare(n([("a",)]), n([("b",)]), True).ok
    c = validate.compare(n([(1,), (2,)]), n([(1,)]), True)
    assert not c.ok and "2 rows, expected 1" in c.detail


def test_order_matters_only_with_order_by():
    a, b = n([(1, "x"), (2, "y")]), n([(2, "y"), (1, "x")])
    assert validate.compare(a, b, ordered=False).ok
    assert not validate.compare(a, b, ordered=True).ok


def test_reference_answers_cached_next_to_the_data(tmp_path):
    d = tpch_data.ensure_data(0.01, tmp_path)
    ref = validate.Reference(Dataset.at(d, sf=0.01))
    rows6 = ref.answer(6)
    assert (ref.cache_dir / "q06.json").exists()
    again = validate.Reference(Dataset.at(d, sf=0.01))
    again._compute = None  # a cache hit must not recompute
    assert again.answer(6) == rows6
    import duckdb

    con = duckdb.connect()
    for t, p in tpch_data.table_paths(d).items():
        con.execute(f"create view {t} as select * from read_parquet('{p}')")
    from tilewise.bench import queries

    good = con.execute(queries.load(6)).fetchall()
    assert ref.check(6, good).ok
    wrong = [(good[0][0] * Decimal("1.001"),)]
    chk = ref.check(6, wrong)
    assert not chk.ok and "row 1, column 1" in chk.detail
