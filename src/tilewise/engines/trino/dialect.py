"""Trino's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits, each of
which must match exactly as often as it says (engines/dialects.py). Every other query runs as the
benchmark wrote it. Each rule says why: Trino's error or wrong answer without it, against the
DataFusion reference (tilewise's validator; Trino 476, TPC-DS qualification parameters, SF 0.01).

TPC-DS (docs/tpcds.md, "Engines"):
- Trino compares a DATE with a string only after an explicit cast (no implicit conversion): q16,
  q32, q58, q83, q92, q94 and q95 fail with `TYPE_MISMATCH` (`Cannot check if date is BETWEEN
  varchar(9) and date`, `Cannot apply operator: date = varchar(10)`, `IN value and list items must
  be the same type`). They get `cast('...' as date)`.
- Trino adds days to a date only as an interval: q72 (`d1.d_date + 5`) fails with `Cannot apply
  operator: date + integer`; it gets `+ interval '5' day`.
- Trino keeps AVG of a decimal at the argument's scale and a decimal quotient at the larger
  operand's scale (2 here), where the other engines keep 6 or more digits; where a statement ranks,
  filters or multiplies by such a value, its last digits decide which rows come out. Without the
  rewrites: q36's `rank_within_parent` over a margin kept at 2 digits ranks near-equal margins
  alike; q61 gives 98.6000, the reference 98.59920967 (the quotient at 4 digits times 100); q75
  31 rows, expected 32 (a ratio rounded to 2 digits is not `< 0.9`); q89 another 100th row
  (averages at 2 digits move rows across `> 0.1` and the LIMIT). q47, q57 and q63 filter the same
  way and pass at SF 0.01 only because no row sits that close to the boundary: they get it too.
  At SF 1 (dsqgen's parameters, seed 0) two more did the same: q31 gave 41 rows, expected 42 (its
  web and store growth ratios, at 2 digits, compared with `>`), and q53 another row 83 (its
  quarterly averages at 2 digits, filtered `> 0.1` like q63's).
  Trino gets the averaged or divided value as decimal(38,10) first (q61: the product first).
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites
from tilewise.sqlrewrite import Rule

# statement: how many date literals it compares with a DATE column
_DATE_LITERALS = {"16": 1, "32": 2, "58": 3, "83": 9, "92": 2, "94": 1, "95": 1}
_DATE = r"(?<!cast\()'(\d{4}-\d{1,2}-\d{1,2})'"

_WIDE = "decimal(38,10)"

TPCDS: dict[str, list[Rule]] = {
    **{q: [Rule(_DATE, r"cast('\1' as date)", n)] for q, n in _DATE_LITERALS.items()},
    "72": [Rule(r"d1\.d_date \+ 5\b", "d1.d_date + interval '5' day", 1)],
    "36": [Rule(r"sum\(ss_net_profit\)/sum\(ss_ext_sales_price\)",
                f"cast(sum(ss_net_profit) as {_WIDE})/sum(ss_ext_sales_price)", 2)],
    **{q: [Rule(r"avg\(sum\((\w\w_sales_price)\)\)", rf"avg(cast(sum(\1) as {_WIDE}))", 1)]
       for q in ("47", "53", "57", "63", "89")},
    "31": [Rule(r"\b((?:ws|ss)\d\.(?:web|store)_sales)/", rf"cast(\1 as {_WIDE})/", 8)],
    # (p / t) * 100 as (p * 100) / t: the product first, as the reference computes it
    "61": [Rule(r"cast\(promotions as decimal\(15,4\)\)/cast\(total as decimal\(15,4\)\)\*100",
                "cast(promotions as decimal(15,4))*100/cast(total as decimal(15,4))", 1)],
    "75": [Rule(r"CAST\(curr_yr\.sales_cnt AS DECIMAL\(17,2\)\)/", f"CAST(curr_yr.sales_cnt AS {_WIDE})/", 1)],
}

dialect = Rewrites("trino", __name__, {"tpcds": TPCDS})
