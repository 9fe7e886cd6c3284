"""One DuckDB instance: ``python -m tilewise.engines.duckdb.server --socket PATH [--tables FILE]``.

Started by the DuckDB runtime with its plan instance's binding already applied (CPU affinity,
memory policy, LD_PRELOAD allocator): one in-memory database with threads = its CPU count, the
tables loaded with CREATE TABLE AS from the data set's Parquet (so first touch places them in its
local memory), served on a Unix socket by engines/serve.py (protocol, threads: see there).

A query's timed region is execute + fetch (``fetch_answer``, which the plain-DuckDB baseline of
`tilewise bench overhead` calls too): its first SMALL rows as Python tuples, and only when there are
more, the rest as an Arrow table (for the small answers of most TPC-H queries tuples are cheapest,
for large ones Arrow is: Q16 at SF 1 is 18,314 rows). HUGEINT columns are exported losslessly (a
DuckDB extension type) so the rows equal fetchall()'s, ints included.
"""

from __future__ import annotations

import os
import time
import warnings

from tilewise.data import raw
from tilewise.data.sources import TableSource
from tilewise.engines import serve

# fetch_answer takes the rest of a large answer from the executed cursor; DuckDB warns that this
# copies the Arrow buffers once (cheap next to building Python objects): not a user's concern
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)

SMALL = 256  # rows fetched as Python tuples before the rest of an answer is fetched as Arrow


def fetch_answer(cur, sql: str):
    """Execute and fetch the whole answer: (column names, the first rows as tuples, the rest as a
    pyarrow.Table or None). What a server times per query, and what the plain baseline does."""
    cur.execute(sql)
    cols = [d[0] for d in cur.description] if cur.description else []
    if not cols:
        return cols, [], None
    head = cur.fetchmany(SMALL)
    rest = cur.to_arrow_table() if len(head) == SMALL else None
    return cols, head, rest


def connect(threads: int, memory_mb: int | None = None, spill_dir: str | None = None):
    """An in-memory database set up as every instance (and the plain baseline) uses it. Without
    spill_dir, DuckDB spills what does not fit memory_limit into ./.tmp of the working directory."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET arrow_lossless_conversion = true")  # HUGEINT as itself, not as decimal(38,0)
    if memory_mb:
        con.execute(f"SET memory_limit = '{int(memory_mb)}MB'")
    if spill_dir:
        quoted = str(spill_dir).replace("'", "''")
        con.execute(f"SET temp_directory = '{quoted}'")
    return con


def load_tables(con, tables: dict[str, str]) -> None:
    for name, path in tables.items():
        quoted = str(path).replace("'", "''")
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet('{quoted}')")


def attach_tables(con, sources: dict[str, dict]) -> dict[str, str]:
    """A view per table over its files, read per query (tilewise.data.raw.scan_sql: strictly, a bad
    row of a raw file is an error with its line). Replacing a view is one catalog change: a query
    that already bound the old one finishes on it. Returns name -> the layout read now."""
    out = {}
    for name, d in sources.items():
        src = TableSource.from_json(d, name)
        con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {raw.scan_sql(src)}')
        out[name] = src.layout or src.format
    return out


class DuckDB(serve.Handler):
    def __init__(self, threads: int, memory_mb: int | None, workdir: str | None = None) -> None:
        super().__init__(threads, memory_mb)
        self.con = connect(threads, memory_mb, os.path.join(workdir, "spill") if workdir else None)
        self._attached: dict[str, str] = {}

    def load(self, tables: dict[str, str]) -> None:
        load_tables(self.con, tables)

    def attach(self, sources: dict[str, dict]) -> None:
        cur = self.con.cursor()  # its own connection: queries run on theirs meanwhile
        try:
            self._attached.update(attach_tables(cur, sources))
        finally:
            cur.close()

    def attached(self) -> dict[str, str]:
        return dict(self._attached)

    def query(self, sql: str) -> serve.Answer:
        cur = self.con.cursor()  # a cursor per query, made before the clock starts
        try:
            t0 = time.perf_counter()
            cols, head, rest = fetch_answer(cur, sql)
            elapsed = time.perf_counter() - t0
        finally:
            cur.close()
        return serve.Answer(cols, head, elapsed, rest)

    def execute(self, statements: list[str]) -> None:
        """Statements in one transaction, all or nothing (TPC-H RF1/RF2 and their undo)."""
        cur = self.con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            try:
                for stmt in statements:
                    cur.execute(stmt)
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise
        finally:
            cur.close()

    def info(self) -> dict:
        threads, version = self.con.execute("SELECT current_setting('threads'), version()").fetchone()
        return {"threads": int(threads), "version": version}


if __name__ == "__main__":
    serve.run(DuckDB)
