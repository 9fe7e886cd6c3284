"""PostgreSQL's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits, each
of which must match exactly as often as it says (engines/dialects.py). Every other query runs as
the benchmark wrote it. Each rule says why: PostgreSQL's error, wrong answer or run time without
it, against the DataFusion reference (tilewise's validator; PostgreSQL 15, SF 0.01).

TPC-H and JCC-H:
- Q17 compares each lineitem with 20 % of its part's average quantity, a correlated subquery.
  PostgreSQL does not decorrelate it: it runs the subquery once per joined lineitem row, each an
  index scan of that part's lineitems. With TPC-H's uniform parts that is ~30 rows per part; with
  JCC-H's skew the chosen part is one of the popular ones and the work grows with the square of
  its lineitems: JCC-H Q17 ran more than 4 minutes at SF 0.01 (TPC-H Q17: a millisecond). The
  subquery becomes a LATERAL derived table evaluated once per qualifying part (the same average,
  the same comparison): JCC-H Q17 then takes milliseconds and both validate exactly.
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites
from tilewise.sqlrewrite import Rule

_Q17 = [
    Rule(r"from\s+lineitem,\s+part\s+where",
         "from part cross join lateral (select 0.2 * avg(l_quantity) as avg_quantity from lineitem "
         "where l_partkey = p_partkey) as part_avg, lineitem where", 1),
    Rule(r"and\s+l_quantity\s+<\s+\(\s*select\s+0\.2\s+\*\s+avg\(l_quantity\)\s+from\s+lineitem\s+where\s+"
         r"l_partkey\s+=\s+p_partkey\s*\)",
         "and l_quantity < part_avg.avg_quantity", 1),
]

TPCH = {"17": _Q17}


def _alias(pattern: str, name: str) -> Rule:
    """The derived table whose closing parenthesis is group 1 of pattern gets an alias."""
    return Rule(pattern, rf"\1 {name}\2", 1)


_LOCHIERARCHY = r"case when lochierarchy = 0 then (\w+) end"

TPCDS = {
    "2": [_alias(r"(from catalog_sales\))(\))", "wscs_sales")],
    "14a": [_alias(r"(d3\.d_year between \d+ AND \d+ \+ 2\))(\s+where i_brand_id = brand_id)", "common_items")],
    "23a": [_alias(r"(group by c_customer_sk\))(\),)", "customer_sales"),
            _alias(r"(in \(select c_customer_sk from best_ss_customer\)\))(\s*limit 100)", "all_sales")],
    "23b": [_alias(r"(group by c_customer_sk\))(\),)", "customer_sales"),
            _alias(r"(group by c_last_name,c_first_name\))(\s*order by c_last_name,c_first_name,sales)",
                   "all_sales")],
    "49": [_alias(r"(\))(\s*order by 1,4,5,2)", "returns_ranked")],
    "36": [Rule(_LOCHIERARCHY, r"case when grouping(i_category)+grouping(i_class) = 0 then \1 end", 1)],
    "70": [Rule(_LOCHIERARCHY, r"case when grouping(s_state)+grouping(s_county) = 0 then \1 end", 1)],
    "86": [Rule(_LOCHIERARCHY, r"case when grouping(i_category)+grouping(i_class) = 0 then \1 end", 1)],
}

dialect = Rewrites("postgres", __name__, {"tpch": TPCH, "jcch": TPCH, "tpcds": TPCDS})
