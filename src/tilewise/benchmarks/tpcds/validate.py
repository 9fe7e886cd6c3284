"""Exact answers for TPC-DS: every statement's answer computed by DataFusion, cached next to the data,
and an engine's rows checked with tilewise's rules (tilewise.bench.validate: exact integers,
decimals at their scale, dates and strings; floats 1e-9 relative; rows tied on the ORDER BY keys
as a multiset), plus two things TPC-DS needs:

- NULL order. Where NULLs sort is implementation-defined (the specification's answer sets come in
  NULLS FIRST and NULLS LAST variants). The reference is computed with the engine's own convention,
  which tilewise reads from the engine with two one-row queries (`probe_null_order`), through
  DataFusion's `default_null_ordering` (every ORDER BY without an explicit NULLS clause, window
  frames included). Each convention is cached apart.
- LIMIT boundaries. Many statements ORDER BY keys that tie and then LIMIT 100: the rows tied on the
  key at the boundary may be any of that key's rows. The reference keeps, for an answer that the
  LIMIT cut inside a tie group, every row of that group (from the statement run with a larger
  LIMIT). An engine's answer is then right when: it has as many rows; every row before the boundary
  group matches the reference as usual; and its rows from the boundary on all carry the boundary key
  and are a sub-multiset of the group. Nothing else gets slack. When the ORDER BY has a key that is
  not an output column, tie groups are on the keys before it (as for TPC-H) and a cut group gets no
  pool: the engine must then return the reference's rows.

The cache file of each answer carries a SHA-256 of its columns and rows; a file that does not match
its hash is not used (it is recomputed), so a tampered reference is caught.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.bench import validate as v
from tilewise.benchmarks.tpcds import rewrites
from tilewise.data import Dataset
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json

REF_FORMAT = "tilewise-tpcds-reference/1"
NULL_ORDERS = ("nulls_max", "nulls_min", "nulls_first", "nulls_last")  # DataFusion's names
_LIMIT = re.compile(r"\blimit\s+(\d+)\s*$", re.I)
_POOL_STEP = 10000  # extra rows fetched to find the end of a tie group cut by the LIMIT


def probe_null_order(run) -> str:
    """The engine's NULL order, from run(sql) -> rows of two one-row-NULL queries."""
    probe = "SELECT x FROM (SELECT 1 AS x UNION ALL SELECT NULL AS x) t ORDER BY x"
    asc = [r[0] for r in run(probe)]
    desc = [r[0] for r in run(probe + " DESC")]
    first_asc, first_desc = asc[0] is None, desc[0] is None
    return {(False, True): "nulls_max", (True, False): "nulls_min", (True, True): "nulls_first",
            (False, False): "nulls_last"}[(first_asc, first_desc)]


@dataclass
class Answer:
    columns: list[v.Column]
    rows: list[list]
    limit: int | None = None
    boundary: int | None = None  # index of the first row of a tie group the LIMIT cut (None: not cut)
    pool: list[list] = field(default_factory=list)  # every row of that group

    def to_json(self) -> dict:
        return {"columns": [c.to_json() for c in self.columns], "rows": self.rows, "limit": self.limit,
                "boundary": self.boundary, "pool": self.pool}

    @classmethod
    def from_json(cls, d: dict) -> Answer:
        return cls([v.Column(c["name"], c["type"], c["kind"]) for c in d["columns"]], d["rows"], d.get("limit"),
                   d.get("boundary"), d.get("pool") or [])


def digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Reference:
    """DataFusion's answers for one TPC-DS data set under one NULL order, cached per statement text in
    <data>/reference/tpcds-f1-datafusion-<version>/<null order>/<key>.json."""

    def __init__(self, dataset: Dataset, *, null_order: str = "nulls_max") -> None:
        if null_order not in NULL_ORDERS:
            raise UsageError(f"unknown NULL order {null_order!r}", f"use one of {', '.join(NULL_ORDERS)}")
        self.dataset = dataset
        self.null_order = null_order
        self.version = v.reference_engine_version()
        self.cache_dir = Path(dataset.dir) / "reference" / f"tpcds-f1-datafusion-{self.version}" / null_order
        self._mem: dict[str, tuple[str, Answer]] = {}
        self._ctx = None
        self.computed: list[str] = []  # keys computed (not read from the cache) by this object

    # ---- computing -------------------------------------------------------------------------------

    def _context(self):
        if self._ctx is None:
            import datafusion

            cfg = datafusion.SessionConfig().set("datafusion.sql_parser.default_null_ordering", self.null_order)
            ctx = datafusion.SessionContext(cfg)
            for name, p in self.dataset.tables.items():
                ctx.register_parquet(name, str(p))
            self._ctx = ctx
        return self._ctx

    def _run(self, sql: str, key: str):
        text = rewrites.reference_sql(statement_of(key), sql)
        try:
            table = self._context().sql(text).to_arrow_table()
        except Exception as e:  # noqa: BLE001 - DataFusion raises several types; all mean "no answer"
            raise TilewiseError(f"the reference engine (DataFusion) failed on {key}: {' '.join(str(e).split())[:300]}") from None
        cols = [v.Column(f.name, str(f.type), v.arrow_kind(f.type)) for f in table.schema]
        # by position: TPC-DS answers repeat column names (q39's two d_moy), which a dict would merge
        rows = list(zip(*(c.to_pylist() for c in table.columns))) if table.num_columns else []
        return cols, v.norm_rows(rows)

    def _compute(self, sql: str, key: str) -> Answer:
        cols, rows = self._run(sql, key)
        m = _LIMIT.search(sql)
        ans = Answer(cols, rows, int(m.group(1)) if m else None)
        if ans.limit is None or len(rows) < ans.limit or not rows:
            return ans
        _, keys = v.columns_for(sql, cols)
        if not keys or len(keys) != _order_length(sql):
            return ans  # no ORDER BY, or a key that is not an output column: no pool (see the docstring)
        # the last tie group of the answer: is it cut? fetch more rows until the group ends
        ccols = [v.Column(c.name, c.type, c.kind) for c in cols]
        last = rows[-1]
        start = len(rows) - 1
        while start > 0 and _same_keys(rows[start - 1], last, keys, ccols):
            start -= 1
        extra = _POOL_STEP
        while True:
            _, more = self._run(_LIMIT.sub(f"limit {ans.limit + extra}", sql), key)
            tail = [r for r in more[start:] if _same_keys(r, last, keys, ccols)]
            ended = len(more) < ans.limit + extra or not _same_keys(more[-1], last, keys, ccols)
            if ended:
                break
            extra *= 10
        if len(tail) > len(rows) - start:
            ans.boundary, ans.pool = start, tail
        return ans

    # ---- the cache --------------------------------------------------------------------------------

    def answer(self, sql: str, key: str) -> Answer:
        if key in self._mem and self._mem[key][0] == sql:
            return self._mem[key][1]
        path = self.cache_dir / f"{key}.json"
        ans = None
        try:
            doc = json.loads(path.read_text())
            if (doc.get("format") == REF_FORMAT and doc.get("sql") == sql and doc.get("sha256") == digest(doc["answer"])
                    and doc.get("reference_sql") == rewrites.reference_sql(statement_of(key), sql)):
                ans = Answer.from_json(doc["answer"])
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            pass
        if ans is None:
            ans = self._compute(sql, key)
            self.computed.append(key)
            body = ans.to_json()
            try:
                atomic_write_json(path, {"format": REF_FORMAT, "engine": f"datafusion {self.version}", "key": key,
                                         "null_order": self.null_order, "sql": sql,
                                         "reference_sql": rewrites.reference_sql(statement_of(key), sql),
                                         "sha256": digest(body),
                                         "answer": body}, indent=None)
            except OSError:
                pass  # a read-only data directory only costs recomputation next time
        self._mem[key] = (sql, ans)
        return ans

    def check(self, sql: str, key: str, rows) -> v.Check:
        return compare(v.norm_rows(rows), self.answer(sql, key), sql)


def statement_of(key: str) -> str:
    """"q14a" or "q14a-s3-..." -> "14a": cache keys start with the statement's label."""
    return key.split("-", 1)[0].lstrip("q")


def _order_length(sql: str) -> int:
    shape = v.sqlshape.analyse(sql)
    return len(shape.order_by or ())


def _same_keys(a: list, b: list, keys, cols) -> bool:
    return all(v.values_equal(a[k], b[k], cols[k].division) for k in keys)


def compare(got: list[list], ans: Answer, sql: str) -> v.Check:
    """An engine's normalised rows against the reference answer (rules in the module docstring)."""
    cols, keys = v.columns_for(sql, ans.columns)
    if ans.boundary is None:
        return v.compare(got, ans.rows, cols, keys)
    if len(got) != len(ans.rows):
        return v.Check(False, f"{len(got)} rows, expected {len(ans.rows)}")
    b = ans.boundary
    head = v.compare(got[:b], ans.rows[:b], cols, keys)
    if not head.ok:
        return head
    key_row = ans.rows[b]
    free = list(ans.pool)
    for i in range(b, len(got)):
        g = got[i]
        if len(g) != len(cols):
            return v.Check(False, f"row {i + 1}: {len(g)} columns, expected {len(cols)}")
        if not _same_keys(g, key_row, keys, cols):
            return v.Check(False, f"row {i + 1}: {v._show_row(g)} does not carry the ORDER BY key of rows "
                                  f"{b + 1}-{len(got)} ({', '.join(v._show(key_row[k]) for k in keys)})")
        k = next((j for j, w in enumerate(free) if v._rows_equal(g, w, cols)), None)
        if k is None:
            return v.Check(False, f"row {i + 1}: {v._show_row(g)} is not one of the {len(ans.pool)} rows tied on the "
                                  f"ORDER BY key at the LIMIT (or appears more often than among them)")
        free.pop(k)
    return v.Check(True, f"rows {b + 1}-{len(got)} tie on the ORDER BY key at the LIMIT: checked against all "
                         f"{len(ans.pool)} rows with that key")
