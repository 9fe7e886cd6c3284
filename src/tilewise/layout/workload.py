"""A workload as `data layout` sees it: its statements, and the columns their predicates filter on.

Statements come from a benchmark's catalog (``--benchmark B [--queries LIST]``) or from a file of
SQL (``--sql FILE``: statements separated by ``;``, ``--`` comments allowed). A file that does not
parse is an error naming the file, the statement and its line; a statement naming a table the data
set does not have is one too, before anything is measured.

Predicates (tilewise.data.predicates, parsed with sqlglot): a comparison of a column with a
constant, wherever it stands, resolved to its table. ``sort_candidates`` ranks (table, column) pairs
by how many statements filter on them, larger tables first: what `data layout` sorts on, found
from the workload, never given. Pure: no I/O except reading the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tilewise.data.predicates import Predicate, parse, filters_on, predicates  # noqa: F401 - the workload's API
from tilewise import userfiles
from tilewise.errors import UsageError


@dataclass(frozen=True)
class Statement:
    key: str  # "q6" (a benchmark's query), "s3" (the third statement of a file)
    sql: str
    query: int | str | None = None  # the benchmark's query id, when it is one
    where: str = ""  # "workload.sql line 12", for messages


def from_catalog(catalog, ids) -> list[Statement]:
    return [Statement(catalog.key(q), catalog.text(q), q, f"{catalog.title} {catalog.key(q)}") for q in ids]


def from_file(path: str | Path) -> list[Statement]:
    """The statements of a SQL file, as written, each parsed; an error names the statement and its line."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    p = Path(path)
    text = userfiles.read_text(p, "the workload file", "give a file of SQL statements, each ending with ';'",
                               devices=True)
    try:
        parts = _split(text)
    except TokenError as e:
        raise UsageError(f"{p}: invalid SQL: {str(e).splitlines()[0]}", "check its quotes and comments") from None
    out = []
    for first_line, sql in parts:
        n = len(out) + 1
        try:
            trees = [t for t in sqlglot.parse(sql) if t is not None]
        except (ParseError, TokenError) as e:
            err = (getattr(e, "errors", None) or [{}])[0]
            line = first_line + (err.get("line") or 1) - 1
            what = (err.get("description") or str(e).splitlines()[0]).split(" but got <Token")[0]
            if err.get("highlight"):
                what += f" near {err['highlight']!r}"
            raise UsageError(f"{p}: statement {n} (line {line}) is not valid SQL: {what}",
                             "fix the statement (statements end with ';')") from None
        if not trees:
            continue
        if not isinstance(trees[0], _exp().Query):
            raise UsageError(f"{p}: statement {n} (line {first_line}) is not a query ({trees[0].key.upper()})",
                             "a workload holds SELECT statements only")
        out.append(Statement(f"s{n}", sql, None, f"{p.name} statement {n} (line {first_line})"))
    if not out:
        raise UsageError(f"{p} holds no statement", "write one SELECT per statement, each ending with ';'")
    return out


def _exp():
    from sqlglot import exp

    return exp


def _split(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each non-empty statement of a file: sqlglot's tokenizer finds the
    semicolons (not those inside strings or comments)."""
    import sqlglot
    from sqlglot.tokens import TokenType

    cuts, start = [], 0
    for tok in sqlglot.tokenize(text):
        if tok.token_type == TokenType.SEMICOLON:
            cuts.append((start, tok.start))
            start = tok.end + 1
    cuts.append((start, len(text)))
    out = []
    for a, b in cuts:
        body = text[a:b]
        stripped = body.strip()
        if not stripped or all(ln.strip().startswith("--") or not ln.strip() for ln in stripped.splitlines()):
            continue
        lead = len(body) - len(body.lstrip())
        out.append((text.count("\n", 0, a + lead) + 1, stripped))
    return out


def check_tables(statements: list[Statement], tables: set[str]) -> None:
    """Every table a statement names exists (CTE names excepted): else an error naming the statement."""
    for st in statements:
        tree = parse(st.sql)
        if tree is None:
            continue
        exp = _exp()
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        for t in tree.find_all(exp.Table):
            name = t.name.lower()
            if name and name not in tables and name not in ctes:
                raise UsageError(f"{st.where}: no table {t.name!r} in the data set",
                                 f"its tables are {', '.join(sorted(tables))}")


def sort_candidates(statements: list[Statement], columns: dict[str, set[str]],
                    table_bytes: dict[str, int]) -> list[dict]:
    """(table, column) pairs the workload filters on with a range or equality, most useful first:
    by the table's size, then by how many statements filter on the column. Each: {table, column,
    statements: [keys], reason}."""
    by: dict[tuple[str, str], list[str]] = {}
    for st in statements:
        for p in predicates(st.sql, columns):
            if p.op in ("range", "eq", "in"):
                keys = by.setdefault((p.table, p.column), [])
                if st.key not in keys:
                    keys.append(st.key)
    ranked = sorted(by.items(), key=lambda kv: (-table_bytes.get(kv[0][0], 0), -len(kv[1]), kv[0]))
    out = []
    for (t, c), keys in ranked:
        out.append({"table": t, "column": c, "statements": keys,
                    "reason": f"{len(keys)} of {len(statements)} statements filter {t}.{c} with a range or "
                              f"equality ({', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''})"})
    return out


def best_sort(cands: list[dict]) -> dict | None:
    """The column to sort on: of the largest table with a filtered column, the column most
    statements filter on (ties: the name)."""
    return cands[0] if cands else None


