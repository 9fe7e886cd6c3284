"""Literal rewrites of a query's text, each of which must match exactly as often as it says.

A rule that matches another number of times (the query kit changed, a stream drew a text the rule
did not foresee) is an error naming the rule and where it is written, never a text run unrewritten
or rewritten twice. One helper for every user: the benchmarks' reference rules
(benchmarks/tpcds/rewrites.py) and the engines' dialect hooks (engines/dialects.py, each engine's
dialect.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from tilewise.errors import TilewiseError


class Rule(NamedTuple):
    pattern: str  # a regular expression
    replacement: str | Callable[[re.Match], str]  # re.sub's replacement (\1 for its first group, or a function of the match)
    count: int  # how many times the pattern must match


def apply(rules: Iterable[Rule | tuple[str, str, int]], sql: str, what: str, where: str) -> str:
    """sql with every rule applied in turn; `what` names the rewrite in the error ("duckdb tpcds
    q90"), `where` the module that documents the rules (the error's fix says to check it)."""
    for pattern, repl, count in rules:
        sql, n = re.subn(pattern, repl, sql)
        if n != count:
            raise TilewiseError(f"the {what} rewrite /{pattern}/ matched {n} times, expected {count}",
                                f"the query text changed: check the rule in {where}")
    return sql
