"""DuckDB's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits, each of
which must match exactly as often as it says (engines/dialects.py). Every other query runs as the
benchmark wrote it. Each rule says why: DuckDB's error or wrong answer without it, against the
DataFusion reference (tilewise's validator; DuckDB 2.0.1, TPC-DS qualification parameters).

TPC-DS (docs/tpcds.md, "Engines"):
- integer / integer is a floating division in DuckDB; the SQL standard (and DataFusion, Trino,
  PostgreSQL) truncates. q21, q34, q73, q78 and q83 divide integers: DuckDB gets `//`, its integer
  division (same precedence as `/`). Without it: q21 30 rows, expected 18 and q34 19 rows, expected
  12 (SF 0.01); q73 5 rows, expected 4 and q83 `sr_dev` 18.579234972677593, expected 0.0 (SF 1);
  q78's ratios happen to come out alike at SF 0.01 and 1 but are the same division.
- `at` is a reserved word in DuckDB: q90 names a derived table `at` and fails with `Parser Error:
  syntax error at or near "at"`; DuckDB gets it quoted.
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites
from tilewise.sqlrewrite import Rule

TPCDS: dict[str, list[Rule]] = {
    "90": [Rule(r"\)\s+at,", ') "at",', 1)],
}

dialect = Rewrites("duckdb", __name__, {"tpcds": TPCDS})
