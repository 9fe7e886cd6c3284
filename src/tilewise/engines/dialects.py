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
