"""Answer validation: every result is compared exactly with an independent engine's answer (DataFusion).

Reference answers are computed once per data set and cached next to the data, in
<sf dir>/reference/f3-datafusion-<version>/qNN.json, with DataFusion's column names and Arrow types
(the directory is replaced with the data, so a regenerated data set never meets stale answers).

The rules (docs/tpch.md, "Validation"):
- Integers, decimals at their scale, dates and strings compare exactly; NULL only equals NULL.
- Floating results (DOUBLE/REAL on both sides) agree within a relative 1e-9.
- Engines type some results differently: DuckDB returns AVG as DOUBLE, Trino keeps AVG and decimal
  division as DECIMAL with a smaller scale. Two numbers of different scales are compared at the
  coarser one: the finer is rounded (or truncated) to it and must then be equal.
- Division results (AVG, `/`; read from the query text) may differ by one unit of the coarser
  scale's last digit (engines round or truncate them). Nothing else gets slack: a count off by one
  or a money sum off by 0.01 is wrong.
- Row order is compared on the outermost ORDER BY keys; rows tied on them compare as a multiset.
  Without ORDER BY the whole answer is a multiset.

The text the reference engine runs for a query is the benchmark's to say (Benchmark.reference_sql:
TPC-H's rewrites Q21 for speed); the benchmark is the data set's, from the registry.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

from tilewise import benchmarks
from tilewise.bench import sqlshape
from tilewise.data import Dataset
from tilewise.errors import TilewiseError
from tilewise.fsutil import atomic_write_json

FLOAT_REL_TOL = Decimal("1e-9")
REF_FORMAT = "tilewise-tpch-reference/3"
RULES = ("exact for integers, decimals at their scale, dates, strings; floats 1e-9 relative; "
         "different scales compared at the coarser; division results (AVG, /) 1 unit of the last digit; "
         "rows tied on ORDER BY keys as a multiset")
_NUMERIC = ("i", "dec", "f")
_MAX_GREEDY = 5000  # rows in one tie group beyond which a failed sorted match is not retried pairwise


def reference_engine_version() -> str:
    import datafusion

    return datafusion.__version__


# ---- normalisation ----------------------------------------------------------------------------

def norm_value(v) -> list:
    """A JSON-able, type-tagged value: ["i", "12"], ["dec", "1.250"] (the scale kept), ["f", "0.1"],
    ["s", "x"], ["d", "1995-03-15"], ["b", "true"], ["z"] (NULL)."""
    if v is None:
        return ["z"]
    if isinstance(v, bool):
        return ["b", "true" if v else "false"]
    if isinstance(v, int):
        return ["i", str(v)]
    if isinstance(v, Decimal):
        return ["dec", str(v)] if v.is_finite() else ["f", str(v).lower()]
    if isinstance(v, float):
        return ["f", repr(v)]
    if isinstance(v, (_dt.datetime, _dt.date)):
        return ["d", v.isoformat()]
    if isinstance(v, bytes):
        return ["s", v.decode("utf-8", "replace")]
    return ["s", str(v)]


def norm_rows(rows) -> list[list]:
    return [[norm_value(v) for v in row] for row in rows]


# ---- columns ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """One output column of the reference: its name, Arrow type and kind, and whether it is a division."""

    name: str
    type: str = ""  # the reference's Arrow type, e.g. "decimal128(25, 2)"
    kind: str = ""  # "int" | "dec" | "float" | "date" | "str" | "bool" | "other"; "" = from the values
    division: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "kind": self.kind}


def arrow_kind(t) -> str:
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_decimal(t):
        return "dec"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "date"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view":
        return "str"
    return "other"


# ---- comparing values -----------------------------------------------------------------------------

def _number(v: list) -> Decimal | None:
    try:
        d = Decimal(v[1])
    except (InvalidOperation, IndexError):
        return None
    return d if d.is_finite() else None


def _scale(v: list) -> int | None:
    """Decimal places a value is exact to: 0 for integers, the scale for decimals, None for floats."""
    if v[0] == "i":
        return 0
    if v[0] == "dec":
        exp = Decimal(v[1]).as_tuple().exponent
        return max(0, -exp) if isinstance(exp, int) else 0
    return None


def values_equal(got: list, want: list, division: bool = False) -> bool:
    """One cell, by the rules in the module docstring."""
    if got[0] not in _NUMERIC or want[0] not in _NUMERIC:
        return got == want  # strings, dates, booleans, NULL: exactly
    x, y = _number(got), _number(want)
    if x is None or y is None:  # NaN / inf
        return got[0] == want[0] == "f" and got[1] == want[1]
    if x == y:
        return True
    sx, sy = _scale(got), _scale(want)
    if sx is None and sy is None:  # floating on both sides
        return abs(x - y) <= FLOAT_REL_TOL * max(abs(x), abs(y))
    coarse = min(s for s in (sx, sy) if s is not None)
    unit = Decimal(1).scaleb(-coarse)
    if division:  # AVG / division: engines round or truncate; one unit of the coarser last digit
        return abs(x - y) <= unit
    if sx == sy or "i" in (got[0], want[0]):  # same scale or an integer, not a division: exactly
        return False
    fine, coarse_v = (x, y) if sx is None or (sy is not None and sx > sy) else (y, x)
    return any(fine.quantize(unit, rounding=r) == coarse_v for r in (ROUND_HALF_EVEN, ROUND_HALF_UP, ROUND_DOWN))


# ---- comparing answers --------------------------------------------------------------------------

@dataclass
class Check:
    ok: bool
    detail: str = ""


def _sort_key(row: list):
    out = []
    for v in row:
        if v[0] in _NUMERIC:
            d = _number(v)
            out.append((0, float(d) if d is not None else math.inf, v[1]))
        else:
            out.append((1, 0.0, json.dumps(v)))
    return out


def _rows_equal(g: list, w: list, cols: list[Column]) -> bool:
    return len(g) == len(w) and all(values_equal(a, b, c.division) for a, b, c in zip(g, w, cols))


def _show(v: list) -> str:
    return "NULL" if v[0] == "z" else str(v[1])


def _show_row(row: list) -> str:
    return "(" + ", ".join(_show(v) for v in row) + ")"


def _first_difference(g: list, w: list, cols: list[Column], i: int) -> str:
    for j, (a, b, c) in enumerate(zip(g, w, cols)):
        if not values_equal(a, b, c.division):
            name = f" ({c.name})" if c.name else ""
            return f"row {i + 1}, column {j + 1}{name}: got {_show(a)}, expected {_show(b)}"
    return f"row {i + 1}: differs"


def _unmatched(got: list[list], want: list[list], cols: list[Column]) -> int | None:
    """None when got and want hold the same rows (by the cell rules) in any order, else the index of
    a got row without a partner."""
    order = sorted(range(len(got)), key=lambda i: _sort_key(got[i]))
    w = sorted(want, key=_sort_key)
    first_bad = next((i for i, b in zip(order, w) if not _rows_equal(got[i], b, cols)), None)
    if first_bad is None:
        return None
    if len(got) > _MAX_GREEDY:  # sorted order disagrees and the group is too big to pair one by one
        return first_bad
    free = list(want)
    for i, a in enumerate(got):  # values within the tolerance can sort differently: pair them one by one
        k = next((k for k, b in enumerate(free) if _rows_equal(a, b, cols)), None)
        if k is None:
            return i
        free.pop(k)
    return None


def _tie_groups(want: list[list], keys: tuple[int, ...], cols: list[Column]) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive reference rows that agree on the key columns."""
    groups, start = [], 0
    for i in range(1, len(want) + 1):
        if i == len(want) or not all(values_equal(want[i][k], want[i - 1][k], cols[k].division) for k in keys):
            groups.append((start, i))
            start = i
    return groups


def compare(got: list[list], want: list[list], columns: list[Column] | None = None,
            order_keys: tuple[int, ...] | None = None) -> Check:
    """Compare normalised rows with the reference's; the detail names the first difference.

    order_keys: the output columns of the ORDER BY keys (None: no ORDER BY, compare as a multiset;
    (): ordered by something not in the answer, also a multiset).
    """
    if len(got) != len(want):
        return Check(False, f"{len(got)} rows, expected {len(want)}")
    width = len(want[0]) if want else 0
    cols = list(columns) if columns is not None else [Column("") for _ in range(width)]
    for i, g in enumerate(got):
        if len(g) != len(cols):
            return Check(False, f"row {i + 1}: {len(g)} columns, expected {len(cols)}")
    if order_keys is None:
        groups = [(0, len(want))]
    else:
        groups = _tie_groups(want, order_keys, cols)
    for a, b in groups:
        if b - a == 1:
            if not _rows_equal(got[a], want[a], cols):
                return Check(False, _first_difference(got[a], want[a], cols, a))
            continue
        k = _unmatched(got[a:b], want[a:b], cols)
        if k is None:
            continue
        i = a + k
        if order_keys is None:
            return Check(False, f"got row {_show_row(got[i])}, which the reference does not have")
        if _rows_equal(got[i], want[i], cols):
            detail = f"row {i + 1}: {_show_row(got[i])} appears more often than in the reference"
        else:
            detail = _first_difference(got[i], want[i], cols, i)
        return Check(False, f"{detail} (rows {a + 1}-{b} tie on the ORDER BY keys: any order of them is right)")
    return Check(True)


# ---- the reference -----------------------------------------------------------------------------

@dataclass
class Answer:
    columns: list[Column]
    rows: list[list]


class Reference:
    """Reference answers for one data set, computed by DataFusion on first use and cached.

    With a refresh `state` (tilewise.data.refresh.DataState and its update sets), the answers are
    those of the loaded data after those refresh functions: the tables they change become views
    (TPC-H: orders and lineitem, loaded rows minus RF2's deletions plus RF1's insertions), cached
    apart per state."""

    def __init__(self, dataset: Dataset, *, state=None, sets=None) -> None:
        self.dataset = dataset
        self.spec = benchmarks.get(dataset.benchmark)
        self.data_dir = Path(dataset.dir)
        self.version = reference_engine_version()
        self.state = state if state is not None and not state.loaded else None
        self.sets = sets or {}
        self.cache_dir = self.data_dir / "reference" / f"f3-datafusion-{self.version}"
        if self.state is not None:
            self.cache_dir = self.cache_dir / self.state.key
        self._mem: dict[str, tuple[str, Answer]] = {}
        self._ctx = None

    def answer(self, q) -> Answer:
        """The answer to query q of the benchmark's catalog (its qualification parameters)."""
        return self.answer_sql(self.spec.catalog.text(q), self.spec.catalog.ref_key(q))

    def answer_sql(self, sql: str, key: str) -> Answer:
        """The reference answer to sql, cached as <cache_dir>/<key>.json (recomputed when the SQL differs)."""
        if key in self._mem and self._mem[key][0] == sql:
            return self._mem[key][1]
        path = self.cache_dir / f"{key}.json"
        ans = None
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") == REF_FORMAT and doc.get("sql") == sql:
                ans = Answer([Column(c["name"], c["type"], c["kind"]) for c in doc["columns"]], doc["rows"])
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            pass
        if ans is None:
            ans = self._compute(sql, key)
            self._store(path, {"format": REF_FORMAT, "engine": f"datafusion {self.version}", "query": key,
                               "sql": sql, "columns": [c.to_json() for c in ans.columns], "rows": ans.rows})
        self._mem[key] = (sql, ans)
        return ans

    def prepare(self, numbers) -> None:
        for n in numbers:
            self.answer(n)

    def _compute(self, sql: str, key: str) -> Answer:
        if self._ctx is None:
            import datafusion

            ctx = datafusion.SessionContext()
            changed = set(self.state.changed) if self.state is not None else set()
            for name, p in self.dataset.tables.items():
                ctx.register_parquet(f"{name}__loaded" if name in changed else name, str(p))
            if self.state is not None:
                files, views = self.state.views(self.sets)
                for name, p in files.items():
                    ctx.register_parquet(name, str(p))
                for view in views:
                    ctx.sql(view)
            self._ctx = ctx
        try:
            table = self._ctx.sql(self.spec.reference_sql(sql)).to_arrow_table()
        except Exception as e:
            raise TilewiseError(f"the reference engine (DataFusion) failed on {key}: {e}") from None
        cols = [Column(f.name, str(f.type), arrow_kind(f.type)) for f in table.schema]
        data = table.to_pydict()
        names = table.column_names
        rows = list(zip(*(data[c] for c in names))) if names else []
        return Answer(cols, norm_rows(rows))

    def _store(self, path: Path, doc: dict) -> None:
        try:
            atomic_write_json(path, doc, indent=None)
        except OSError:
            pass  # a read-only data directory only costs recomputation next time

    def check(self, q, rows) -> Check:
        return self.check_sql(self.spec.catalog.text(q), self.spec.catalog.ref_key(q), rows)

    def check_sql(self, sql: str, key: str, rows) -> Check:
        ans = self.answer_sql(sql, key)
        cols, keys = columns_for(sql, ans.columns)
        return compare(norm_rows(rows), ans.rows, cols, keys)


def columns_for(sql: str, ref_columns: list[Column]) -> tuple[list[Column], tuple[int, ...] | None]:
    """The reference's columns with their division flags from the SQL, and the ORDER BY key columns."""
    shape = sqlshape.analyse(sql)
    outs = shape.outputs if shape.outputs is not None and len(shape.outputs) == len(ref_columns) else None
    cols = [Column(c.name, c.type, c.kind, bool(outs and outs[i].division)) for i, c in enumerate(ref_columns)]
    return cols, sqlshape.order_columns(shape, [c.name for c in ref_columns])
