"""The 99 TPC-DS query templates as 103 statements, rendered from the official kit (tilewise.benchmarks.tpcds.kit).

- Qualification parameters (the specification's Appendix B values, for validation): every
  substitution tag a template's query text uses ([YEAR], [ZIP.17], ...) is replaced by the
  specification's value before dsqgen renders the template; nothing else of the template changes.
- Streams (the specification's substitution rules, clause 4.1.3 and dsqgen): dsqgen draws every
  stream's parameters from its random number generator seeded with the run's seed, and orders the
  templates of stream s as the specification permutes them (stream 0 is the power test's). The same
  (seed, stream, scale factor) always renders the same text; stream s does not depend on how many
  streams a run has.

Statements are named by template number, with "a"/"b" for the two parts of templates 14, 23, 24
and 39: "1" ... "14a", "14b", ... "99".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tilewise.benchmarks.tpcds import kit as _kit
from tilewise.errors import TilewiseError, UsageError

TEMPLATES = tuple(range(1, 100))
MULTIPART = (14, 23, 24, 39)
STATEMENTS = tuple(f"{n}{p}" for n in TEMPLATES for p in (("a", "b") if n in MULTIPART else ("",)))
DEFAULT_SEED = 0

_MARK = re.compile(r"^-- (start|end) query (\d+) in stream (\d+) using template query(\d+)\.tpl\s*$", re.M)
_TAG = re.compile(r"\[([A-Za-z][A-Za-z0-9_]*)(?:\.(\d+))?\]")
_DEFINE = re.compile(r"^\s*define\s+\w+\s*=.*?;[ \t]*$", re.M | re.I | re.S)


@dataclass(frozen=True)
class Statement:
    id: str  # "7", "14a"
    template: int
    sql: str  # without a trailing semicolon
    changes: tuple[str, ...] = ()  # the minor query modifications applied to the kit's text

    @property
    def label(self) -> str:
        return f"q{self.id}"


def statements_of(template: int) -> tuple[str, ...]:
    return tuple(s for s in STATEMENTS if int(s.rstrip("ab")) == template)


def template_of(statement: str) -> int:
    return int(statement.rstrip("ab"))


# ---- qualification ------------------------------------------------------------------------------

def qualification_template(n: int, text: str, values: dict[str, str]) -> str:
    """Template n with every substitution tag of its query text replaced by the specification's
    value (values: {"NAME.NN": value}); the defines stay as they are (dsqgen still evaluates them,
    nothing uses them). An error names a tag the specification gives no value for."""
    pieces, last = [], 0
    for m in _DEFINE.finditer(text):  # leave define lines (their expressions use tags too) alone
        pieces.append(_substitute(n, text[last:m.start()], values))
        pieces.append(m.group(0))
        last = m.end()
    pieces.append(_substitute(n, text[last:], values))
    return "".join(pieces)


def _substitute(n: int, body: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name, k = m.group(1), m.group(2)
        key = f"{name}.{int(k or 1):02d}"
        if key not in values:
            raise TilewiseError(f"template query{n}.tpl uses [{m.group(0)[1:-1]}], for which the specification's "
                                "qualification values have none", f"reinstall the kit: {_kit.INSTALL}")
        return values[key]

    out = []
    for line in body.splitlines(keepends=True):
        out.append(line if line.lstrip().startswith("--") else _TAG.sub(one, line))
    return "".join(out)


@lru_cache(maxsize=4)
def qualification(sf: float = 1.0) -> dict[str, Statement]:
    """The 103 statements with the specification's qualification parameters (ascending order)."""
    k = _kit.find()
    values = _kit.qualification_values()
    templates = {f"query{n}.tpl": qualification_template(n, k.template(n), values.get(n, {})) for n in TEMPLATES}
    (text,) = _kit.dsqgen(k, templates, streams=1, sf=sf, qualify=True)
    return {s.id: s for s in split_stream(text)}


# ---- streams ----------------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def stream(seed: int, s: int, sf: float = 1.0) -> tuple[Statement, ...]:
    """Stream s's statements in the specification's order for that stream, parameters drawn by dsqgen
    from `seed` (RNGSEED)."""
    k = _kit.find()
    templates = {f"query{n}.tpl": k.template(n) for n in TEMPLATES}
    texts = _kit.dsqgen(k, templates, streams=s + 1, seed=check_seed(seed), sf=sf)
    return tuple(split_stream(texts[s]))


def stream_order(s: int, seed: int = DEFAULT_SEED) -> list[int]:
    """The template numbers in the order stream s runs them (the permutation does not depend on the
    seed's parameters, only on the stream)."""
    out: list[int] = []
    for st in stream(seed, s):
        if st.template not in out:
            out.append(st.template)
    return out


def split_stream(text: str) -> list[Statement]:
    """dsqgen's output (tilewise's dialect) -> statements, in the output's order."""
    out: list[Statement] = []
    marks = list(_MARK.finditer(text))
    if not marks or len(marks) % 2:
        raise TilewiseError("dsqgen's output has no or unpaired query markers", f"reinstall the kit: {_kit.INSTALL}")
    for begin, end in zip(marks[::2], marks[1::2]):
        if begin.group(1) != "start" or end.group(1) != "end" or begin.group(4) != end.group(4):
            raise TilewiseError("dsqgen's output has mismatched query markers")
        n = int(begin.group(4))
        parts = [p.strip() for p in text[begin.end():end.start()].split(";")]
        parts = [p for p in parts if p]
        ids = statements_of(n)
        if len(parts) != len(ids):
            raise TilewiseError(f"template query{n}.tpl rendered {len(parts)} statements, expected {len(ids)}")
        for i, p in zip(ids, parts):
            sql, k = interval_literals(p)
            out.append(Statement(i, n, sql, (f"interval literal x{k}",) if k else ()))
    return out


# The templates add days to dates as `cast('2000-08-23' as date) + 14 days`, which no engine here
# parses (DuckDB, DataFusion, Spark and Trino all reject it). The specification allows date arithmetic
# in the system's syntax as a minor query modification (clause 4.2.3.4); every engine gets the SQL
# standard's interval literal instead: `+ interval '14' day`. Nothing else in the text changes.
_DAYS = re.compile(r"(as date\)\s*)([+-])\s*(\d+)\s+days\b", re.I)


def interval_literals(sql: str) -> tuple[str, int]:
    """sql with `+ N days` / `- N days` as `+ interval 'N' day`, and how many were rewritten."""
    return _DAYS.subn(lambda m: f"{m.group(1)}{m.group(2)} interval '{m.group(3)}' day", sql)


# ---- selections ------------------------------------------------------------------------------------

def check_seed(seed) -> int:
    try:
        v = int(seed)
    except (TypeError, ValueError):
        raise UsageError(f"seed {seed!r} is not a whole number", "use e.g. --seed 0") from None
    if not 0 <= v < 2**31:
        raise UsageError(f"seed {seed} is out of range", "use 0 .. 2147483647")
    return v


def parse_selection(text: str | None) -> list[str]:
    """"1,14,20-22" -> ["1", "14a", "14b", "20", "21", "22"]; "14b" names one part; None/"all" -> all
    103 statements; unknown numbers are an error."""
    if text is None or text.strip().lower() in ("", "all"):
        if text is not None and not text.strip():
            raise UsageError("empty query list", "use e.g. --queries 1,14,20-22")
        return list(STATEMENTS)
    out: list[str] = []
    for part in text.split(","):
        part = part.strip().lower().lstrip("q")
        m = re.fullmatch(r"(\d+)([ab]?)(?:-q?(\d+))?", part)
        if not m or (m.group(2) and m.group(3)):
            raise UsageError(f"bad query list {text!r}", "use e.g. --queries 1,14,20-22 or 14b")
        lo = int(m.group(1))
        hi = int(m.group(3)) if m.group(3) else lo
        if lo > hi:
            raise UsageError(f"bad query range {part!r}", "write ranges low-high, e.g. 20-22")
        for n in range(lo, hi + 1):
            if n not in TEMPLATES:
                raise UsageError(f"no TPC-DS query {n}", "templates are numbered 1..99")
            ids = statements_of(n)
            if m.group(2):
                want = f"{n}{m.group(2)}"
                if want not in ids:
                    raise UsageError(f"TPC-DS query {n} has one part, not {want}", f"use --queries {n}")
                ids = (want,)
            out += [i for i in ids if i not in out]
    return out
