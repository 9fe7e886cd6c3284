"""The reference engine's rewrites of TPC-DS statements (Benchmark.reference_sql): literal edits, each
of which must match exactly as often as it says (tilewise.sqlrewrite), so a changed kit fails loudly
instead of computing a reference from an unrewritten text.

For the reference engine (DataFusion) only, where its decimal arithmetic would make the reference
less exact than the query's mathematics: DataFusion keeps a decimal division at a fixed scale (6 or
8 digits), so q61, which multiplies a quotient by 100, q58, which divides by a quotient, and q66,
which sums many quotients, would lose their last digits. The rewrites compute the same expression
exactly enough. Engines under test get the text as written, plus their own documented rewrites
where their dialect needs them (EngineSpec.dialect: engines/<name>/dialect.py).
"""

from __future__ import annotations

from tilewise import sqlrewrite
from tilewise.sqlrewrite import Rule

REFERENCE: dict[str, list[Rule]] = {
    # (p / t) * 100 at DataFusion's division scale loses the last digits: (p * 100) / t keeps them
    "61": [Rule(r"cast\(promotions as decimal\(15,4\)\)/cast\(total as decimal\(15,4\)\)\*100",
                "cast(promotions as decimal(15,4))*100/cast(total as decimal(15,4))", 1)],
    # x / (s / 3) * 100 at DataFusion's division scales: 300 * x / s is one division (three columns)
    "58": [Rule(r"(\w\w)_item_rev/\(\(ss_item_rev\+cs_item_rev\+ws_item_rev\)/3\) \* 100",
                r"\1_item_rev*300/(ss_item_rev+cs_item_rev+ws_item_rev)", 3)],
    # twelve sums of quotients at scale 6: each quotient in double precision instead
    "66": [Rule(r"sum\((\w+_sales)/w_warehouse_sq_ft\)", r"sum(cast(\1 as double)/w_warehouse_sq_ft)", 12)],
}


def reference_sql(sql: str, q=None) -> str:
    """The text DataFusion runs for statement q (unchanged unless REFERENCE names it)."""
    statement = str(q)
    if statement not in REFERENCE:
        return sql
    return sqlrewrite.apply(REFERENCE[statement], sql, f"reference q{statement}", __name__)
