"""Where one table's rows are: its files, their format and, for text formats, their columns.

A ``TableSource`` is what an engine is told about a table it reads in place: Parquet files (one or
several, self-describing), or raw text files (CSV with or without a header line, TPC-H's TBL with
its pipes and trailing delimiter, newline-delimited JSON) with the columns and their types. Types
are Arrow's names (``int64``, ``decimal128(15, 2)``, ``date32[day]``, ``string``): the one
vocabulary every engine maps to its own SQL types (engines/sqltypes.py), so a table read from CSV
has exactly the types of the same table read from Parquet and answers stay identical.

The classic data set (one ``<table>.parquet`` per table, loaded by the engines) is a source with
one Parquet file; a layout (tilewise.data.layouts) is a source with K Parquet files, and the raw
tables a user drops (tilewise.data.raw) are text sources. Pure data: reading footers is the only
I/O here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import userfiles
from tilewise.errors import TilewiseError

FORMATS = ("parquet", "csv", "tbl", "json")
TEXT_FORMATS = ("csv", "tbl", "json")
# file name endings -> format (the raw tables of a directory are found by these)
EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".tbl": "tbl", ".json": "json", ".jsonl": "json",
              ".ndjson": "json"}
_DECIMAL = re.compile(r"decimal(?:128|256)?\((\d+),\s*(\d+)\)")


def arrow_type(name: str):
    """The pyarrow type an Arrow type name stands for ("decimal128(15, 2)", "date32[day]", "string")."""
    import pyarrow as pa

    m = _DECIMAL.fullmatch(name.strip())
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    try:
        return pa.type_for_alias(name.strip())
    except (ValueError, KeyError):
        raise TilewiseError(f"unknown column type {name!r}",
                            "use an Arrow type name: int64, int32, double, bool, string, date32[day], "
                            "timestamp[us], decimal128(P, S)") from None


def type_name(t) -> str:
    """An Arrow type's name in this vocabulary: string views are plain strings (what a text file holds)."""
    s = str(t)
    return {"string_view": "string", "large_string": "string"}.get(s, s)


@dataclass(frozen=True)
class TableSource:
    table: str
    format: str  # one of FORMATS
    files: tuple[str, ...]  # absolute paths, in the table's row order
    columns: tuple[tuple[str, str], ...] = ()  # (name, Arrow type name); () for Parquet: its footer says
    delimiter: str = ","  # csv/tbl field separator
    header: bool = True  # csv: the first line names the columns
    trailing: bool = False  # tbl: every line ends with the delimiter (TPC-H's dbgen and tpchgen-cli do)
    rows: int | None = None  # when known (a layout's manifest, a footer)
    layout: str = ""  # the layout this copy belongs to ("csv", "parquet-8-sorted-l_shipdate"), for messages
    sort: str | None = None  # the column the rows are sorted on, where they are
    extra: dict = field(default_factory=dict, compare=False)  # per-file facts (row groups, sizes) for reports

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise TilewiseError(f"table {self.table}: unknown format {self.format!r}", f"use one of {', '.join(FORMATS)}")
        if not self.files:
            raise TilewiseError(f"table {self.table} has no files")
        if self.format in TEXT_FORMATS and not self.columns:
            raise TilewiseError(f"table {self.table} ({self.format}) has no column list",
                                "text files need their columns and types (schema.json beside them)")

    # ---- facts ----
    @property
    def text(self) -> bool:
        return self.format in TEXT_FORMATS

    @property
    def bytes(self) -> int:
        return sum(os.stat(f).st_size for f in self.files)

    @property
    def path(self) -> Path:
        """One path naming the table: its file, or the directory holding its files."""
        if len(self.files) == 1:
            return Path(self.files[0])
        parents = {str(Path(f).parent) for f in self.files}
        return Path(os.path.commonpath(list(parents)))

    @property
    def names(self) -> list[str]:
        return [c for c, _ in self.columns] if self.columns else [f.name for f in self.schema()]

    def schema(self):
        """The table's pyarrow schema (Parquet: its first file's footer, string views made plain)."""
        import pyarrow as pa

        if self.columns:
            return pa.schema([(c, arrow_type(t)) for c, t in self.columns])
        import pyarrow.parquet as pq

        s = pq.read_schema(self.files[0])
        return pa.schema([(f.name, arrow_type(type_name(f.type))) for f in s])

    def column_types(self) -> tuple[tuple[str, str], ...]:
        """(name, Arrow type name) for every column, from the list or the Parquet footer."""
        return self.columns or tuple((f.name, type_name(f.type)) for f in self.schema())

    def label(self) -> str:
        n = len(self.files)
        return f"{self.layout or self.format} ({n} file{'s' if n != 1 else ''})"

    def identity(self) -> list[list]:
        """(path, size, mtime_ns) of each file: a copy made from this source records it, and a source
        whose files changed is a new source."""
        out = []
        for f in self.files:
            st = os.stat(f)
            out.append([str(f), st.st_size, st.st_mtime_ns])
        return out

    # ---- JSON (tables.json for servers, cluster state files, manifests) ----
    def to_json(self) -> dict:
        d = {"table": self.table, "format": self.format, "files": [str(f) for f in self.files]}
        if self.columns:
            d["columns"] = [list(c) for c in self.columns]
        if self.format in ("csv", "tbl"):
            d.update({"delimiter": self.delimiter, "header": self.header, "trailing": self.trailing})
        for k in ("rows", "sort"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.layout:
            d["layout"] = self.layout
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict | str, table: str | None = None) -> TableSource:
        """From to_json()'s dict; a plain path string is the classic one-Parquet-file table."""
        if isinstance(d, (str, os.PathLike)):
            return cls(table or Path(d).stem, "parquet", (str(d),))
        try:
            return cls(d.get("table") or table, d["format"], tuple(str(f) for f in d["files"]),
                       tuple((str(c), str(t)) for c, t in d.get("columns") or ()), d.get("delimiter", ","),
                       bool(d.get("header", True)), bool(d.get("trailing", False)), d.get("rows"),
                       d.get("layout", ""), d.get("sort"), dict(d.get("extra") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise TilewiseError(f"a table source record is damaged ({e})") from None


def parquet(table: str, files, *, layout: str = "", sort: str | None = None) -> TableSource:
    """A Parquet source of files (sorted by name, which is their row order), rows from the footers."""
    files = tuple(sorted(str(f) for f in files))
    rows, groups = 0, []
    for f in files:
        md = userfiles.parquet_file(f, f"table {table}:").metadata
        rows += md.num_rows
        groups.append(md.num_row_groups)
    return TableSource(table, "parquet", files, rows=rows, layout=layout, sort=sort,
                       extra={"row_groups": groups, "bytes": [os.stat(f).st_size for f in files]})


def row_groups(source: TableSource) -> list[list[dict]]:
    """Per file, per row group: its rows, compressed bytes and byte offset (Parquet only)."""
    import pyarrow.parquet as pq

    out = []
    for f in source.files:
        md = pq.read_metadata(f)
        groups = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            cols = [rg.column(j) for j in range(rg.num_columns)]
            start = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols)
            groups.append({"rows": rg.num_rows, "bytes": rg.total_byte_size,
                           "compressed": sum(c.total_compressed_size for c in cols),
                           "offset": start})
        out.append(groups)
    return out


def scan_files(source: TableSource) -> list[dict]:
    """What a scan planner sees of a Parquet source: per file its bytes and row groups (offset,
    compressed bytes, rows), for engines.splits."""
    out = []
    for f, groups in zip(source.files, row_groups(source)):
        out.append({"bytes": os.stat(f).st_size,
                    "row_groups": [{"offset": g["offset"], "compressed": g["compressed"], "rows": g["rows"]}
                                   for g in groups]})
    return out
