"""One ClickHouse instance: ``python -m tilewise.engines.clickhouse.server --socket PATH [--tables FILE]
[--memory-mb N] --workdir DIR``.

Started by the ClickHouse runtime with its plan instance's binding already applied (CPU affinity,
memory policy, LD_PRELOAD allocator): chdb (ClickHouse in this process) with its database in DIR
(the deployment's private directory: its metadata and any spill files, removed with it), the
tables loaded into ClickHouse's Memory engine from the data set's Parquet (so first touch places
them in the instance's local memory), served on a Unix socket by engines/serve.py.

A data set with a layout or raw tables (Parquet files, CSV, TBL, JSON lines) is read in place
instead: a view per table over its files (files.py), read per query, which `switch` replaces
(cracking). The tables and views live in a database of ClickHouse's Atomic engine (`tilewise`),
where CREATE OR REPLACE VIEW swaps the view in one step: chdb's default database (engine Overlay)
drops the old view before it creates the new one, and queries running meanwhile failed with
"Unknown table expression identifier" (tried: 1595 of 1927 queries in a loop that replaced a view
300 times; none in an Atomic database). A query that already started keeps the files it bound.

Settings (settings come before rewrites; docs/clickhouse.md says what each fixes):
- max_server_memory_usage = --memory-mb (a server setting, given when chdb starts; read back, and a
  size ClickHouse lowers -- it caps it at 90 % of the memory it sees -- is refused, not used);
- per connection: max_threads = the CPUs of its affinity mask; join_use_nulls = 1 (an outer join's
  unmatched columns are NULL, as SQL says, not the type's default: TPC-H Q13's c_count 0 row);
  the others in SESSION_SETTINGS, each with why.

Memory engine, not MergeTree: measured on TPC-H SF 1 here (2 cores, max_threads 2, median of 3), the
22 queries took 10.5 s over Memory tables against 34.5 s over MergeTree (ORDER BY tuple(), the
data compressed: every scan decompresses); MergeTree's smaller RSS (0.6 GB against 2.0 GB) is
its compression, and a server keeps its copy in its own memory either way (docs/clickhouse.md).

Connections: one chdb connection runs one query at a time, so a query takes a connection from a
pool (a new one, set up alike, when all are busy): queries from several client streams run
concurrently, sharing the server's thread pool. A connection whose statement failed is closed, not
reused: chdb 4.4 returns the failed statement's leftover output as the next answer on it. The first
connection (the anchor) stays open for the server's life: it holds ClickHouse (and its tables) up.

Refresh functions: ClickHouse has no multi-statement transactions, and a Memory table is changed by
INSERT and by ALTER TABLE ... DELETE (a mutation, synchronous here) -- not by DELETE FROM. execute()
therefore applies a function's statements with every query of this server held back (a
readers-writer lock: queries see the data before or after the function, never half of it), and
keeps each statement's undo (the rows it deletes or inserts, in a Memory table of their own) until
the function is done: a statement that fails undoes the ones before it, all or nothing.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tilewise.data.raw import RawDataError
from tilewise.data.sources import TableSource
from tilewise.engines import serve
from tilewise.engines.clickhouse import files

SMALL = 256  # rows returned as Python tuples before the rest of an answer goes as Arrow

# Per connection, besides max_threads (the instance's cores); each says why.
SESSION_SETTINGS = {
    "join_use_nulls": 1,  # outer joins fill unmatched columns with NULL (SQL), not 0/'' (TPC-H Q13)
    "aggregate_functions_null_for_empty": 1,  # sum/avg/min/max of no rows is NULL (SQL), not 0 (TPC-H Q17)
    # ROLLUP/CUBE's subtotal rows hold NULL (SQL), not '' or 0 (TPC-DS q5, q27, q36, q67, q77, q80)
    "group_by_use_nulls": 1,
    "union_default_mode": "'DISTINCT'",  # a bare UNION removes duplicates (SQL); ClickHouse refuses it (q49, q75)
    "cast_keep_nullable": 1,  # CAST(NULL AS t) is NULL (SQL), not an error (TPC-DS q61 with drawn parameters)
    "joined_subquery_requires_alias": 0,  # a subquery in FROM may have no alias (SQL allows it; TPC-DS q14a)
    "mutations_sync": 2,  # ALTER ... DELETE returns once applied (the refresh functions)
    "output_format_arrow_string_as_string": 1,  # String columns as Arrow strings, not binary
}

DATABASE = "tilewise"  # Atomic: a view is replaced in one step (the module's notes)
FIX = "fix or remove that row; tilewise never skips or blanks a row it cannot read"

_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)\s+(SELECT\b.*)$", re.I | re.S)
_DELETE = re.compile(r"^\s*DELETE\s+FROM\s+(\w+)\s+WHERE\s+(.*)$", re.I | re.S)


class _RWLock:
    """Many readers (queries) or one writer (a refresh function); a waiting writer goes first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


sql_string = files.sql_string


def parquet_source(path) -> str:
    """A Parquet file as a ClickHouse table expression (the tables load, the refresh sets are read so)."""
    return f"file({sql_string(path)}, Parquet)"


def _memory_error(e: Exception) -> bool:
    return "MEMORY_LIMIT_EXCEEDED" in str(e)


class ClickHouse(serve.Handler):
    concurrent = True  # each query runs on a connection of its own

    def __init__(self, threads: int, memory_mb: int | None, workdir: str | None = None) -> None:
        super().__init__(threads, memory_mb)
        import chdb

        self._chdb = chdb
        where = Path(workdir or ".").resolve() / "chdb"
        if "?" in str(where):  # chdb reads what follows a '?' as settings
            raise serve.Refused(f"chdb cannot keep its database in {where} (a '?' in the path)",
                                "set TILEWISE_CLUSTER_DIR (tilewise up) or TMPDIR (bench) to a directory without one")
        opts = f"?max_server_memory_usage={int(memory_mb) << 20}" if memory_mb else ""
        try:  # the anchor: the first connection starts ClickHouse and stays open while the server lives
            self.anchor = chdb.connect(f"{where}{opts}")
        except Exception as e:  # noqa: BLE001 - ClickHouse's own words are the message
            raise serve.Refused(f"ClickHouse did not start with max_server_memory_usage {memory_mb} MiB: "
                                f"{_first_line(e)}", "check --worker-memory") from None
        self.path = str(where)
        limit = int(_scalar(self.anchor, "SELECT value FROM system.server_settings "
                                         "WHERE name = 'max_server_memory_usage'"))
        if memory_mb and limit < int(memory_mb) << 20:
            raise serve.Refused(f"ClickHouse lowers max_server_memory_usage to {limit >> 20} MiB here (at most 90 % "
                                f"of the memory it sees), so --worker-memory {memory_mb} MiB cannot be kept",
                                f"use --worker-memory {limit >> 20}m or less")
        self.limit_bytes = limit
        self.version = _scalar(self.anchor, "SELECT version()")
        self.anchor.query(f"CREATE DATABASE IF NOT EXISTS {DATABASE} ENGINE = Atomic")
        self._pool: queue.SimpleQueue = queue.SimpleQueue()  # idle connections, set up
        self._connect = threading.Lock()
        self._rw = _RWLock()
        self._undo_seq = 0
        self.discarded = 0  # connections closed after a failed statement
        self._sources: dict[str, TableSource] = {}  # the tables read in place: the copy each view reads

    # ---- connections ----
    @contextmanager
    def _session(self):
        """An idle connection (a new one, set up, when none is idle), back to the pool afterwards. A
        connection whose statement failed is closed instead: chdb 4.4 hands the next answer on it the
        failed one's leftover output ('Invalid flatbuffers message' when read as Arrow)."""
        try:
            con = self._pool.get_nowait()
        except queue.Empty:
            with self._connect:
                con = self._chdb.connect(self.path)
            try:
                con.query(f"USE {DATABASE}")
                con.query(f"SET max_threads = {int(self.threads)}")
                for k, v in SESSION_SETTINGS.items():
                    con.query(f"SET {k} = {v}")
            except BaseException:
                con.close()
                raise
        try:
            yield con
        except BaseException:
            self.discarded += 1
            con.close()
            raise
        self._pool.put(con)

    # ---- serve.Handler ----
    def load(self, tables: dict[str, str]) -> None:
        with self._session() as con:
            for name, path in tables.items():
                try:
                    con.query(f"DROP TABLE IF EXISTS {name} SYNC")
                    con.query(f"CREATE TABLE {name} ENGINE = Memory AS SELECT * FROM {parquet_source(path)}")
                except Exception as e:  # noqa: BLE001
                    if _memory_error(e):
                        raise serve.Refused(
                            f"table {name} does not fit in ClickHouse's memory limit (max_server_memory_usage "
                            f"{self.limit_bytes >> 20} MiB): {_first_line(e)}",
                            f"give it more memory with --worker-memory (its tables are {_parquet_mb(tables)} MiB as "
                            "Parquet and take several times that in memory)") from None
                    raise

    def attach(self, sources: dict[str, dict]) -> None:
        """A view per table over its files (files.py), made on a connection of its own while queries
        run on theirs; replacing one is atomic (DATABASE), so this is also what `switch` does."""
        for name, d in sources.items():
            src = TableSource.from_json(d, name)
            try:
                sql = files.view_sql(name, src)
            except files.Unreadable as e:
                raise serve.Refused(str(e), "move the files to a directory whose path holds none of * ? { }, "
                                    "or use another engine") from None
            with self._session() as con:
                con.query(sql)
            self._sources[name] = src

    def attached(self) -> dict[str, str]:
        return {t: s.layout or s.format for t, s in self._sources.items()}

    def query(self, sql: str) -> serve.Answer:
        try:
            return self._query(sql)
        except Exception as e:  # noqa: BLE001 - a bad row of a file read in place is said with its file and line
            bad = self._bad_row(str(e)) if any(s.text for s in self._sources.values()) else None
            if bad is None:
                raise
            raise bad from None

    def _query(self, sql: str) -> serve.Answer:
        with self._session() as con:
            self._rw.acquire_read()
            try:
                t0 = time.perf_counter()
                table = con.query(sql, "ArrowTable")
                cols = list(table.column_names)
                head = [tuple(r.values()) for r in table.slice(0, SMALL).to_pylist()] if cols else []
                rest = table.slice(SMALL) if table.num_rows > SMALL else None
                elapsed = time.perf_counter() - t0
            finally:
                self._rw.release_read()
        return serve.Answer(cols, head, elapsed, rest)

    def _bad_row(self, text: str) -> RawDataError | None:
        """The file and line of the row a failed query could not read from a text table read in
        place, found by reading that table again (without parallel parsing, so rows are counted
        per file); None when the error is not about such a row."""
        hit = files.marked(text)
        if hit:
            table, column, what = hit
            src = self._sources.get(table)
            if src is None or column not in dict(src.column_types()):
                return None
            try:
                with self._session() as con:
                    rows = con.query(files.bad_value_sql(src, column), "ArrowTable").to_pylist()
            except Exception:  # noqa: BLE001 - the query's own error stands
                return None
            if not rows:
                return RawDataError(f"table {table}: column {column} holds a value that is not {what}", FIX)
            r = rows[0]
            return RawDataError(f"table {table}: {r['_path']} line {files.line(src, r['_row_number'])}: column "
                                f"{column}: {r[column]!r} is not {what}", FIX)
        path, row, reason = files.parse_error(text)
        src = next((s for s in self._sources.values() if s.text and path in s.files), None)
        if src is None:
            return None
        try:
            with self._session() as con:
                con.query(files.reparse_sql(src, path), "ArrowTable")
        except Exception as e:  # noqa: BLE001 - the error we came for, now with the file's own row
            again = files.parse_error(str(e))
            if again[1] is not None:
                row, reason = again[1], again[2]
        where = f" line {files.line(src, row - 1)}" if row else ""
        return RawDataError(f"table {src.table}: {path}{where}: {reason}", FIX)

    def execute(self, statements: list[str]) -> None:
        """The statements as one unit: queries held back meanwhile, all undone when one fails."""
        plans = [_plan(s) for s in statements]  # refuse a statement we cannot undo before changing anything
        with self._session() as con:
            self._rw.acquire_write()
            try:
                self._apply(con, plans)
            finally:
                self._rw.release_write()

    def _apply(self, con, plans: list[tuple[str, str, str]]) -> None:
        done: list[tuple[str, str, str]] = []  # (kind, table, undo table) of the statements applied
        made: list[str] = []  # the undo tables, dropped afterwards
        try:
            for kind, table, body in plans:
                self._undo_seq += 1
                undo = f"_tilewise_undo_{self._undo_seq}"
                made.append(undo)
                if kind == "insert":  # the rows to insert, kept: the undo deletes exactly them
                    con.query(f"CREATE TABLE {undo} ENGINE = Memory AS {body}")
                    done.append((kind, table, undo))  # first: deleting rows that never arrived is harmless
                    con.query(f"INSERT INTO {table} SELECT * FROM {undo}")
                else:  # the rows to delete, kept: the undo inserts them back
                    con.query(f"CREATE TABLE {undo} ENGINE = Memory AS SELECT * FROM {table} WHERE {body}")
                    con.query(f"ALTER TABLE {table} DELETE WHERE {body}")
                    done.append((kind, table, undo))  # after: a Memory table's mutation is applied whole or not at all
        except Exception:
            with self._session() as fresh:  # the failed statement's connection is unusable (see _session)
                _undo(fresh, done)
                _drop(fresh, made)
            raise
        _drop(con, made)

    def info(self) -> dict:
        with self._session() as con:
            threads = int(_scalar(con, "SELECT getSetting('max_threads')"))
        return {"threads": threads, "version": f"ClickHouse {self.version} (chdb {self._chdb.__version__})",
                "max_server_memory_usage_mb": self.limit_bytes >> 20,
                "storage": "views over files (read in place)" if self._sources else "Memory",
                "connections_discarded": self.discarded}


def _scalar(con, sql: str):
    return con.query(sql, "ArrowTable").column(0)[0].as_py()


def _plan(stmt: str) -> tuple[str, str, str]:
    """(kind, table, body) of a statement execute() can apply and undo."""
    m = _INSERT.match(stmt)
    if m:
        return "insert", m.group(1), m.group(2)
    m = _DELETE.match(stmt)
    if m:
        return "delete", m.group(1), m.group(2)
    raise ValueError(f"the ClickHouse server applies INSERT INTO t SELECT ... and DELETE FROM t WHERE ... "
                     f"only (it undoes them when a later statement fails), not: {stmt[:80]}")


def _undo(con, done: list[tuple[str, str, str]]) -> None:
    """Reverse the statements applied so far, last first (their undo tables hold their rows). The undo
    of an INSERT deletes the rows equal to an inserted one in every column."""
    for kind, table, undo in reversed(done):
        if kind == "insert":
            cols = [r["name"] for r in con.query(
                f"SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {sql_string(table)} "
                "ORDER BY position", "ArrowTable").to_pylist()]
            con.query(f"ALTER TABLE {table} DELETE WHERE ({', '.join(cols)}) IN (SELECT * FROM {undo})")
        else:
            con.query(f"INSERT INTO {table} SELECT * FROM {undo}")


def _drop(con, tables: list[str]) -> None:
    for name in tables:
        con.query(f"DROP TABLE IF EXISTS {name} SYNC")


def _first_line(e: Exception) -> str:
    """ClickHouse's message up to the end of its first sentence ("Code: 241. DB::Exception: ...")."""
    text = " ".join(str(e).split())
    start = text.find("DB::Exception: ")
    end = text.find(". ", start) if start >= 0 else -1
    return (text[:end] if end > 0 else text)[:300]


def _parquet_mb(tables: dict[str, str]) -> int:
    return sum(os.path.getsize(p) for p in tables.values() if os.path.exists(p)) >> 20


if __name__ == "__main__":
    serve.run(ClickHouse)
