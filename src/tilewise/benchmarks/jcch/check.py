"""Acceptance checks of a JCC-H data set: the hard invariants and statistical targets of the spec
(/work/shared/jcch.md section 5), computed with DuckDB over the Parquet tables.

Invariants must hold exactly; expected values at other scale factors come from the rules
(tilewise.benchmarks.jcch.rules.Sizes), e.g. lineitem = 5 * 300000*SF + 3 * (orders - 5) + 15.
Targets are the reference generator's SF 1 measurements; shares are SF-independent, counts scale
with SF. A share passes within 1 % relative of its reference, or within 4 binomial standard
deviations of the sample it was measured on when that is wider (small SF, per-year subsets).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from tilewise.benchmarks.jcch import refresh
from tilewise.benchmarks.jcch import rules as J
from tilewise.benchmarks.spec import DataCheck
from tilewise.benchmarks.tpch import refresh as tpch_refresh
from tilewise.benchmarks.tpch.data import TABLES
from tilewise.data import Dataset, table_paths

REL_TOL = 0.01
SIGMAS = 4.0
SIXTH_PAIR_MAX = 65  # the 6th (part, supp) pair: ~55 lines at SF 1, grows slowly with SF (max of Poisson(35))


def share_ok(value: float, ref: float, n: int) -> tuple[bool, str]:
    tol = max(REL_TOL * ref, SIGMAS * math.sqrt(max(ref * (1 - ref), 0.0) / max(n, 1)))
    return abs(value - ref) <= tol, f"{ref:.4f} ± {tol:.4f}"


class _Checks:
    def __init__(self, d: Path, sf: float) -> None:
        import duckdb

        self.con = duckdb.connect()
        for t, p in table_paths(d, TABLES).items():
            self.con.execute(f"create view {t} as select * from read_parquet('{p}')")
        self.s = J.Sizes.for_sf(sf)
        self.hs = J.Hashes.of(self.s)
        self.out: list[DataCheck] = []

    def q(self, sql: str):
        return self.con.execute(sql).fetchall()

    def one(self, sql: str):
        return self.q(sql)[0][0]

    def inv(self, id_: str, what: str, value, expected, ok: bool | None = None) -> None:
        ok = (value == expected) if ok is None else ok
        self.out.append(DataCheck(id_, "invariant", what, value, str(expected), bool(ok)))

    def share(self, id_: str, what: str, num: float, den: int, ref: float) -> None:
        v = num / den if den else float("nan")
        ok, exp = share_ok(v, ref, den)
        self.out.append(DataCheck(id_, "target", what, round(v, 5), exp, ok))

    def target(self, id_: str, what: str, value, expected: str, ok: bool) -> None:
        self.out.append(DataCheck(id_, "target", what, value, expected, bool(ok)))


def run(d: str | Path, sf: float) -> list[DataCheck]:
    """Every check of section 5 on the JCC-H set in d (scale factor sf)."""
    c = _Checks(Path(d), sf)
    s, hs = c.s, c.hs
    mega_idx = J.mega_order_indexes(s, hs)
    mega_keys = [int(k) for k in J.order_key(mega_idx)]
    pop_custs = J.populous_customers(s, hs)
    mk = ", ".join(map(str, mega_keys))
    nlines = s.lineitem_rows(mega_idx)

    # ---- 1. row counts and lines per order
    counts = {t: c.one(f"select count(*) from {t}") for t in ("customer", "supplier", "part", "orders", "partsupp", "lineitem")}
    for t, want in (("customer", s.customers), ("supplier", s.suppliers), ("part", s.parts), ("orders", s.orders),
                    ("partsupp", s.partsupp_rows), ("lineitem", nlines)):
        c.inv(f"I1.rows.{t}", f"{t} rows", counts[t], want)
    per_order = dict(c.q("select n, count(*) from (select count(*) n from lineitem group by l_orderkey) group by n"))
    four = 15 - sum(1 for i in mega_idx if i <= 15)
    want = {s.mega_lines: 5, 4: four, 3: s.orders - 5 - four}
    c.inv("I1.lines_per_order", "orders by lines per order {lines: orders}",
          {int(k): int(v) for k, v in sorted(per_order.items())}, {k: v for k, v in sorted(want.items()) if v})

    # ---- 2. keys
    c.inv("I2.fk_lineitem_partsupp", "(l_partkey, l_suppkey) pairs missing from partsupp",
          c.one("select count(*) from (select distinct l_partkey, l_suppkey from lineitem) l "
                "anti join partsupp on l_partkey = ps_partkey and l_suppkey = ps_suppkey"), 0)
    c.inv("I2.partsupp_unique", "duplicate (ps_partkey, ps_suppkey)",
          c.one("select count(*) - count(distinct (ps_partkey, ps_suppkey)) from partsupp"), 0)

    _refresh_keys(c, Path(d), sf)

    # ---- 3. partsupp rows per part
    per_part = dict(c.q("select n, count(*) from (select count(*) n from partsupp group by ps_partkey) group by n"))
    want = {s.suppliers: 20, 4: s.extra_partsupps, 3: s.parts - 20 - s.extra_partsupps}
    c.inv("I3.partsupp_per_part", "parts by partsupp rows {rows: parts}",
          {int(k): int(v) for k, v in sorted(per_part.items())}, dict(sorted(want.items())))

    # ---- 4. nation counts
    for t, n, col in (("customer", s.customers, "c_nationkey"), ("supplier", s.suppliers, "s_nationkey")):
        got = dict(c.q(f"select {col}, count(*) from {t} group by 1"))
        large = [got.get(k, 0) for k in J.LARGE_NATIONS]
        small = [got.get(k, 0) for k in J.SMALL_NATIONS]
        # a region block's first 0.18n hashes, both ends included, are its large nation: 0.18n + 1 (+1)
        lo_l, hi_l = int(0.18 * n), int(0.18 * n) + 2
        lo_s, hi_s = int(0.005 * n) - 1, int(0.005 * n) + 1
        c.inv(f"I4.nations.{t}.large", f"{t} per large nation (min..max)", f"{min(large)}..{max(large)}",
              f"{lo_l}..{hi_l}", min(large) >= lo_l and max(large) <= hi_l)
        c.inv(f"I4.nations.{t}.small", f"{t} per small nation (min..max)", f"{min(small)}..{max(small)}",
              f"{lo_s}..{hi_s}", min(small) >= lo_s and max(small) <= hi_s)

    # ---- 5. populous customers
    rows = c.q("select c_custkey, substr(c_phone, 1, 2), c_nationkey, n_regionkey from customer join nation "
               "on c_nationkey = n_nationkey where substr(c_phone, 1, 2) in ('40', '50', '60', '70', '80') order by 2")
    shape_ok = (len(rows) == 5 and [r[1] for r in rows] == ["40", "50", "60", "70", "80"]
                and all(r[2] == J.LARGE_NATIONS[i] and r[3] == i for i, r in enumerate(rows)))
    c.inv("I5.populous_customers", "customers with phone code 40..80 (one per large nation/region)",
          [int(r[0]) for r in rows], sorted(pop_custs, key=pop_custs.index), shape_ok and [r[0] for r in rows] == pop_custs)
    top5 = [int(r[0]) for r in c.q("select o_custkey from orders group by 1 order by count(*) desc limit 5")]
    c.inv("I5.top5_custkey", "top-5 o_custkey are the populous customers", sorted(top5), sorted(pop_custs))

    # ---- 6. the 20 populous parts
    pop_parts = sorted(int(k) for k in J.populous_parts(s, hs))
    for name, cond in (("brand55_lgbox", "p_brand = 'Brand#55' and p_container = 'LG BOX'"),
                       ("brand55_size1", "p_brand = 'Brand#55' and p_size = 1"),
                       ("gold_size1", f"p_type = '{J.GOLD}' and p_size = 1"),
                       ("lgbox_size1", "p_container = 'LG BOX' and p_size = 1")):
        got = [int(r[0]) for r in c.q(f"select p_partkey from part where {cond} order by 1")]
        c.inv(f"I6.parts.{name}", f"parts with {cond}", len(got), 20, got == pop_parts)
    c.inv("I6.parts.name", "populous parts named 'shiny mined gold'",
          c.one(f"select count(*) from part where p_partkey in ({', '.join(map(str, pop_parts))}) "
                f"and p_name = '{J.GOLD_NAME}'"), 20)
    qty = int(4_000_000 * s.parts / 200_000)
    c.inv("I6.parts.availqty", f"populous partsupp rows with ps_availqty = {qty}",
          c.one(f"select count(*) from partsupp where ps_partkey in ({', '.join(map(str, pop_parts))}) "
                f"and ps_availqty = {qty}"), 20 * s.suppliers)

    # ---- 7. populous orders
    rows = c.q(f"select o_orderkey, o_custkey, o_orderdate, (select count(*) from lineitem where l_orderkey = o_orderkey) "
               f"from orders where o_orderkey in ({mk}) order by o_orderdate")
    years = [r[2].year for r in rows]
    c.inv("I7.mega.lines", f"populous orders with {s.mega_lines} lines", sum(1 for r in rows if r[3] == s.mega_lines), 5)
    c.inv("I7.mega.dates", "populous order dates (one May 28 per year 1992-94, 1997-98)",
          [str(r[2]) for r in rows], [f"{y}-05-28" for y in J.POPULOUS_ORDER_YEARS],
          years == list(J.POPULOUS_ORDER_YEARS) and all((r[2].month, r[2].day) == (5, 28) for r in rows))
    c.inv("I7.mega.customers", "populous orders' customers = the populous customers",
          sorted(int(r[1]) for r in rows), sorted(pop_custs))
    c.inv("I7.mega.lines_skewed", "populous-order lines not (qty 51, REG AIR, DELIVER IN PERSON)",
          c.one(f"select count(*) from lineitem where l_orderkey in ({mk}) and not (l_quantity = 51 "
                "and l_shipmode = 'REG AIR' and l_shipinstruct = 'DELIVER IN PERSON')"), 0)

    # one pass over lineitem joined with its order, customer, supplier and part
    j = c.q(f"""
        select
          count(*) filter (where is_mega and sr = cr),
          count(*) filter (where not is_mega and sr <> cr),
          count(*) filter (where y in (1995, 1996) and l_quantity = 51),
          count(*) filter (where not (l_quantity between 1 and 50 or l_quantity = 51)),
          min(l_shipdate - o_orderdate), max(l_shipdate - o_orderdate),
          min(l_commitdate - o_orderdate), max(l_commitdate - o_orderdate),
          min(l_receiptdate - l_shipdate), max(l_receiptdate - l_shipdate),
          count(*) filter (where l_extendedprice <> l_quantity * p_retailprice),
          avg(l_shipdate - o_orderdate),
          count(*) filter (where month(o_orderdate) = 5 and day(o_orderdate) = 28),
          count(*) filter (where l_quantity = 51),
          {", ".join(f"count(*) filter (where c_nationkey = {k})" for k in J.LARGE_NATIONS)},
          {", ".join(f"count(*) filter (where s_nationkey = {k})" for k in J.LARGE_NATIONS)}
        from (
          select l.*, o_orderdate, year(o_orderdate) y, o_orderkey in ({mk}) is_mega, c_nationkey, s_nationkey,
                 cn.n_regionkey cr, sn.n_regionkey sr, p_retailprice
          from lineitem l join orders on l_orderkey = o_orderkey join customer on o_custkey = c_custkey
          join supplier on l_suppkey = s_suppkey join part on l_partkey = p_partkey
          join nation cn on c_nationkey = cn.n_nationkey join nation sn on s_nationkey = sn.n_nationkey)
    """)[0]
    (mega_same, ord_cross, y9596_q51, bad_qty, sh_lo, sh_hi, cm_lo, cm_hi, rc_lo, rc_hi, bad_price, mean_ship,
     bf_lines, q51) = j[:14]
    cust_large, supp_large = j[14:19], j[19:24]
    c.inv("I7.mega.cross_region", "populous-order lines whose supplier region = customer region", mega_same, 0)

    # ---- 8. the 1995/96 sanctuary
    c.inv("I8.sanctuary.gold_comment", "1995/96 orders with a '1mine2 3gold4' comment",
          c.one(f"select count(*) from orders where year(o_orderdate) in (1995, 1996) and o_comment like '{J.GOLD_COMMENT}%'"), 0)
    c.inv("I8.sanctuary.qty51", "1995/96 order lines with l_quantity = 51", y9596_q51, 0)
    c.inv("I8.sanctuary.populous_customer", "1995/96 orders of populous customers",
          c.one(f"select count(*) from orders where year(o_orderdate) in (1995, 1996) "
                f"and o_custkey in ({', '.join(map(str, pop_custs))})"), 0)

    # ---- 9. ordinary orders stay in their customer's region
    c.inv("I9.ordinary.same_region", "ordinary-order lines whose supplier region <> customer region", ord_cross, 0)

    # ---- 10. value domains
    c.inv("I10.quantity", "lines with l_quantity outside [1, 50] and 51", bad_qty, 0)
    c.inv("I10.shipdate", "l_shipdate - o_orderdate range", f"{sh_lo}..{sh_hi}", "1..121", sh_lo >= 1 and sh_hi <= 121)
    c.inv("I10.commitdate", "l_commitdate - o_orderdate range", f"{cm_lo}..{cm_hi}", "30..90", cm_lo >= 30 and cm_hi <= 90)
    c.inv("I10.receiptdate", "l_receiptdate - l_shipdate range", f"{rc_lo}..{rc_hi}", "1..30", rc_lo >= 1 and rc_hi <= 30)
    c.inv("I10.extendedprice", "lines with l_extendedprice <> l_quantity * p_retailprice", bad_price, 0)

    # ---- statistical targets
    L, O = counts["lineitem"], counts["orders"]

    def top(sql_group: str, k: int) -> list[int]:
        return [int(r[0]) for r in c.q(f"select count(*) n from lineitem group by {sql_group} order by n desc limit {k}")]

    c.share("S.top5_orderkey", "top-5 l_orderkey share", sum(top("l_orderkey", 5)), L, 5 * s.mega_lines / nlines)
    c.share("S.top5_custkey", "top-5 o_custkey share",
            c.one("select sum(n) from (select count(*) n from orders group by o_custkey order by n desc limit 5)"), O, 0.2431)
    parts = top("l_partkey", 20)
    c.share("S.top5_partkey", "top-5 l_partkey share", sum(parts[:5]), L, 0.1738)
    c.share("S.top20_partkey", "top-20 l_partkey share", sum(parts), L, 0.4238)
    # the populous suppliers also sell in the 4 mega orders of other regions: mega_lines / (4 * span)
    # lines each per order (0.0002 at SF 1, more at small SF where the span is short)
    c.share("S.top5_suppkey", "top-5 l_suppkey share", sum(top("l_suppkey", 5)), L,
            0.1738 + 5 * s.mega_lines / (s.mega_span * nlines))
    pairs = top("l_partkey, l_suppkey", 6)
    c.share("S.top5_pairs", "top-5 (l_partkey, l_suppkey) share", sum(pairs[:5]), L, 0.1738)
    c.target("S.sixth_pair", "lines of the 6th (l_partkey, l_suppkey) pair", pairs[5] if len(pairs) > 5 else None,
             f"<= {SIXTH_PAIR_MAX} (55 at SF 1)", len(pairs) > 5 and pairs[5] <= SIXTH_PAIR_MAX)
    c.share("S.top20_ps_partkey", "top-20 ps_partkey share",
            c.one("select sum(n) from (select count(*) n from partsupp group by ps_partkey order by n desc limit 20)"),
            counts["partsupp"], 20 * s.suppliers / s.partsupp_rows)
    bf = c.one("select count(*) from orders where month(o_orderdate) = 5 and day(o_orderdate) = 28")
    c.share("S.bf_orders", "orders on May 28 (all years)", bf, O, 0.4931)
    for y, n, ref in c.q("select year(o_orderdate), count(*), count(*) filter (where month(o_orderdate) = 5 "
                         "and day(o_orderdate) = 28) from orders group by 1 order by 1"):
        c.share(f"S.bf_orders.{y}", f"orders of {y} on May 28", ref, n, 0.425 if y == 1998 else 0.50)
    c.share("S.bf_lines", "lineitems whose order is on May 28", bf_lines, L, 0.6198)
    months = dict(c.q("select month(o_orderdate), count(*) from orders group by 1"))
    c.share("S.may_orders", "orders dated in May", months.get(5, 0), O, 0.580)
    for m in (1, 2, 3, 4, 9, 10, 11, 12):
        v = months.get(m, 0) / O
        tol = SIGMAS * math.sqrt(0.021 * 0.979 / O)
        c.target(f"S.month_share.{m:02d}", f"orders dated in month {m}", round(v, 5),
                 "0.019..0.023", 0.019 - tol <= v <= 0.023 + tol)
    c.share("S.qty51", "lines with l_quantity = 51", q51, L, 0.4238)
    gold = c.one(f"select count(*) from orders where o_comment like '{J.GOLD_COMMENT}%'")
    c.share("S.gold_comments", "orders with o_comment like '1mine2 3gold4%'", gold, O, 0.2431)
    c.inv("S.distinct_partkey", "distinct l_partkey (= the referenced part domain)",
          c.one("select count(distinct l_partkey) from lineitem"), s.ngd)
    # gold parts: the 20 populous + every part hashed above the domain that is not Brand#55 (p = 24/25)
    n_unref = s.parts - s.ngd - 1
    exp_gold = 20 + n_unref * 24 / 25
    tol_gold = max(REL_TOL * exp_gold, SIGMAS * math.sqrt(n_unref * 24 / 25 / 25)) + 1
    got_gold = c.one(f"select count(*) from part where p_type = '{J.GOLD}'")
    c.target("S.gold_parts", f"parts with p_type = '{J.GOLD}' (1,339 at SF 1)", got_gold,
             f"{exp_gold:.0f} ± {tol_gold:.0f}", abs(got_gold - exp_gold) <= tol_gold)
    c.inv("S.gold_parts_referenced", "gold parts referenced by lineitem",
          c.one(f"select count(distinct l_partkey) from lineitem join part on l_partkey = p_partkey "
                f"where p_type = '{J.GOLD}'"), 20)
    c.target("S.mean_ship_gap", "mean(l_shipdate - o_orderdate)", round(float(mean_ship), 3), "61.0 ± 0.61",
             abs(float(mean_ship) - 61.0) <= 0.61)
    for label, vals in (("customer", cust_large), ("supplier", supp_large)):
        lo, hi = min(vals) / L, max(vals) / L
        ok_lo, exp = share_ok(lo, 0.1889, L // 5)
        ok_hi, _ = share_ok(hi, 0.1889, L // 5)
        c.target(f"S.large_nation_lines.{label}", f"lineitem share per large {label} nation (min..max)",
                 f"{lo:.4f}..{hi:.4f}", f"0.1886..0.1893 ({exp})", ok_lo and ok_hi)
    c.con.close()
    return c.out


def _refresh_keys(c: _Checks, d: Path, sf: float) -> None:
    """Refresh set 1 (JCC-H's rule, generated into a scratch folder, the data's own untouched) keeps
    every key: its lines' (part, supplier) pairs are partsupp rows, its orders' customers exist, its
    lines belong to its orders, and its order keys are new."""
    with tempfile.TemporaryDirectory(prefix="tilewise-jcch-check-") as tmp:
        tpch_refresh.generate(Dataset.at(d, benchmark="jcch", sf=sf), 1, Path(tmp), refresh.REFRESH.rule)
        c.con.execute(f"create temp view rf_orders as select * from read_parquet('{Path(tmp) / 'orders.parquet'}')")
        c.con.execute(f"create temp view rf_lineitem as select * from read_parquet('{Path(tmp) / 'lineitem.parquet'}')")
        c.inv("I2.refresh_lineitem_partsupp", "RF1 set 1: (l_partkey, l_suppkey) pairs missing from partsupp",
              c.one("select count(*) from rf_lineitem anti join partsupp on l_partkey = ps_partkey "
                    "and l_suppkey = ps_suppkey"), 0)
        c.inv("I2.refresh_orders_customer", "RF1 set 1: orders whose o_custkey is not a customer",
              c.one("select count(*) from rf_orders anti join customer on o_custkey = c_custkey"), 0)
        c.inv("I2.refresh_lineitem_orders", "RF1 set 1: lineitems whose order is not in the set",
              c.one("select count(*) from rf_lineitem anti join rf_orders on l_orderkey = o_orderkey"), 0)
        c.inv("I2.refresh_new_orderkeys", "RF1 set 1: order keys already loaded",
              c.one("select count(*) from rf_orders semi join orders using (o_orderkey)"), 0)
        c.con.execute("drop view rf_orders")
        c.con.execute("drop view rf_lineitem")


def failed(results: list[DataCheck]) -> list[DataCheck]:
    return [r for r in results if not r.ok]
