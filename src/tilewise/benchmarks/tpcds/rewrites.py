"""Documented rewrites of TPC-DS statements, each a literal edit that must match exactly as often as
stated (so a changed kit fails loudly instead of running an unrewritten text).

REFERENCE: for the reference engine (DataFusion) only, where its decimal arithmetic would make the
reference less exact than the query's mathematics (DataFusion keeps a decimal division at a fixed
scale, 6 or 8 digits, and q61 then multiplies by 100, q66 sums many such quotients, so the last
digits it reports are not exact). The rewrites compute the same expression exactly enough; engines
under test always get the text as written.

DIALECTS: per engine, where the engine's SQL differs from the standard the reference follows. This
table is the one place engine rewrites live until the engine contract lands: the harness finds them
through the benchmark spec (Benchmark.dialects, built by `dialects()` below), keyed by the engine's
registry name, and records every statement an engine ran rewritten (`"rewritten": true`).
NOTE FOR THE LEAD: with the engine contract's dialect hook (EngineSpec.dialect(text, Query)), each
entry moves to its engine's folder (engines/duckdb/: DuckDB's rules below, applied when
Query.benchmark == "tpcds"), and Benchmark.dialects goes.
- integer / integer is a floating division in DuckDB and Spark; the SQL standard (and DataFusion,
  Trino, PostgreSQL) truncates. q21, q34, q73, q78 and q83 divide integers; DuckDB gets `//`, Spark
  `div` (both integer division, at the same precedence as `/`).
- `at` is a reserved word in DuckDB; q90 names a derived table `at`: DuckDB gets it quoted.
- Spark reads a double-quoted alias (`as "order count"`, eight statements) as a string literal and
  rejects it; it gets the alias in backquotes, its identifier quotes.
- Trino does not compare a DATE with a string literal (`d_date between '2002-2-01' and ...`, seven
  statements) nor add an integer to a date (q72): it gets `cast('...' as date)` and an interval.
- Trino keeps AVG of a decimal at the argument's scale and a quotient at the larger operand's
  scale (2), where the other engines keep 6 or more digits; q36 ranks, q47, q57, q63 and q89 filter
  (`abs(sum - avg) / avg > 0.1`), q75 filters (`ratio < 0.9`) and q61 multiplies by such values, so
  their last digits choose rows. Trino gets the averaged or divided value as decimal(38,10) first
  (q61: the product first, as the reference).
"""

from __future__ import annotations

import functools
import re

from tilewise.errors import TilewiseError

# statement -> [(regex, replacement, expected number of matches)]
Rule = tuple[str, str, int]

REFERENCE: dict[str, list[Rule]] = {
    # (p / t) * 100 at DataFusion's division scale loses the last digits: (p * 100) / t keeps them
    "61": [(r"cast\(promotions as decimal\(15,4\)\)/cast\(total as decimal\(15,4\)\)\*100",
            "cast(promotions as decimal(15,4))*100/cast(total as decimal(15,4))", 1)],
    # x / (s / 3) * 100 at DataFusion's division scales: 300 * x / s is one division (three columns)
    "58": [(r"(\w\w)_item_rev/\(\(ss_item_rev\+cs_item_rev\+ws_item_rev\)/3\) \* 100",
            r"\1_item_rev*300/(ss_item_rev+cs_item_rev+ws_item_rev)", 3)],
    # twelve sums of quotients at scale 6: each quotient in double precision instead
    "66": [(r"sum\((\w+_sales)/w_warehouse_sq_ft\)", r"sum(cast(\1 as double)/w_warehouse_sq_ft)", 12)],
}

def _integer_division(op: str) -> dict[str, list[Rule]]:
    """The five statements that divide integers, with `op` (the engine's integer division) instead of `/`."""
    return {
        "21": [(r"inv_after / inv_before", f"inv_after {op} inv_before", 1)],
        "34": [(r"hd_dep_count/ household_demographics\.hd_vehicle_count",
                f"hd_dep_count {op} household_demographics.hd_vehicle_count", 1)],
        "73": [(r"hd_dep_count/ household_demographics\.hd_vehicle_count",
                f"hd_dep_count {op} household_demographics.hd_vehicle_count", 1)],
        "78": [(r"round\(ss_qty/\(", f"round(ss_qty {op} (", 1)],
        "83": [(r"(\w\w_item_qty)/\(sr_item_qty\+cr_item_qty\+wr_item_qty\)/3\.0",
                rf"\1 {op} (sr_item_qty+cr_item_qty+wr_item_qty)/3.0", 3)],
    }


# `as "order count"`: a double-quoted alias is an identifier in the SQL standard, a string in Spark
_QUOTED_ALIASES = {"16": 3, "32": 1, "50": 5, "62": 5, "92": 1, "94": 3, "95": 3, "99": 5}

# Trino compares a DATE with a string only after an explicit cast (no implicit conversion), and adds
# days to a date only as an interval
_DATE_LITERALS = {"16": 1, "32": 2, "58": 3, "83": 9, "92": 2, "94": 1, "95": 1}
_DATE = r"(?<!cast\()'(\d{4}-\d{1,2}-\d{1,2})'"

# Trino keeps AVG of a decimal at the argument's scale and a decimal quotient at the larger operand
# scale (2 here): where a statement ranks, filters or orders by such a value, its last digits decide
# which rows come out. Trino gets the averaged or divided value as decimal(38,10) first.
_WIDE = "decimal(38,10)"

DIALECTS: dict[str, dict[str, list[Rule]]] = {
    "duckdb": {
        **_integer_division("//"),
        "90": [(r"\)\s+at,", ') "at",', 1)],  # `at` is a reserved word in DuckDB
    },
    "spark": {
        **_integer_division("div"),
        **{q: [(r'\bas\s+"([^"]+)"', r"as `\1`", n)] for q, n in _QUOTED_ALIASES.items()},
    },
    "trino": {
        **{q: [(_DATE, r"cast('\1' as date)", n)] for q, n in _DATE_LITERALS.items()},
        "72": [(r"d1\.d_date \+ 5\b", "d1.d_date + interval '5' day", 1)],
        "36": [(r"sum\(ss_net_profit\)/sum\(ss_ext_sales_price\)",
                f"cast(sum(ss_net_profit) as {_WIDE})/sum(ss_ext_sales_price)", 2)],
        **{q: [(r"avg\(sum\((\w\w_sales_price)\)\)", rf"avg(cast(sum(\1) as {_WIDE}))", 1)]
           for q in ("47", "57", "63", "89")},
        "61": REFERENCE["61"],  # the quotient times 100 as the product divided (as for the reference)
        "75": [(r"CAST\(curr_yr\.sales_cnt AS DECIMAL\(17,2\)\)/", f"CAST(curr_yr.sales_cnt AS {_WIDE})/", 1)],
    },
}


def apply(rules: list[Rule], sql: str, what: str) -> str:
    for pattern, repl, count in rules:
        sql, n = re.subn(pattern, repl, sql)
        if n != count:
            raise TilewiseError(f"the {what} rewrite /{pattern}/ matched {n} times, expected {count}",
                                "the query kit changed: check tilewise.benchmarks.tpcds.rewrites")
    return sql


def reference_sql(sql: str, q=None) -> str:
    """The text DataFusion runs for statement q (unchanged unless REFERENCE names it)."""
    statement = str(q)
    return apply(REFERENCE[statement], sql, f"reference q{statement}") if statement in REFERENCE else sql


def for_dialect(engine: str, sql: str, q) -> str:
    """The text engine `engine` runs for statement q (unchanged unless DIALECTS names both)."""
    rules = DIALECTS.get(engine, {}).get(str(q))
    return apply(rules, sql, f"{engine} q{q}") if rules else sql


def dialects() -> dict:
    """{engine: its rewrite (sql, q) -> sql}, for Benchmark.dialects."""
    return {engine: functools.partial(for_dialect, engine) for engine in DIALECTS}
