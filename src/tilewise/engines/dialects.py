"""An engine's dialect hook (EngineSpec.dialect) made of literal rewrites, keyed by benchmark and
query: what the built-in engines use where their SQL differs from the benchmark's text.

The table lives in the engine's folder (engines/<name>/dialect.py), with why each rule is there
(the engine's error or wrong answer without it); the mechanics are here once: a query the table
does not name runs as written, and every rule must match exactly as often as it says
(tilewise.sqlrewrite), so a changed query kit fails loudly instead of running an unrewritten text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tilewise import sqlrewrite
from tilewise.engines.contract import Query
from tilewise.sqlrewrite import Rule

# {benchmark registry name: {query id as the catalog writes it ("21", "14a"): the rules, in order}}
Table = Mapping[str, Mapping[str, Sequence[Rule]]]


@dataclass(frozen=True)
class Rewrites:
    """A dialect hook: `Rewrites("duckdb", __name__, {"tpcds": {...}})` as EngineSpec(dialect=...)."""

    engine: str  # for messages
    module: str  # the module holding (and documenting) the table, for the error's fix
    table: Table

    def rules(self, benchmark: str, query_id) -> Sequence[Rule]:
        """The rules for one query (none: it runs as written)."""
        return self.table.get(benchmark, {}).get(str(query_id), ())

    def __call__(self, sql: str, query: Query) -> str:
        rules = self.rules(query.benchmark, query.id)
        if not rules:
            return sql
        return sqlrewrite.apply(rules, sql, f"{self.engine} {query.benchmark} q{query.id}", self.module)


# Where TPC-DS divides an integer by an integer (statement: the division as written, as
# `(left)/(right)`, and how often it occurs): the SQL standard (and DataFusion, Trino, PostgreSQL)
# truncates, while DuckDB, Spark and ClickHouse divide as floating point, so each of those engines
# rewrites these into its own integer division (`integer_divisions`).
TPCDS_INTEGER_DIVISIONS = {
    "21": (r"(inv_after) / (inv_before)", 1),
    "34": (r"(hd_dep_count)/ (household_demographics\.hd_vehicle_count)", 1),
    "73": (r"(hd_dep_count)/ (household_demographics\.hd_vehicle_count)", 1),
    "78": (r"(round\(ss_qty)/(\()", 1),
    "83": (r"(\w\w_item_qty)/(\(sr_item_qty\+cr_item_qty\+wr_item_qty\)/3\.0)", 3),
}


def integer_divisions(operator: str) -> dict[str, list[Rule]]:
    """TPC-DS's integer divisions rewritten with the engine's integer-division `operator`."""
    return {q: [Rule(pat, rf"\1 {operator} \2", n)] for q, (pat, n) in TPCDS_INTEGER_DIVISIONS.items()}
