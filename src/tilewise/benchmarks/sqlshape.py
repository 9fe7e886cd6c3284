"""What a query's text says about the shape of its answer: the outermost ORDER BY keys and, per
output column, whether it is the result of a division (AVG or `/`). Parsed with sqlglot.

Validation needs both: rows tied on the ORDER BY keys may come in any order, and only division
results (which engines round or truncate differently) get rounding slack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Key:
    """One outermost ORDER BY key: an output name, a 1-based position, or an expression's SQL."""

    kind: str  # "name" | "position" | "expr"
    value: str | int


@dataclass(frozen=True)
class Output:
    name: str  # alias or column name, lower case; "" when the engine would make one up
    expr: str  # the expression's SQL without its alias
    division: bool  # AVG or `/` in it (or in the derived column it names)


@dataclass(frozen=True)
class Shape:
    outputs: tuple[Output, ...] | None  # None: not known (SELECT *, or the text did not parse)
    order_by: tuple[Key, ...] | None  # None: no outermost ORDER BY (the answer is a multiset)
    parsed: bool = True
    # names some derived table or CTE defines as a division: with SELECT * (outputs unknown) an
    # answer column of such a name is a division result (TPC-DS q28, q47, q63, q89)
    division_names: frozenset[str] = frozenset()


def has_order_by(sql: str) -> bool:
    """True when the outermost query has ORDER BY (row order is then part of the answer); a
    parenthesis count, for texts the parser does not understand."""
    body = re.sub(r"--[^\n]*", "", sql)
    depth, top = 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0:
            top.append(ch)
    return re.search(r"\border\s+by\b", "".join(top), re.I) is not None


@lru_cache(maxsize=256)
def analyse(sql: str) -> Shape:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql)
    except Exception:  # noqa: BLE001 - sqlglot raises several error types; any means "not understood"
        # Unknown shape: ordered queries then compare as one multiset, and no column gets slack.
        return Shape(None, () if has_order_by(sql) else None, parsed=False)
    order = tree.args.get("order")
    keys = None
    if order is not None:
        keys = tuple(_key(o.this) for o in order.expressions)
    select = tree
    while isinstance(select, exp.SetOperation):  # UNION/INTERSECT/EXCEPT: the first branch names the columns
        select = select.left
    aliases = _division_aliases(tree)
    if not isinstance(select, exp.Select) or any(isinstance(s, exp.Star) or
                                                 (isinstance(s, exp.Column) and isinstance(s.this, exp.Star))
                                                 for s in select.selects):
        return Shape(None, keys, division_names=frozenset(aliases))
    outs = []
    for s in select.selects:
        body = s.unalias()
        name = s.alias_or_name.lower() if (isinstance(s, exp.Alias) or isinstance(body, exp.Column)) else ""
        div = _has_division(body) or any(c.name.lower() in aliases for c in body.find_all(exp.Column))
        outs.append(Output(name, body.sql(), div))
    return Shape(tuple(outs), keys)


def _key(e) -> Key:
    from sqlglot import exp

    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
        return Key("position", int(e.this))
    if isinstance(e, exp.Column):
        return Key("name", e.name.lower())
    return Key("expr", e.sql())


def _has_division(e) -> bool:
    from sqlglot import exp

    return e.find(exp.Div, exp.Avg) is not None


def _division_aliases(tree) -> set[str]:
    """Names that some derived table or CTE defines as a division (a column named after them is one)."""
    from sqlglot import exp

    out: set[str] = set()
    changed = True
    defs = [(a.alias.lower(), a.this) for a in tree.find_all(exp.Alias)]
    while changed:  # an alias of an alias of a division is a division too
        changed = False
        for name, body in defs:
            if name in out:
                continue
            if _has_division(body) or any(c.name.lower() in out for c in body.find_all(exp.Column)):
                out.add(name)
                changed = True
    return out


def order_columns(shape: Shape, names: list[str]) -> tuple[int, ...] | None:
    """0-based output columns of the ORDER BY keys, as far as they map onto output columns.

    The list stops at the first key that is not an output column: rows that agree on the keys
    before it are ordered by something the answer does not show, so among them any order is right.
    None when the query has no ORDER BY.
    """
    if shape.order_by is None:
        return None
    lower = [n.lower() for n in names]
    exprs = [o.expr for o in shape.outputs] if shape.outputs else []
    out: list[int] = []
    for k in shape.order_by:
        idx = None
        if k.kind == "position" and 1 <= int(k.value) <= len(names):
            idx = int(k.value) - 1
        elif k.kind == "name" and k.value in lower:
            idx = lower.index(k.value)
        elif k.kind == "name" and shape.outputs and k.value in [o.name for o in shape.outputs]:
            idx = [o.name for o in shape.outputs].index(k.value)
        elif k.kind == "expr" and k.value in exprs:
            idx = exprs.index(k.value)
        if idx is None:
            break
        if idx not in out:
            out.append(idx)
    return tuple(out)


_INTEGER_TYPES = ("bigint", "integer", "int", "smallint", "tinyint")
_CAST_TAIL = re.compile(r"\s+as\s+(" + "|".join(_INTEGER_TYPES) + r")\s*$", re.I)


def rounding_casts(sql: str) -> str | None:
    """The text with every CAST(x AS <integer type>) made CAST(ROUND(x) AS <type>), or None when it has
    no such cast. A decimal cast to an integer is implementation-defined in the SQL standard: an engine
    may round (DuckDB, PostgreSQL) or truncate (DataFusion); the reference checks both (validate's
    "implementation-defined casts"). Rewritten on the text (balanced parentheses), not through a
    parser that would print the rest of the statement in its own dialect."""
    out, i, changed = [], 0, False
    low = sql.lower()
    for m in re.finditer(r"\bcast\s*\(", low):
        if m.start() < i:
            continue  # inside a cast already rewritten (its inner casts are rewritten below)
        start, depth, j = m.end(), 1, m.end()
        while j < len(sql) and depth:
            depth += {"(": 1, ")": -1}.get(sql[j], 0)
            j += 1
        if depth:
            return None  # unbalanced: leave the text alone
        inner = sql[start:j - 1]
        tail = _CAST_TAIL.search(inner)
        if tail is None:
            continue
        operand = inner[:tail.start()]
        rewritten = rounding_casts(operand) or operand
        out.append(sql[i:m.start()] + f"cast(round({rewritten}){inner[tail.start():]})")
        i, changed = j, True
    if not changed:
        return None
    out.append(sql[i:])
    return "".join(out)
