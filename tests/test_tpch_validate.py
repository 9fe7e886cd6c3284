"""Answer comparison: exact integers and money sums, float and division slack, typing differences
between engines (DuckDB, Spark, Trino), tied ORDER BY keys, and wrong answers caught."""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tilewise.benchmarks import sqlshape, validate
from tilewise.benchmarks.validate import Column
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.benchmarks.tpch import queries
from tilewise.data import Dataset

D = Decimal


def n(rows):
    return validate.norm_rows(rows)


def one(got, want, division=False) -> bool:
    """One cell compared as in a one-column answer."""
    return validate.compare(n([(got,)]), n([(want,)]), [Column("c", division=division)]).ok


# The specification's SF1 answer to Q1 (TPC-H 2.18, appendix C), typed as DataFusion types it.
Q1_SF1_COLUMNS = [Column("l_returnflag", "string_view", "str"), Column("l_linestatus", "string_view", "str"),
                  Column("sum_qty", "decimal128(25, 2)", "dec"), Column("sum_base_price", "decimal128(25, 2)", "dec"),
                  Column("sum_disc_price", "decimal128(38, 4)", "dec"), Column("sum_charge", "decimal128(38, 6)", "dec"),
                  Column("avg_qty", "decimal128(19, 6)", "dec"), Column("avg_price", "decimal128(19, 6)", "dec"),
                  Column("avg_disc", "decimal128(19, 6)", "dec"), Column("count_order", "int64", "int")]
Q1_SF1 = [
    ("A", "F", D("37734107.00"), D("56586554400.73"), D("53758257134.8700"), D("55909065222.827692"),
     D("25.522005"), D("38273.129734"), D("0.049985"), 1478493),
    ("N", "F", D("991417.00"), D("1487504710.38"), D("1413082168.0541"), D("1469649223.194375"),
     D("25.516471"), D("38284.467760"), D("0.050093"), 38854),
    ("N", "O", D("74476040.00"), D("111701729697.74"), D("106118230307.6056"), D("110367043872.497010"),
     D("25.502226"), D("38249.117988"), D("0.049996"), 2920374),
    ("R", "F", D("37719753.00"), D("56568041380.90"), D("53741292684.6040"), D("55889619119.831932"),
     D("25.505793"), D("38250.854626"), D("0.050009"), 1478870),
]


def check_q1(rows):
    cols, keys = validate.columns_for(queries.load(1), Q1_SF1_COLUMNS)
    return validate.compare(n(rows), n(Q1_SF1), cols, keys)


def with_cell(rows, i, j, value):
    rows = [list(r) for r in rows]
    rows[i][j] = value
    return [tuple(r) for r in rows]


# ---- exact values -------------------------------------------------------------------------------

def test_q1_sf1_count_off_by_one_and_large_sums_off_by_one_fail():
    assert check_q1(Q1_SF1).ok
    c = check_q1(with_cell(Q1_SF1, 0, 9, 1478494))  # count_order off by one
    assert not c.ok and "column 10 (count_order): got 1478494, expected 1478493" in c.detail
    assert not check_q1(with_cell(Q1_SF1, 0, 3, D("56586554401.73"))).ok  # 5.6e10 sum off by 1
    assert not check_q1(with_cell(Q1_SF1, 0, 3, D("56586554400.74"))).ok  # ... and by one cent
    assert not check_q1(with_cell(Q1_SF1, 0, 3, 56586554450.73)).ok  # the old 1e-6 let 50 pass
    assert not check_q1(with_cell(Q1_SF1, 2, 4, D("106118230307.6057"))).ok  # scale-4 sum, last digit
    assert not check_q1(with_cell(Q1_SF1, 0, 6, D("25.522007"))).ok  # an AVG two units off


def test_integers_strings_dates_and_nulls_compare_exactly():
    assert one(5, 5) and one(D("5.00"), 5)
    assert not one(6, 5) and not one(5.000001, 5) and not one(D("5.01"), 5)
    assert not one(5_600_000_000_001, 5_600_000_000_000)
    assert one("a", "a") and not one("a", "b") and not one("1", 1)
    assert one(dt.date(1995, 3, 15), dt.date(1995, 3, 15)) and not one(dt.date(1995, 3, 16), dt.date(1995, 3, 15))
    assert one(None, None) and not one(None, 0) and not one(0, None)
    assert one(True, True) and not one(True, 1)
    c = validate.compare(n([(1,), (2,)]), n([(1,)]))
    assert not c.ok and "2 rows, expected 1" in c.detail


def test_floats_get_a_relative_1e9_and_nothing_else_does():
    x = 16.283855689005982
    assert one(x * (1 + 5e-10), x) and not one(x * (1 + 2e-9), x)
    assert one(float("nan"), float("nan")) and not one(float("nan"), 1.0) and not one(float("inf"), 1e308)
    # a decimal money sum is not a float: 1e-9 of it would be 0.06
    assert not one(D("56586554400.74"), D("56586554400.73"))


def test_division_results_get_one_unit_of_the_coarser_last_digit():
    # DataFusion truncates AVG at 6 decimals, Spark rounds: one unit apart, both right
    assert one(D("0.047759"), D("0.047758"), division=True)
    assert not one(D("0.047760"), D("0.047758"), division=True)
    assert not one(D("0.047759"), D("0.047758"))  # the same pair is wrong when not a division
    # DuckDB returns AVG as DOUBLE
    assert one(25.522005751, D("25.522005"), division=True)
    assert not one(25.522007751, D("25.522005"), division=True)


def test_trino_style_rounded_decimals_pass_and_wrong_ones_fail():
    """Trino keeps avg(decimal(15,2)) at scale 2 and decimal division as a decimal: every such cell
    equals the reference rounded to Trino's scale (issue 12)."""
    trino = [tuple(v.quantize(D("0.01"), ROUND_HALF_UP) if j in (6, 7, 8) else v for j, v in enumerate(r))
             for r in Q1_SF1]
    assert trino[0][6] == D("25.52") and trino[0][8] == D("0.05")
    assert check_q1(trino).ok
    assert not check_q1(with_cell(trino, 0, 6, D("25.54"))).ok  # rounded the wrong way by more than a unit
    assert not check_q1(with_cell(trino, 0, 7, D("38273.11"))).ok
    # Q17's avg_yearly is a DOUBLE in the reference, DECIMAL(.., 2) in Trino
    assert one(D("23512.75"), 23512.752857142856, division=True)
    assert not one(D("23512.77"), 23512.752857142856, division=True)
    # Q8's mkt_share: DataFusion decimal(38, 8), Trino fewer decimals
    assert one(D("0.0286"), D("0.02864874"), division=True) and not one(D("0.0288"), D("0.02864874"), division=True)


def test_other_scales_compare_at_the_coarser_scale_without_slack():
    # a sum typed with fewer decimals (or as a double) must equal the reference rounded to it
    assert one(D("53758257134.87"), D("53758257134.8700"))
    assert not one(D("53758257134.88"), D("53758257134.8700"))
    assert one(56586554400.73, D("56586554400.73"))  # a DOUBLE money sum at the reference's scale
    assert not one(56586554400.74, D("56586554400.73")) and not one(56586554401.73, D("56586554400.73"))


# ---- order --------------------------------------------------------------------------------------

def test_rows_tied_on_order_by_keys_compare_as_a_multiset():
    cols = [Column("k"), Column("name"), Column("v")]
    want = n([(1, "a", D("1.00")), (2, "b", D("2.00")), (2, "c", D("3.00")), (3, "d", D("4.00"))])
    tie_swapped = n([(1, "a", D("1.00")), (2, "c", D("3.00")), (2, "b", D("2.00")), (3, "d", D("4.00"))])
    assert validate.compare(tie_swapped, want, cols, (0,)).ok
    assert not validate.compare(tie_swapped, want, cols, (0, 1)).ok  # with the tie broken by name: wrong
    reordered = n([(2, "b", D("2.00")), (1, "a", D("1.00")), (2, "c", D("3.00")), (3, "d", D("4.00"))])
    c = validate.compare(reordered, want, cols, (0,))
    assert not c.ok and c.detail.startswith("row 1, column 1 (k): got 2, expected 1")
    wrong_in_tie = n([(1, "a", D("1.00")), (2, "c", D("3.00")), (2, "b", D("2.01")), (3, "d", D("4.00"))])
    c = validate.compare(wrong_in_tie, want, cols, (0,))
    assert not c.ok and "rows 2-3 tie on the ORDER BY keys" in c.detail
    assert validate.compare(reordered, want, cols, None).ok  # no ORDER BY: any order
    assert validate.compare(reordered, want, cols, ()).ok  # ordered only by what the answer lacks
    dup = n([(1, "a", D("1.00")), (2, "b", D("2.00")), (2, "b", D("2.00")), (3, "d", D("4.00"))])
    assert not validate.compare(dup, want, cols, (0,)).ok


def test_order_keys_map_to_output_columns_by_name_alias_position_and_expression():
    def keys(sql, names):
        return sqlshape.order_columns(sqlshape.analyse(sql), names)

    assert keys("select a, sum(b) as s from t group by a order by s desc, a", ["a", "s"]) == (1, 0)
    assert keys("select a, b from t order by 2, 1", ["a", "b"]) == (1, 0)
    assert keys("select a, b + 1 from t order by b + 1", ["a", "t.b + Int64(1)"]) == (1,)
    assert keys("select a, b from t order by c, a", ["a", "b"]) == ()  # hidden first key: all tied
    assert keys("select a, b from t order by a, c, b", ["a", "b"]) == (0,)
    assert keys("select a from t", ["a"]) is None
    assert keys("select a from (select a from t order by a) x", ["a"]) is None
    assert keys("with v as (select a from t) select a from v order by a", ["a"]) == (0,)
    assert keys("select a, b from t union all select c, d from u order by 2", ["a", "b"]) == (1,)
    # every TPC-H query with ORDER BY has all its keys among its outputs
    for q in queries.NUMBERS:
        sql = queries.load(q)
        shape = sqlshape.analyse(sql)
        if shape.order_by is not None:
            assert len(sqlshape.order_columns(shape, [o.name for o in shape.outputs])) == len(shape.order_by), q


def test_division_columns_come_from_the_query_text():
    def divs(q):
        return [o.name for o in sqlshape.analyse(queries.load(q)).outputs if o.division]

    assert divs(1) == ["avg_qty", "avg_price", "avg_disc"]
    assert divs(8) == ["mkt_share"] and divs(14) == ["promo_revenue"] and divs(17) == ["avg_yearly"]
    assert all(not divs(q) for q in queries.NUMBERS if q not in (1, 8, 14, 17))
    s = sqlshape.analyse("select k, r from (select k, sum(x) / count(*) as r from t group by k) order by k")
    assert [o.division for o in s.outputs] == [False, True]  # a named division in a derived table
    assert sqlshape.analyse("select * from t order by a").outputs is None  # unknown: no slack anywhere


# ---- the reference, on real data ----------------------------------------------------------------

def _duckdb_answer(d: Path, q: int):
    import duckdb

    con = duckdb.connect()
    for t, p in tpch_data.table_paths(d, tpch_data.TABLES).items():
        con.execute(f"create view {t} as select * from read_parquet('{p}')")
    return con.execute(queries.load(q)).fetchall()


def test_reference_answers_cached_with_names_and_types(tmp_path):
    d = tpch_data.ensure_data(0.01, tmp_path)
    ref = validate.Reference(Dataset.at(d, benchmark="tpch", sf=0.01))
    ans = ref.answer(6)
    doc = json.loads((ref.cache_dir / "q06.json").read_text())
    assert doc["format"] == validate.REF_FORMAT
    assert doc["columns"] == [{"name": "revenue", "type": "decimal128(38, 4)", "kind": "dec"}]
    again = validate.Reference(Dataset.at(d, benchmark="tpch", sf=0.01))
    again._compute = None  # a cache hit must not recompute
    assert again.answer(6) == ans
    good = _duckdb_answer(d, 6)
    assert ref.check(6, good).ok
    chk = ref.check(6, [(good[0][0] + D("0.0001"),)])  # one unit of the last digit
    assert not chk.ok and "row 1, column 1 (revenue)" in chk.detail
    q1 = ref.answer(1)
    assert [c.name for c in q1.columns][-1] == "count_order" and q1.columns[-1].kind == "int"
    # a stale cache (an older format without types) is recomputed, not trusted
    (ref.cache_dir / "q04.json").write_text(json.dumps({"format": "tilewise-tpch-reference/2", "sql": queries.load(4),
                                                       "rows": []}))
    assert len(validate.Reference(Dataset.at(d, benchmark="tpch", sf=0.01)).answer(4).rows) == 5


SF1 = tpch_data.default_root() / "sf1"


@pytest.mark.skipif(not (os.environ.get("TILEWISE_SLOW") == "1" or tpch_data.is_valid(SF1)),
                    reason="needs the SF1 data set cached (or TILEWISE_SLOW=1 to generate it)")
def test_real_q1_at_sf1_off_by_one_fails():
    d = tpch_data.ensure_data(1.0)
    ref = validate.Reference(Dataset.at(d, benchmark="tpch", sf=1.0))
    good = _duckdb_answer(d, 1)
    assert ref.check(1, good).ok
    assert good[0][9] == 1478493 and good[0][3] == D("56586554400.73")  # the specification's answer
    assert not ref.check(1, with_cell(good, 0, 9, good[0][9] + 1)).ok
    assert not ref.check(1, with_cell(good, 0, 3, good[0][3] + 1)).ok
    assert not ref.check(1, with_cell(good, 0, 3, good[0][3] + D("0.01"))).ok
    assert ref.check(1, list(reversed(good))).ok is False  # a real reordering


def test_a_decimal_cast_to_an_integer_may_round_or_truncate_and_nothing_else(tpch_sf001, tmp_path):
    """TPC-DS q54's segment, on TPC-H data: DuckDB rounds a decimal cast to an integer, DataFusion (the
    reference) truncates; the standard allows both. Either answer is right, the rule is named, and an
    answer that does neither (ceiling) is wrong."""
    import duckdb
    import shutil

    d = tmp_path / "d"
    shutil.copytree(tpch_sf001 / "sf0.01", d)  # its own reference cache
    ref = validate.Reference(Dataset.at(d, benchmark="tpch", sf=0.01))
    sql = ("select cast(l_extendedprice / 50 as int) * 50 as segment_base, count(*) as n from lineitem "
           "where l_orderkey < 200 group by 1 order by 1, 2")
    assert sqlshape.rounding_casts(sql).startswith("select cast(round(l_extendedprice / 50) as int)")
    con = duckdb.connect()
    con.execute(f"create view lineitem as select * from read_parquet('{d / 'lineitem.parquet'}')")
    rounded = con.execute(sql).fetchall()  # DuckDB rounds
    truncated = con.execute(sql.replace("cast(l_extendedprice / 50 as int)", "trunc(l_extendedprice / 50)::int")).fetchall()
    ceiling = con.execute(sql.replace("cast(l_extendedprice / 50 as int)", "ceil(l_extendedprice / 50)::int")).fetchall()
    assert rounded != truncated and ceiling not in (rounded, truncated)
    plain = ref.check_sql(sql, "cast_probe", truncated)
    assert plain.ok and plain.detail == ""  # the reference's own rule: no second look
    other = ref.check_sql(sql, "cast_probe", rounded)
    assert other.ok and "round or truncate" in other.detail
    assert (ref.cache_dir / "cast_probe.rounding.json").is_file()
    wrong = ref.check_sql(sql, "cast_probe", ceiling)
    assert not wrong.ok and "expected" in wrong.detail
    # a statement without such a cast gets no second reference
    assert ref.answer_sql("select count(*) as n from lineitem", "no_cast", rounding=True) is None
