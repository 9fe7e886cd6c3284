"""The tiles engine's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits,
each of which must match exactly as often as it says (engines/dialects.py). Every other query runs as
the benchmark wrote it.

The engine is DataFusion, and so is the reference; where the reference itself is computed from a
rewritten text because DataFusion's decimal arithmetic would lose digits (benchmarks/tpcds/rewrites.py),
the engine needs the same rewrite to give the exact answer:
- TPC-DS q66 sums twelve quotients `x_sales/w_warehouse_sq_ft`, each kept at DataFusion's division
  scale (6 digits): without the rewrite, row 1's apr_sales_per_sq_foot is 0.041627 where the exact
  value is 0.0416283812... (SF 0.01, qualification parameters). Each quotient is taken in double
  precision, as the reference takes it.
q58 and q61 need no rewrite on this data (their answers match at SF 0.01), and TPC-H and JCC-H none.
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites
from tilewise.sqlrewrite import Rule

TPCDS = {
    "66": [Rule(r"sum\((\w+_sales)/w_warehouse_sq_ft\)", r"sum(cast(\1 as double)/w_warehouse_sq_ft)", 12)],
}

dialect = Rewrites("tiles", __name__, {"tpcds": TPCDS})
