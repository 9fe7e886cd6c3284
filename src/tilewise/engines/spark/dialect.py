"""Spark SQL's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits, each of
which must match exactly as often as it says (engines/dialects.py). Every other query runs as the
benchmark wrote it. Each rule says why: Spark's error or wrong answer without it, against the
DataFusion reference (tilewise's validator; pyspark 4.3.0, TPC-DS qualification parameters, SF 0.01).

TPC-DS (docs/tpcds.md, "Engines"):
- integer / integer is a floating division in Spark (`/` always divides as double or decimal); the
  SQL standard (and DataFusion, Trino, PostgreSQL) truncates. q21, q34, q73, q78 and q83 divide
  integers: Spark gets `div`, its integer division (same precedence as `/`). Without it q21 and q34
  return other rows (q21: 30 rows, expected 18).
- Spark reads a double-quoted alias (`as "order count"`: q16, q32, q50, q62, q92, q94, q95, q99) as a
  string literal and rejects it: `[PARSE_SYNTAX_ERROR] Syntax error at or near '"order count"'`.
  It gets the alias in backquotes, its identifier quotes.
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites
from tilewise.sqlrewrite import Rule

# statement: how many double-quoted aliases it has
_QUOTED_ALIASES = {"16": 3, "32": 1, "50": 5, "62": 5, "92": 1, "94": 3, "95": 3, "99": 5}

TPCDS: dict[str, list[Rule]] = {
    **{q: [Rule(r'\bas\s+"([^"]+)"', r"as `\1`", n)] for q, n in _QUOTED_ALIASES.items()},
}

dialect = Rewrites("spark", __name__, {"tpcds": TPCDS})
