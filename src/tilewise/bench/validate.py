"""Answer validation: every result is compared with an independent engine's answer (DataFusion).

Reference answers are computed once per data set and cached next to the data, in
<sf dir>/reference/datafusion-<version>/qNN.json (the directory is replaced with the data, so a
regenerated data set never meets stale answers). Values are normalised to a type-tagged form:
numbers (int, float, Decimal) compare with a relative tolerance of 1e-6, or, for decimals from a
division (6+ decimals, or fewer on one side), within one unit of the last decimal place (engines
round or truncate AVG over decimals differently); strings and
dates compare exactly; NULL only equals NULL. Row order matters only when the query has ORDER BY.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from tilewise.fsutil import atomic_write_json
from tilewise.bench import queries as _queries
from tilewise.data import Dataset
from tilewise.errors import TilewiseError

REL_TOL = 1e-6
DIVISION_QUANTUM = Decimal("1e-6")
REF_FORMAT = "tilewise-tpch-reference/2"


def reference_engine_version() -> str:
    import datafusion

    return datafusion.__version__


# ---- normalisation ----------------------------------------------------------------------------

def norm_value(v):
    """A JSON-able, type-tagged value: ["n", "1.25"] (["n", "1.25", "dec"] for decimals), ["s", "x"],
    ["d", "1995-03-15"], ["z"]."""
    if v is None:
        return ["z"]
    if isinstance(v, bool):
        return ["n", str(int(v))]
    if isinstance(v, Decimal):
        return ["n", str(v), "dec"]  # fixed scale: its digits say how precise it is
    if isinstance(v, int):
        return ["n", str(v)]
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return ["f", repr(v)]
        return ["n", repr(v)]
    if isinstance(v, (_dt.datetime, _dt.date)):
        return ["d", v.isoformat()]
    if isinstance(v, bytes):
        return ["s", v.decode("utf-8", "replace")]
    return ["s", str(v)]


def norm_rows(rows) -> list[list]:
    return [[norm_value(v) for v in row] for row in rows]


def _quantum(v: list) -> Decimal:
    if len(v) < 3 or v[2] != "dec":
        return Decimal(0)  # a float's printed digits say nothing about its precision
    d = Decimal(v[1])
    exp = d.as_tuple().exponent
    return Decimal(1).scaleb(exp) if isinstance(exp, int) and exp < 0 else Decimal(0)


def values_equal(a: list, b: list) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] != "n":
        return a[1:] == b[1:]
    x, y = Decimal(a[1]), Decimal(b[1])
    if x == y:
        return True
    diff = abs(x - y)
    if diff <= Decimal(REL_TOL) * max(abs(x), abs(y)):
        return True
    # Decimal results of a division (AVG: decimal(..,6)) are rounded by some engines (Spark, DuckDB)
    # and truncated by others (DataFusion): they agree within one unit of the last digit when one
    # side has fewer decimals, or when both have 6 or more. Money sums with 2 decimals get no slack.
    qa, qb = _quantum(a), _quantum(b)
    q = max(qa, qb)
    if q == 0 or (qa == qb and q > DIVISION_QUANTUM):
        return False
    return diff <= q


def _sort_key(row: list):
    out = []
    for v in row:
        if v[0] == "n":
            out.append((0, float(Decimal(v[1])), ""))
        else:
            out.append((1, 0.0, json.dumps(v)))
    return out


@dataclass
class Check:
    ok: bool
    detail: str = ""


def compare(got: list[list], want: list[list], ordered: bool) -> Check:
    """Compare normalised row sets; the detail names the first difference."""
    if len(got) != len(want):
        return Check(False, f"{len(got)} rows, expected {len(want)}")
    if not ordered:
        got, want = sorted(got, key=_sort_key), sorted(want, key=_sort_key)
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            return Check(False, f"row {i + 1}: {len(g)} columns, expected {len(w)}")
        for j, (a, b) in enumerate(zip(g, w)):
            if not values_equal(a, b):
                return Check(False, f"row {i + 1}, column {j + 1}: got {_show(a)}, expected {_show(b)}")
    return Check(True)


def _show(v: list) -> str:
    return "NULL" if v[0] == "z" else str(v[1])


# ---- the reference -----------------------------------------------------------------------------

class Reference:
    """Reference answers for one data set, computed by DataFusion on first use and cached."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.data_dir = Path(dataset.dir)
        self.version = reference_engine_version()
        self.cache_dir = self.data_dir / "reference" / f"datafusion-{self.version}"
        self._mem: dict[int, list[list]] = {}
        self._ctx = None

    def answer(self, n: int) -> list[list]:
        if n in self._mem:
            return self._mem[n]
        path = self.cache_dir / f"q{n:02d}.json"
        sql = _queries.load(n)
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") == REF_FORMAT and doc.get("sql") == sql:
                self._mem[n] = doc["rows"]
                return doc["rows"]
        except (OSError, ValueError, AttributeError):
            pass
        rows = self._compute(sql, n)
        self._mem[n] = rows
        self._store(path, {"format": REF_FORMAT, "engine": f"datafusion {self.version}", "query": n,
                           "sql": sql, "rows": rows})
        return rows

    def prepare(self, numbers) -> None:
        for n in numbers:
            self.answer(n)

    def _compute(self, sql: str, n: int) -> list[list]:
        if self._ctx is None:
            import datafusion

            ctx = datafusion.SessionContext()
            for name, p in self.dataset.tables.items():
                ctx.register_parquet(name, str(p))
            self._ctx = ctx
        try:
            table = self._ctx.sql(sql).to_arrow_table()
        except Exception as e:
            raise TilewiseError(f"the reference engine (DataFusion) failed on q{n}: {e}") from None
        cols = table.to_pydict()
        names = table.column_names
        rows = list(zip(*(cols[c] for c in names))) if names else []
        return norm_rows(rows)

    def _store(self, path: Path, doc: dict) -> None:
        try:
            atomic_write_json(path, doc, indent=None)
        except OSError:
            pass  # a read-only data directory only costs recomputation next time

    def check(self, n: int, rows) -> Check:
        return compare(norm_rows(rows), self.answer(n), _queries.has_order_by(_queries.load(n)))
