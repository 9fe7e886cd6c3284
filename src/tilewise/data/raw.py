"""Raw tables as users drop them: a directory of CSV, TBL, JSON or Parquet files, read strictly.

``discover(dir)`` finds the tables of a directory: ``<table>.<ext>`` (one file) or ``<table>/``
(a folder of files of one format, read in name order), ext one of .csv .tbl .json/.jsonl/.ndjson
.parquet. Text files need their columns and types: from ``schema.json`` beside them (tilewise writes
one with every raw set it generates; see ``write_schema``), else inferred: CSV with a header line by
pyarrow from its first MiB (a later value of another type is then an error with its
line when the table is read: list the columns in schema.json), JSON by pyarrow over the whole file
(a key whose values change type is an error naming the line). TBL files carry no names, so they
need schema.json.

Reading is strict: a malformed row (too few or too many fields, a value that does not convert, an
unterminated quote, a JSON value of another type) is a ``RawDataError`` naming the file and the
line, never a row silently dropped or made NULL. ``scan_sql`` is the DuckDB table expression that
reads a source that way; the transformations (tilewise.data.layouts) and the DuckDB engine's
in-place views use it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from tilewise import userfiles
from tilewise.data import Dataset, store
from tilewise.data.sources import EXTENSIONS, TableSource, arrow_type, parquet, type_name
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json

SCHEMA = "schema.json"
SCHEMA_FORMAT = "tilewise-schema/1"
IGNORED = {SCHEMA, "manifest.json"}
TRAILING = "__tilewise_end"  # the empty field after a TBL line's last delimiter
# how scan_sql reads text, recorded with every copy made from text (a copy read otherwise is made again):
# 2 = an unquoted empty field is NULL, a quoted one ("") the empty string, as DuckDB's COPY writes them
# (1 read both as NULL: JCC-H's empty s_comment values came back NULL, and Q2 was wrong)
READER = 2


class RawDataError(TilewiseError):
    """A raw file that does not read as declared: which file, which line, what is wrong."""


# ---- DuckDB's SQL for a source -------------------------------------------------------------------

DUCKDB_TYPES = {
    "int64": "BIGINT", "int32": "INTEGER", "int16": "SMALLINT", "int8": "TINYINT", "uint8": "UTINYINT",
    "uint16": "USMALLINT", "uint32": "UINTEGER", "uint64": "UBIGINT", "double": "DOUBLE", "float": "FLOAT",
    "bool": "BOOLEAN", "date32[day]": "DATE", "string": "VARCHAR", "timestamp[us]": "TIMESTAMP",
    "timestamp[ms]": "TIMESTAMP_MS", "timestamp[s]": "TIMESTAMP_S", "timestamp[ns]": "TIMESTAMP_NS",
    "binary": "BLOB",
}
_DEC = re.compile(r"decimal(?:128|256)?\((\d+),\s*(\d+)\)")


def duckdb_type(t: str) -> str:
    m = _DEC.fullmatch(t)
    if m:
        return f"DECIMAL({m.group(1)},{m.group(2)})"
    try:
        return DUCKDB_TYPES[t]
    except KeyError:
        raise TilewiseError(f"no DuckDB type for column type {t!r}") from None


def _lit(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + str(s).replace('"', '""') + '"'


def scan_sql(src: TableSource) -> str:
    """A DuckDB table expression reading the source strictly (``SELECT * FROM <this>`` gives its
    columns, typed; a bad row raises with its file and line)."""
    files = "[" + ", ".join(_lit(f) for f in src.files) + "]"
    if src.format == "parquet":
        return f"read_parquet({files})"
    cols = list(src.columns)
    if src.format == "json":
        spec = "{" + ", ".join(f"{_lit(c)}: {_lit(duckdb_type(t))}" for c, t in cols) + "}"
        return f"read_json({files}, format='newline_delimited', columns={spec})"
    if src.trailing:
        cols = cols + [(TRAILING, "string")]
    spec = "{" + ", ".join(f"{_lit(c)}: {_lit(duckdb_type(t))}" for c, t in cols) + "}"
    expr = (f"read_csv({files}, delim={_lit(src.delimiter)}, header={'true' if src.header else 'false'}, "
            f"columns={spec}, auto_detect=false, strict_mode=true, quote='\"', escape='\"', nullstr='', "
            "allow_quoted_nulls=false)")
    if src.trailing:  # the empty field after the last delimiter is read and dropped
        names = ", ".join(_ident(c) for c, _ in src.columns)
        return f"(SELECT {names} FROM {expr})"
    return expr


# ---- errors with file and line ---------------------------------------------------------------------

_CSV_LINE = re.compile(r"CSV Error on Line: (\d+)")
_CSV_ORIG = re.compile(r"Original Line: ?(.*)")
_CSV_FILE = re.compile(r"^\s*file = (.+)$", re.M)
_JSON_LINE = re.compile(r'in file "(.+?)", in line (\d+): (.+)')
_ARROW_JSON = re.compile(r"Column\((.*?)\) changed from (\w+) to (\w+) in row (\d+)")


def read_error(exc: BaseException, src: TableSource) -> RawDataError | None:
    """The engine's error about a bad row of src as one line with its file and line; None when the
    error is not about the data (the caller re-raises it)."""
    text = str(exc)
    fix = "fix or remove that row; tilewise never skips or blanks a row it cannot read"
    m = _CSV_LINE.search(text)
    if m:
        fm = _CSV_FILE.search(text)
        where = fm.group(1).strip() if fm else (src.files[0] if len(src.files) == 1 else f"one of {src.path}")
        orig = _CSV_ORIG.search(text)
        reason = _csv_reason(text)
        shown = f": {orig.group(1)[:120]!r}" if orig else ""
        return RawDataError(f"table {src.table}: {where} line {m.group(1)}: {reason}{shown}", fix)
    m = _JSON_LINE.search(text)
    if m:
        return RawDataError(f"table {src.table}: {m.group(1)} line {m.group(2)}: {m.group(3).strip()[:200]}", fix)
    return None


def _csv_reason(text: str) -> str:
    m = re.search(r"Expected Number of Columns: (\d+) Found: (\d+)", text)
    if m:
        return f"expected {m.group(1)} fields, found {m.group(2)}"
    m = re.search(r'Error when converting column "(.+?)"\. (.+?)(?:\n|$)', text)
    if m:
        return f"column {m.group(1)}: {m.group(2).strip()}"
    for line in text.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("Original Line"):
            return line.rstrip(".")
    return "the row does not parse"


# ---- finding the tables of a directory -----------------------------------------------------------

def _format_of(p: Path) -> str | None:
    return EXTENSIONS.get(p.suffix.lower())


def _regular_or_refused(p: Path) -> None:
    """A name that looks like a table but is no regular file or folder is named, never skipped: a
    dangling symbolic link, a link loop, a FIFO, a socket, a device."""
    if _format_of(p) is None and not p.is_symlink():
        return
    try:
        st = p.stat()
    except OSError as e:
        what = ("a symbolic link loop" if e.errno == errno.ELOOP else
                f"a dangling symbolic link (to {os.readlink(p)})" if p.is_symlink() else e.strerror)
        raise UsageError(f"{p} is {what}", "point it at a table file, or remove it") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise UsageError(f"{p} is {kind}, not a table file", "give a regular .csv/.tbl/.json/.parquet file")


def _candidates(d: Path) -> dict[str, tuple[str, list[Path]]]:
    """table -> (format, files) for every table file or table folder directly in d."""
    out: dict[str, tuple[str, list[Path]]] = {}
    for p in sorted(d.iterdir()):
        if p.name.startswith((".", "_")) or p.name in IGNORED:
            continue
        _regular_or_refused(p)
        if p.is_file():
            fmt = _format_of(p)
            if fmt is None:
                continue
            name = p.name[: -len(p.suffix)]
            if name in out:
                raise UsageError(f"table {name} is in {d} twice ({out[name][1][0].name} and {p.name})",
                                 "keep one file or folder per table")
            out[name] = (fmt, [p])
        elif p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and _format_of(f) and not f.name.startswith((".", "_")))
            if not files:
                continue
            fmts = {_format_of(f) for f in files}
            if len(fmts) > 1:
                raise UsageError(f"table folder {p} mixes formats ({', '.join(sorted(fmts))})",
                                 "keep one format per table")
            if p.name in out:
                raise UsageError(f"table {p.name} is in {d} twice", "keep one file or folder per table")
            out[p.name] = (fmts.pop(), files)
    return out


def read_schema(d: Path) -> dict:
    """schema.json of a raw directory ({} when there is none); a damaged one is an error."""
    p = Path(d) / SCHEMA
    if not p.exists() and not p.is_symlink():
        return {}
    doc = userfiles.read_json(p, "the schema", "fix it or remove it to infer the columns")
    if not isinstance(doc, dict) or doc.get("format") != SCHEMA_FORMAT or not isinstance(doc.get("tables"), dict):
        raise UsageError(f"{p} is not a tilewise schema ({SCHEMA_FORMAT})",
                         'write {"format": "tilewise-schema/1", "tables": {"t": {"columns": [["a", "int64"], ...]}}}')
    return doc["tables"]


def write_schema(d: Path, sources: dict[str, TableSource]) -> Path:
    """schema.json for raw text sources (what discover() reads back)."""
    tables = {}
    for t, s in sources.items():
        entry = {"format": s.format, "columns": [list(c) for c in s.column_types()]}
        if s.format in ("csv", "tbl"):
            entry.update({"delimiter": s.delimiter, "header": s.header, "trailing": s.trailing})
        tables[t] = entry
    return atomic_write_json(Path(d) / SCHEMA, {"format": SCHEMA_FORMAT, "tables": tables})


def discover(d: str | Path, *, tables: tuple[str, ...] | None = None) -> dict[str, TableSource]:
    """Every table of the raw directory d as a TableSource (columns from schema.json or inferred)."""
    d = Path(d)
    if not d.is_dir():
        raise UsageError(f"{d} is not a directory", "give --data a folder of .csv/.tbl/.json/.parquet tables")
    found = _candidates(d)
    if tables is not None:
        missing = [t for t in tables if t not in found]
        if missing:
            raise UsageError(f"{d} has no table {missing[0]}",
                             f"expected {missing[0]}.csv/.tbl/.json/.parquet or a folder {missing[0]}/")
        found = {t: found[t] for t in tables}
    if not found:
        raise UsageError(f"{d} holds no table", "put one <table>.csv/.tbl/.json/.parquet (or a folder of them) per table")
    declared = read_schema(d)
    out = {}
    for t, (fmt, files) in found.items():
        out[t] = _source(t, fmt, [p.resolve() for p in files], declared.get(t))
    return out


def dataset(d: str | Path):
    """A directory of raw tables as a Dataset whose engines read them in place (no benchmark, no
    scale factor: its label is the directory's name)."""
    srcs = discover(d)
    path = Path(d).resolve()
    fmts = sorted({s.format for s in srcs.values()})
    return Dataset.at(path, benchmark="data", title=path.name, table_names=tuple(srcs)).with_sources(
        srcs, layout=",".join(fmts))


def _source(t: str, fmt: str, files: list[Path], decl: dict | None) -> TableSource:
    names = tuple(str(f) for f in files)
    if fmt == "parquet":
        return parquet(t, names, layout="parquet")
    src = _text_source(t, fmt, names, decl)
    seen: set[str] = set()
    for c, _ in src.columns:  # engines bind columns by name: a name given twice cannot be queried
        if c.lower() in seen:
            where = f"{SCHEMA} beside it" if decl else f"the header of {names[0]}"
            raise UsageError(f"table {t}: column {c!r} is named twice in {where}", "give every column its own name")
        seen.add(c.lower())
    return src


def _text_source(t: str, fmt: str, names: tuple[str, ...], decl: dict | None) -> TableSource:
    if decl:
        try:
            cols = tuple((str(c), str(ty)) for c, ty in decl["columns"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"schema.json: table {t} has no valid column list",
                             'give "columns": [["name", "int64"], ...]') from None
        src = TableSource(t, fmt, names, cols, decl.get("delimiter", "|" if fmt == "tbl" else ","),
                          bool(decl.get("header", fmt == "csv")), bool(decl.get("trailing", fmt == "tbl")),
                          layout=fmt)
        for _, ty in cols:
            arrow_type(ty)  # an unknown type is an error now, not at the first query
        return src
    if fmt == "tbl":
        raise UsageError(f"table {t}: TBL files carry no column names and {SCHEMA} does not list them",
                         f"add {SCHEMA} beside the files (tilewise data layout writes one for the sets it makes)")
    if fmt == "csv":
        return _infer_csv(t, names)
    return _infer_json(t, names)


def _sniff(path: str) -> tuple[str, bool]:
    """(delimiter, has a header line) from the first lines of a CSV file (Python's csv.Sniffer on
    whole lines only: a malformed row further down cannot fool it)."""
    import csv

    with open(path, newline="", errors="replace") as f:
        head = f.read(1 << 16)
    lines = head.splitlines(keepends=True)
    sample = "".join(lines[:50] if len(head) < (1 << 16) else lines[:-1][:50])
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",|;\t")
        delim = dialect.delimiter
    except csv.Error:
        delim = ","
    # a first line whose fields are all names (none empty, none a number) is a header, as a CSV table's
    # first line must be. csv.Sniffer.has_header votes by column types and lengths: "a,b" over "1,x"
    # is a tie it calls no header, and it decides nothing on one column or rows of uneven length
    first = next(csv.reader([lines[0]], delimiter=delim), []) if lines else []
    header = bool(first) and all(f.strip() and not _is_number(f) for f in first)
    return delim, header


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _infer_csv(t: str, files: tuple[str, ...]) -> TableSource:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    delim, header = _sniff(files[0])
    with open(files[0], errors="replace") as f:
        lines = [ln for _, ln in zip(range(2), (x for x in f if x.strip()))]
    if header and len(lines) < 2:
        raise UsageError(f"table {t}: {files[0]} has a header line but no rows",
                         "add rows, or leave the table out")
    if not header:
        raise UsageError(f"table {t}: {files[0]} has no header line naming its columns",
                         f"add a header line, or list the columns in {SCHEMA}")
    try:  # the first block's types (a malformed row further down is found, with its line, when read)
        with pcsv.open_csv(files[0], read_options=pcsv.ReadOptions(block_size=1 << 20),
                           parse_options=pcsv.ParseOptions(delimiter=delim,
                                                           invalid_row_handler=lambda row: "skip")) as reader:
            schema = reader.schema
    except (pa.ArrowInvalid, OSError) as e:
        raise RawDataError(f"table {t}: {files[0]} does not read as CSV: {' '.join(str(e).split())[:200]}",
                           f"check its first lines, or list the columns in {SCHEMA}") from None
    cols = tuple((f.name, _plain(t, f)) for f in schema)
    return TableSource(t, "csv", files, cols, delim, True, False, layout="csv")


def _infer_json(t: str, files: tuple[str, ...]) -> TableSource:
    import pyarrow as pa
    import pyarrow.json as pj

    schema = None
    for f in files:
        try:
            s = pj.read_json(f).schema
        except pa.ArrowInvalid as e:
            m = _ARROW_JSON.search(str(e))
            if m:
                raise RawDataError(f"table {t}: {f} line {int(m.group(4)) + 1}: key {m.group(1).lstrip('/')!r} "
                                   f"holds a {m.group(3)} here and a {m.group(2)} before",
                                   "give every row the same type per key (or list the columns in schema.json)") from None
            raise RawDataError(f"table {t}: {f} does not read as newline-delimited JSON: {e}") from None
        if schema is None:
            schema = s
        elif s != schema:
            raise RawDataError(f"table {t}: {f} has other keys or types than {files[0]}",
                               "give every file of a table the same keys and types")
    cols = tuple((f.name, _plain(t, f)) for f in schema)
    return TableSource(t, "json", files, cols, layout="json")


def _plain(t: str, f) -> str:
    """A field's type name, refusing nested values (lists, objects) a flat table cannot hold."""
    import pyarrow as pa

    if pa.types.is_nested(f.type):
        raise RawDataError(f"table {t}: column {f.name} holds nested values ({f.type})",
                           "flatten it first; layouts handle flat tables")
    if pa.types.is_null(f.type):
        return "string"  # only NULLs seen: text is the type that holds anything
    return type_name(f.type)


# ---- raw sets: a benchmark's tables as text, cached like its Parquet ------------------------------

RAW_FORMAT = "tilewise-raw/1"
WRITABLE = ("csv", "tbl")  # what tilewise writes raw sets as


def set_valid(d: Path) -> bool:
    """True when d holds a complete raw set: manifest, schema.json and every file at its size."""
    try:
        man = json.loads((Path(d) / "manifest.json").read_text())
        if man.get("format") != RAW_FORMAT:
            return False
        for name, size in man["files"].items():
            if (Path(d) / name).stat().st_size != size:
                return False
        return (Path(d) / SCHEMA).exists()
    except Exception:  # anything unreadable: make it again
        return False


def finish_set(d: Path, fmt: str, generator: str, sources: dict[str, TableSource], **extra) -> None:
    """Write schema.json and the manifest of a raw set built in d (the files are there)."""
    write_schema(d, sources)
    files = {str(Path(f).relative_to(d)): os.stat(f).st_size for s in sources.values() for f in s.files}
    atomic_write_json(d / "manifest.json", {"format": RAW_FORMAT, "raw_format": fmt, "generator": generator,
                                            "files": files, **extra})


def ensure_set(target: Path, fmt: str, build: Callable[[Path], None], *, what: str, log=None) -> Path:
    """A raw set at target, built by build(tmp) (which calls finish_set) when missing or invalid."""
    if fmt not in WRITABLE:
        raise UsageError(f"tilewise writes raw sets as {' or '.join(WRITABLE)}, not {fmt}", "use --raw csv or --raw tbl")
    return store.ensure_dir(Path(target), set_valid, build, what=what, log=log)


def from_parquet(tables: dict[str, Path], fmt: str, out: Path) -> dict[str, TableSource]:
    """Write Parquet tables as raw text into out (csv: header, commas; tbl: pipes, no header), each
    table one file; returns their sources (columns from the Parquet footers, types kept)."""
    import duckdb

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    srcs = {}
    try:
        for t, p in tables.items():
            ps = parquet(t, [p])
            f = out / f"{t}.{fmt}"
            delim, header = ("|", False) if fmt == "tbl" else (",", True)
            con.execute(f"COPY (SELECT * FROM read_parquet({_lit(str(p))})) TO {_lit(str(f))} "
                        f"(FORMAT csv, DELIMITER {_lit(delim)}, HEADER {'true' if header else 'false'})")
            srcs[t] = TableSource(t, fmt, (str(f),), ps.column_types(), delim, header, False, layout=fmt)
    finally:
        con.close()
    return srcs
