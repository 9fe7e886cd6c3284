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

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

from tilewise.benchmarks.spec import Catalog, ParamSets, QueryId, QuerySet
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


# ---- seeds -----------------------------------------------------------------------------------------

def check_seed(seed) -> int:
    """dsqgen's RNGSEED: a whole number below 2^31."""
    try:
        v = int(seed)
    except (TypeError, ValueError):
        raise UsageError(f"seed {seed!r} is not a whole number", "use e.g. --seed 0") from None
    if not 0 <= v < 2**31:
        raise UsageError(f"seed {seed} is out of range for dsqgen", "use 0 .. 2147483647")
    return v


# ---- the benchmark contract's catalog and parameter sets --------------------------------------------

def query_id(statement: str) -> QueryId:
    """A statement's id in the catalog: 7 for "7", "14a" for a part of a two-part template."""
    return int(statement) if statement.isdigit() else statement


IDS: tuple[QueryId, ...] = tuple(query_id(s) for s in STATEMENTS)


def _text(q: QueryId) -> str:
    return qualification()[str(q)].sql


def _order(stream_no: int) -> list[QueryId]:
    """Every statement in the order stream `stream_no` runs it (the specification's permutation,
    which dsqgen draws per stream and does not depend on the seed)."""
    return [query_id(st.id) for st in stream(DEFAULT_SEED, stream_no)]


# Where TPC-DS divides an integer by an integer (the division as written, as `(left)/(right)`, and how
# often it occurs): the SQL standard (and DataFusion, Trino, PostgreSQL) truncates, while DuckDB,
# Spark and ClickHouse divide as floating point, so each of those rewrites these with its own
# integer division (engines.contract.Capabilities.integer_division).
INTEGER_DIVISIONS = {
    "21": (r"(inv_after) / (inv_before)", 1),
    "34": (r"(hd_dep_count)/ (household_demographics\.hd_vehicle_count)", 1),
    "73": (r"(hd_dep_count)/ (household_demographics\.hd_vehicle_count)", 1),
    "78": (r"(round\(ss_qty)/(\()", 1),
    "83": (r"(\w\w_item_qty)/(\(sr_item_qty\+cr_item_qty\+wr_item_qty\)/3\.0)", 3),
}

CATALOG = Catalog("TPC-DS", IDS, _text, _order, INTEGER_DIVISIONS)


class StreamQuerySet(QuerySet):
    """The SQL every stream runs, by `--params`:
    - "streams" (default): each stream's parameters drawn by dsqgen from the run's seed by the
      specification's substitution rules (stream 0 is the power test's), as a TPC-DS run draws them;
    - "qualification": the specification's qualification values in every stream."""

    def __init__(self, catalog: Catalog, params: str, seed: int, sf: float) -> None:
        super().__init__(catalog)
        self.params, self.seed, self.sf = params, check_seed(seed), float(sf)
        self.per_stream = params == "streams"

    def statement(self, q: QueryId, stream_no: int) -> Statement:
        if not self.per_stream:
            return qualification()[str(q)]
        return next(st for st in stream(self.seed, stream_no, _scale(self.sf)) if st.id == str(q))

    def sql(self, q: QueryId, stream_no: int) -> str:
        return self.statement(q, stream_no).sql

    def key(self, q: QueryId, stream_no: int) -> str:
        """Equal SQL, equal key: the statement and a hash of its text."""
        if not self.per_stream:
            return self.catalog.ref_key(q)
        return f"{self.catalog.ref_key(q)}-{hashlib.sha256(self.sql(q, stream_no).encode()).hexdigest()[:16]}"

    def describe(self, streams, ids) -> dict:
        """What results.json records: where the texts come from, the seed, the modifications."""
        kit = _kit.find()
        changed = sorted({f"q{q}" for q in ids for s in streams if self.statement(q, s).changes}, key=str)
        doc = {"benchmark": "tpcds", "params": self.params, "kit": kit.describe(),
               "seed": self.seed if self.per_stream else None, "streams": [int(s) for s in streams],
               "interval_literals": changed,
               "notes": [f"{len(changed)} statement(s) add days to dates with the SQL standard's interval literal "
                         "instead of the templates' `+ N days` (a minor query modification)"] if changed else []}
        if self.per_stream:
            doc["dsqgen"] = f"-STREAMS n -RNGSEED {self.seed} -SCALE {_kit._scale_arg(self.sf)}"
        return doc


def _scale(sf: float) -> float:
    """The scale factor dsqgen draws parameters for (a whole number, at least 1)."""
    return float(_kit._scale_arg(sf))


PARAMS = ParamSets(("streams", "qualification"), "streams",
                   "streams (default: each stream's parameters drawn by dsqgen from --seed, as a TPC-DS run does) or "
                   "qualification (the specification's qualification values in every stream)",
                   StreamQuerySet, fixed=("qualification",))
