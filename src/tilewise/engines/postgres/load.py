"""PostgreSQL's copy of a data set: loaded once per data set, cached, copied into every instance.

Loading (``load``, through a running server): per table CREATE TABLE with the types the Parquet
columns have (TYPES), then ``COPY ... FROM STDIN (FORMAT csv, FREEZE)`` in the same transaction,
fed by pyarrow, which turns the Parquet row groups into CSV (with wal_level = minimal such a COPY
writes no WAL, and FREEZE spares the later VACUUM its rewrite); the tables load in parallel, one
connection each. Then the keys the data set's benchmark defines (Dataset.keys; TPC-H's primary
and foreign keys, TPC-DS's primary keys): the primary keys, an index on each foreign key not
already covered by a primary key's leading columns, the foreign-key constraints (DEFERRABLE
INITIALLY DEFERRED: the refresh functions delete an order before its lineitems in one
transaction; validated, so the planner uses them for join estimates), and nothing else. Last,
VACUUM (FREEZE, ANALYZE) and a CHECKPOINT.

The cache (``Template``), like Trino's statistics (engines/trino/hive.py):

    <Dataset.dir>/postgres/pg<major>/data/        a cleanly shut-down data directory holding the loaded set
    <Dataset.dir>/postgres/pg<major>/ready.json   what it holds: the data files' identity, the keys, the recipe

It lives in the data set's directory, so a regenerated data set never meets a stale copy, and
ready.json names the data files' size and modification time: a data set whose files changed is
loaded again (not their inode numbers, which a file system shared with a VM guest renumbers). Each instance starts from its own copy of the cached directory (``cp -a
--reflink=auto``: a clone where the file system can, else a copy; seconds at SF 1, against about a
minute to load), so the cache does not depend on the instance layout: a run with 1 or 16 instances
uses the same one. The load runs under an exclusive lock, copies under a shared one. A data set in
a directory tilewise cannot write is loaded each time, into the run's own directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tilewise.data import Dataset, Keys
from tilewise.engines import sqltypes
from tilewise.errors import TilewiseError
from tilewise.fsutil import atomic_write_json

READY_FORMAT = "tilewise-postgres-load/3"  # bump when what a load builds changes
BATCH_ROWS = 128 * 1024  # rows per CSV chunk handed to COPY

TYPES = sqltypes.TypeNames({
    "int64": "bigint", "int32": "integer", "int16": "smallint", "int8": "smallint", "uint8": "smallint",
    "uint16": "integer", "uint32": "bigint", "double": "double precision", "float": "real", "bool": "boolean",
    "date32[day]": "date", "timestamp[us]": "timestamp", "timestamp[ms]": "timestamp", "timestamp[ns]": "timestamp",
    "string": "text", "large_string": "text", "string_view": "text",
}, "numeric")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pg_type(t) -> str:
    st = sqltypes.sql_type(t, TYPES)
    if st is None:
        raise TilewiseError(f"no PostgreSQL type for Parquet column type {t}")
    return st


def table_ddl(table: str, path: Path, *, temp: bool = False, unlogged: bool = False) -> str:
    """CREATE TABLE for a Parquet file's columns (NOT NULL where the file says so)."""
    import pyarrow.parquet as pq

    cols = ", ".join(f"{quote_ident(f.name)} {pg_type(f.type)}{'' if f.nullable else ' NOT NULL'}"
                     for f in pq.read_schema(path))
    kind = "TEMPORARY " if temp else "UNLOGGED " if unlogged else ""
    tail = " ON COMMIT DROP" if temp else ""
    return f"CREATE {kind}TABLE {quote_ident(table)} ({cols}){tail}"


def copy_sql(table: str, *, freeze: bool = False) -> str:
    return f"COPY {quote_ident(table)} FROM STDIN (FORMAT csv{', FREEZE' if freeze else ''})"


def csv_chunks(path: Path, batch_rows: int = BATCH_ROWS):
    """The Parquet file's rows as CSV (no header; NULL as an empty unquoted field, strings quoted:
    COPY's CSV reads an empty quoted string as '' and an empty field as NULL)."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    opts = pcsv.WriteOptions(include_header=False, quoting_style="needed")
    for batch in pf.iter_batches(batch_size=batch_rows):
        batch = pa.RecordBatch.from_arrays(
            [c.cast(pa.string()) if pa.types.is_string_view(c.type) else c for c in batch.columns],
            names=batch.schema.names)
        buf = io.BytesIO()
        pcsv.write_csv(batch, buf, opts)
        yield buf.getvalue()


def copy_into(cur, table: str, path: Path, *, freeze: bool = False) -> None:
    with cur.copy(copy_sql(table, freeze=freeze)) as cp:
        for chunk in csv_chunks(path):
            cp.write(chunk)


def _name(*parts: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", "_".join(parts).lower())[:60]


def key_statements(keys: Keys, tables: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(primary keys, foreign-key indexes, foreign-key constraints) for the tables present."""
    primary = {t: cols for t, cols in keys.primary}
    pks = [f"ALTER TABLE {quote_ident(t)} ADD CONSTRAINT {quote_ident(_name(t, 'pkey'))} PRIMARY KEY "
           f"({', '.join(map(quote_ident, cols))})" for t, cols in keys.primary if t in tables]
    idx, fks = [], []
    for fk in keys.foreign:
        if fk.table not in tables or fk.parent not in tables:
            continue
        pk = primary.get(fk.table, ())
        if tuple(pk[:len(fk.columns)]) != tuple(fk.columns):  # not served by the primary key's index
            idx.append(f"CREATE INDEX {quote_ident(_name(fk.table, *fk.columns, 'idx'))} ON {quote_ident(fk.table)} "
                       f"({', '.join(map(quote_ident, fk.columns))})")
        if not fk.holds:  # the benchmark's data do not always satisfy it: indexed, not declared
            continue
        fks.append(f"ALTER TABLE {quote_ident(fk.table)} ADD CONSTRAINT "
                   f"{quote_ident(_name(fk.table, *fk.columns, 'fkey'))} FOREIGN KEY "
                   f"({', '.join(map(quote_ident, fk.columns))}) REFERENCES {quote_ident(fk.parent)} "
                   f"({', '.join(map(quote_ident, fk.parent_columns))}) DEFERRABLE INITIALLY DEFERRED")
    return pks, idx, fks


def load(connect: Callable[[], object], ds: Dataset, *, threads: int, log=None) -> dict:
    """Load ds into the database `connect()` reaches (autocommit connections): tables, keys,
    statistics. Returns what it did and how long each step took; a key the data violates is
    reported (``keys_failed``), never silently dropped."""
    info: dict = {"tables": {}, "keys_failed": []}
    order = sorted(ds.tables, key=lambda t: -os.path.getsize(ds.tables[t]))  # the largest first
    threads = max(1, threads)

    def one_table(t: str) -> tuple[str, float]:
        t0 = time.perf_counter()
        with contextlib.closing(connect()) as conn:
            with conn.transaction():
                cur = conn.cursor()
                cur.execute(table_ddl(t, ds.tables[t]))
                copy_into(cur, t, ds.tables[t], freeze=True)
        return t, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pg-load") as pool:
        for t, s in pool.map(one_table, order):
            info["tables"][t] = round(s, 3)
    info["copy_s"] = round(time.perf_counter() - t0, 3)
    if log:
        log(f"PostgreSQL: {len(order)} tables copied in {info['copy_s']:.1f} s")

    t1 = time.perf_counter()
    if ds.keys is not None:
        pks, idx, fks = key_statements(ds.keys, set(ds.tables))

        def run(sql: str) -> None:
            with contextlib.closing(connect()) as conn:
                try:
                    conn.execute(sql)
                except Exception as e:  # noqa: BLE001 - psycopg's errors: the data violate the key
                    info["keys_failed"].append({"sql": sql, "error": _first_line(e)})
                    if log:
                        log(f"PostgreSQL: warning: {sql}: {_first_line(e)}")

        for batch in (pks, idx):  # one statement per table at a time: they lock their table
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pg-keys") as pool:
                list(pool.map(run, batch))
        for sql in fks:  # each locks two tables: one at a time
            run(sql)
        info["keys"] = {"primary": len(pks), "foreign_key_indexes": len(idx), "foreign_keys": len(fks)}
    info["keys_s"] = round(time.perf_counter() - t1, 3)

    t2 = time.perf_counter()

    def vacuum(t: str) -> None:
        with contextlib.closing(connect()) as conn:
            conn.execute(f"VACUUM (FREEZE, ANALYZE) {quote_ident(t)}")

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pg-analyze") as pool:
        list(pool.map(vacuum, order))
    with contextlib.closing(connect()) as conn:
        conn.execute("CHECKPOINT")
    info["analyze_s"] = round(time.perf_counter() - t2, 3)
    return info


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# ---- the cache ------------------------------------------------------------------------------------

def files_identity(ds: Dataset) -> dict[str, list[int]]:
    out = {}
    for t, p in ds.tables.items():
        st = os.stat(p)
        out[t] = [st.st_size, st.st_mtime_ns]
    return out


class Template:
    """Where the loaded copy of one data set lives for one PostgreSQL major (see the module doc)."""

    def __init__(self, ds: Dataset, major: int) -> None:
        self.dataset = ds
        self.major = major
        self.dir = Path(ds.dir) / "postgres" / f"pg{major}"
        self.cached = self._writable(self.dir)

    @staticmethod
    def _writable(d: Path) -> bool:
        try:
            d.mkdir(parents=True, exist_ok=True)
            return os.access(d, os.W_OK)
        except OSError:
            return False

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def ready_path(self) -> Path:
        return self.dir / "ready.json"

    def recipe(self) -> dict:
        return {"format": READY_FORMAT, "major": self.major,
                "keys": self.dataset.keys.to_json() if self.dataset.keys is not None else None,
                "files": files_identity(self.dataset)}

    def ready(self) -> dict | None:
        """What ready.json says, when it describes this data set as it is now (else None)."""
        try:
            doc = json.loads(self.ready_path.read_text())
        except (OSError, ValueError):
            return None
        want = self.recipe()
        if any(doc.get(k) != v for k, v in want.items()) or not (self.data_dir / "PG_VERSION").is_file():
            return None
        return doc

    @contextlib.contextmanager
    def use(self, build: Callable[[], dict]):
        """Yields (ready.json's document, whether it was built now) with the cache held under a shared
        lock (copies may be taken meanwhile); build() loads and stores it first when it is not ready,
        under the exclusive lock (two runs never load the same set at once; the second waits and
        copies)."""
        with open(self.dir / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
            doc, built = self.ready(), False
            if doc is None:
                fcntl.flock(fh, fcntl.LOCK_EX)  # (Linux converts by unlocking first: look again)
                doc = self.ready()
                if doc is None:
                    build()
                    doc, built = self.ready(), True
                    if doc is None:
                        raise TilewiseError(f"the PostgreSQL load of {self.dataset.label} was not stored in {self.dir}")
                fcntl.flock(fh, fcntl.LOCK_SH)
            yield doc, built

    def store(self, built: Path, info: dict) -> None:
        """Put a loaded, cleanly shut-down data directory into the cache (under the exclusive lock)."""
        self.ready_path.unlink(missing_ok=True)
        old = self.dir / "data.old"
        shutil.rmtree(old, ignore_errors=True)
        if self.data_dir.exists():
            os.rename(self.data_dir, old)
        try:
            os.rename(built, self.data_dir)
        except OSError:  # another file system: copy
            shutil.copytree(built, self.data_dir, symlinks=True)
            shutil.rmtree(built, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        atomic_write_json(self.ready_path, {**self.recipe(), "dataset": self.dataset.to_json(), "load": info,
                                            "stored": time.time()})
