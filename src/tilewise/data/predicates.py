"""What a query's predicates filter on, and routing a query to a table's sorted copy (pure, sqlglot).

A predicate here is a comparison of a column with a constant (``=``, ``<``, ``<=``, ``>``, ``>=``,
``BETWEEN``, ``IN (list)``, ``LIKE``) wherever it stands (WHERE, HAVING, JOIN ... ON, subqueries).
A column is resolved to its table through the statement's aliases, else through the data set's
columns (a name only one table has). `tilewise data layout` finds the column to sort on from them
(tilewise.layout.workload); a two-copy layout (tilewise.data.layouts) sends each query that filters
on the sort column to the sorted copy (``route``): the engine then reads that copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Predicate:
    table: str
    column: str
    op: str  # "eq" | "range" | "in" | "like"


@lru_cache(maxsize=512)
def parse(sql: str):
    import sqlglot

    try:
        return sqlglot.parse_one(sql)
    except Exception:  # noqa: BLE001 - a text sqlglot cannot parse has no predicates we can see
        return None


_OPS = {"EQ": "eq", "GT": "range", "GTE": "range", "LT": "range", "LTE": "range", "Between": "range", "In": "in",
        "Like": "like", "ILike": "like"}


def predicates(sql: str, columns: dict[str, set[str]]) -> list[Predicate]:
    """The (table, column, op) of every comparison of a column with a constant in sql; columns:
    table -> its column names (to resolve unqualified names). Order of appearance, duplicates dropped."""
    tree = parse(sql)
    if tree is None:
        return []
    from sqlglot import exp

    aliases = {}
    for t in tree.find_all(exp.Table):
        aliases[t.alias_or_name.lower()] = t.name.lower()
    owners: dict[str, list[str]] = {}
    for t, cols in columns.items():
        for c in cols:
            owners.setdefault(c.lower(), []).append(t)
    out: list[Predicate] = []
    for node in tree.find_all(*(getattr(exp, k) for k in _OPS)):
        col, other = _column_side(node, exp)
        if col is None or other is None:
            continue
        table = aliases.get(col.table.lower()) if col.table else None
        if table is None:
            cands = owners.get(col.name.lower(), [])
            if len(cands) != 1:
                continue
            table = cands[0]
        p = Predicate(table, col.name.lower(), _OPS[type(node).__name__])
        if p not in out:
            out.append(p)
    return out


def _column_side(node, exp):
    """(the column, the constant side) of a comparison whose one side is a bare column and whose
    other side names no column; (None, None) otherwise."""
    if isinstance(node, exp.Between):
        sides = [node.this], [node.args.get("low"), node.args.get("high")]
    elif isinstance(node, exp.In):
        if node.args.get("query") is not None or node.args.get("field") is not None:
            return None, None
        sides = [node.this], list(node.expressions)
    else:
        a, b = node.this, node.expression
        if isinstance(b, exp.Column) and not isinstance(a, exp.Column):
            a, b = b, a
        sides = [a], [b]
    col = sides[0][0]
    if not isinstance(col, exp.Column):
        return None, None
    consts = sides[1]
    if not consts or any(c is None or any(True for _ in c.find_all(exp.Column)) or c.find(exp.Select) for c in consts):
        return None, None
    return col, consts


def filters_on(sql: str, table: str, column: str, columns: dict[str, set[str]]) -> bool:
    """The statement has a range or equality predicate on table.column (its sorted copy helps it)."""
    return any(p.table == table and p.column == column and p.op in ("range", "eq", "in")
               for p in predicates(sql, columns))


def sorted_name(table: str, column: str) -> str:
    """The name a two-copy layout's sorted copy of a table is registered under."""
    return f"{table}__sorted_{column}"


def route(sql: str, table: str, column: str, columns: dict[str, set[str]]) -> str:
    """sql reading the sorted copy of `table` when it filters on `column`, else sql as it is. Only
    the table references change (``lineitem`` becomes ``lineitem__sorted_l_shipdate AS lineitem``,
    or keeps its alias), spliced into the text as written: the engine's own SQL is kept."""
    if not filters_on(sql, table, column, columns):
        return sql
    from sqlglot import exp

    tree = parse(sql)
    spans = []
    for t in tree.find_all(exp.Table):
        ident = t.this
        meta = getattr(ident, "meta", None) or {}
        if t.name.lower() != table.lower() or "start" not in meta or t.args.get("db"):
            continue
        alias = "" if t.alias else f" AS {table}"
        spans.append((meta["start"], meta["end"] + 1, sorted_name(table, column) + alias))
    for a, b, text in sorted(spans, reverse=True):
        sql = sql[:a] + text + sql[b:]
    return sql
