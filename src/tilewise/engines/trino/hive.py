"""Trino's view of a tilewise data set: the Hive connector over our own Parquet files, no copy.

The Hive connector runs with a file metastore on Trino's native local file system
(``local.location=/``, so ``local:///abs/path`` is the path itself). Per data set (Dataset.dir):

    <Dataset.dir>/trino/tables/<table>/<table>.parquet   a hard link to <Dataset.dir>/<table>.parquet
    <Dataset.dir>/trino/metastore/                         the file metastore: schema, tables, statistics
    <Dataset.dir>/trino/ready.json                         what was prepared, for which files

Why hard links: an external table location must be a directory, and tpchgen-cli writes one file
per table (a layout's table, tilewise.data.layouts, is K files: each is linked, numbered). Trino's local file system lists a symbolic link with the link's own size, so a symlinked
file reads as a malformed Parquet file; a hard link is the file itself (same inode: no data copy)
and lives on the same file system by construction. Living inside the data set's directory, all of
it is replaced when the data set is regenerated, so statistics never outlive their data.

Statistics: ANALYZE runs once per data set (under a lock, so two clusters never prepare the same
set at once) and is cached in the metastore; ready.json records the data files' identity (inode,
size, mtime) and a data set whose files changed is prepared again. A data set in a read-only
directory is prepared in a per-cluster directory instead (statistics are then gathered each time).

A schema per data set: ``tpch_sf1``, ``tpch_sf0_01``, ``jcch_sf1_s7`` (benchmark, scale factor, seed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from tilewise.data import Dataset
from tilewise.engines import sqltypes
from tilewise.errors import TilewiseError
from tilewise.fsutil import atomic_write_json

CATALOG = "hive"
READY_FORMAT = "tilewise-trino-warehouse/1"


def schema_name(ds: Dataset) -> str:
    """tpch_sf1, tpch_sf0_01, jcch_sf1_s42: lower-case letters, digits and underscores."""
    name = f"{ds.benchmark}_sf{ds.sf:g}" + (f"_s{ds.seed}" if ds.seed is not None else "")
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


TYPES = sqltypes.TypeNames({
    "int64": "bigint", "int32": "integer", "int16": "smallint", "int8": "tinyint", "double": "double", "float": "real",
    "bool": "boolean", "date32[day]": "date", "string": "varchar", "large_string": "varchar", "string_view": "varchar",
}, "decimal")


def trino_type(t) -> str:
    """A pyarrow type -> the Trino SQL type that reads it from Parquet."""
    st = sqltypes.sql_type(t, TYPES)
    if st is None:
        raise TilewiseError(f"no Trino type for Parquet column type {t}")
    return st


def parquet_columns(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    return [(f.name, trino_type(f.type)) for f in pq.read_schema(path)]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def local_uri(path: Path) -> str:
    """An absolute path as a native-local-file-system location (local.location=/)."""
    return "local://" + str(Path(path).resolve())


def table_ddl(schema: str, table: str, columns: list[tuple[str, str]], location: Path) -> str:
    cols = ", ".join(f"{quote_ident(c)} {t}" for c, t in columns)
    loc = local_uri(location).replace("'", "''")
    return (f"CREATE TABLE {CATALOG}.{quote_ident(schema)}.{quote_ident(table)} ({cols}) "
            f"WITH (external_location = '{loc}', format = 'PARQUET')")


def catalog_properties(metastore_dir: Path) -> dict[str, str]:
    """hive.properties: file metastore in metastore_dir, native local file system over the whole tree."""
    return {
        "connector.name": "hive",
        "hive.metastore": "file",
        "hive.metastore.catalog.dir": local_uri(metastore_dir),
        "fs.native-local.enabled": "true",
        "local.location": "/",
        # external tables over files tilewise owns: never written, never dropped with their data
        "hive.non-managed-table-writes-enabled": "false",
    }


def files_identity(ds: Dataset) -> dict[str, list]:
    out = {}
    for t, src in ds.table_sources().items():
        ids = []
        for f in src.files:
            st = os.stat(f)
            ids.append([st.st_ino, st.st_size, st.st_mtime_ns])
        out[t] = ids[0] if len(ids) == 1 else ids
    return out


def link_name(i: int, path: str, n: int) -> str:
    """A table's i-th file's name in its table folder: itself for a one-file table, else numbered
    (a layout's files are part-00000.parquet ..., but two folders could hold the same names)."""
    name = os.path.basename(path)
    return name if n == 1 else f"{i:05d}-{name}"


class Warehouse:
    """Where Trino's metadata for one data set lives (see the module doc)."""

    def __init__(self, ds: Dataset, fallback_dir: Path | None = None) -> None:
        self.dataset = ds
        self.schema = schema_name(ds)
        self.dir = Path(ds.dir) / "trino"
        self.cached = True
        if not self._writable(self.dir) and fallback_dir is not None:
            self.dir = Path(fallback_dir) / "warehouse"
            self.cached = False

    @staticmethod
    def _writable(d: Path) -> bool:
        try:
            d.mkdir(parents=True, exist_ok=True)
            return os.access(d, os.W_OK)
        except OSError:
            return False

    @property
    def metastore(self) -> Path:
        return self.dir / "metastore"

    @property
    def tables_dir(self) -> Path:
        return self.dir / "tables"

    @property
    def ready_path(self) -> Path:
        return self.dir / "ready.json"

    def is_ready(self, trino_version: str) -> bool:
        try:
            doc = json.loads(self.ready_path.read_text())
            return (doc.get("format") == READY_FORMAT and doc.get("schema") == self.schema
                    and doc.get("trino") == trino_version and doc.get("files") == files_identity(self.dataset)
                    and (self.metastore / self.schema).is_dir())
        except (OSError, ValueError):
            return False

    @contextlib.contextmanager
    def locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def link_tables(self) -> dict[str, Path]:
        """<tables>/<t>/ holding hard links to the table's files (same inodes, no copy): <t>.parquet
        for the generator's one file per table, the numbered files of a layout's table."""
        out = {}
        for t, source in self.dataset.table_sources().items():
            d = self.tables_dir / t
            d.mkdir(parents=True, exist_ok=True)
            want = {link_name(i, f, len(source.files)): Path(f) for i, f in enumerate(source.files)}
            for stale in d.iterdir():  # only our links may be there
                if stale.name not in want:
                    stale.unlink()
            for name, src in want.items():
                dst = d / name
                if dst.exists() and os.path.samefile(dst, src):
                    continue
                tmp = d / f".{name}.tmp"
                tmp.unlink(missing_ok=True)
                try:
                    os.link(src, tmp)
                except OSError as e:
                    raise TilewiseError(f"cannot hard-link {src} into {d}: {e.strerror}",
                                        "Trino reads the data set through hard links in <data dir>/trino; keep the "
                                        "data on a writable file system (or pass --data-dir)") from None
                os.replace(tmp, dst)
            out[t] = d
        return out

    def prepare(self, run_sql: Callable[[str], list], trino_version: str, *, log=None) -> dict:
        """Create the schema and external tables and gather statistics, once per data set."""
        with self.locked():
            if self.is_ready(trino_version):
                return {"schema": self.schema, "prepared": False, "cached": self.cached}
            if log:
                log(f"preparing {self.dataset.label} for Trino: schema {CATALOG}.{self.schema}, "
                    "statistics (ANALYZE, once per data set)")
            self.ready_path.unlink(missing_ok=True)
            dirs = self.link_tables()
            # a stale or half-made schema: the file metastore is just files (the data are not touched)
            shutil.rmtree(self.metastore / self.schema, ignore_errors=True)
            (self.metastore / f".{self.schema}.trinoSchema").unlink(missing_ok=True)
            run_sql(f"CREATE SCHEMA {CATALOG}.{quote_ident(self.schema)}")
            srcs = self.dataset.table_sources()
            for t, d in dirs.items():
                run_sql(table_ddl(self.schema, t, parquet_columns(Path(srcs[t].files[0])), d))
            for t in dirs:
                run_sql(f"ANALYZE {CATALOG}.{quote_ident(self.schema)}.{quote_ident(t)}")
            atomic_write_json(self.ready_path, {"format": READY_FORMAT, "schema": self.schema, "trino": trino_version,
                                                "dataset": self.dataset.to_json(),
                                                "files": files_identity(self.dataset)})
            return {"schema": self.schema, "prepared": True, "cached": self.cached}
