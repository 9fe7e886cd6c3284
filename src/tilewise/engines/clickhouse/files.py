"""How a ClickHouse server reads a table in place: a view over its files, read per query with
ClickHouse's ``file()`` table function (a data set with a layout or raw tables, and what cracking
switches). Pure functions from a TableSource (tilewise.data.sources) to ClickHouse's SQL; the
server (server.py) runs them.

- **Parquet**: ``SELECT * FROM file('<dir>/{part-00000.parquet,...}', Parquet)``; the columns and
  their types are the footer's, as ClickHouse infers them (a required field is not Nullable),
  which is also what a loaded Memory table gets.
- **CSV, TBL, JSON lines**: every field is read as text (``Nullable(String)``), then converted to
  the source's column type (its Arrow name, data/sources.py) by the view, strictly: ClickHouse's
  own text parser accepts values it cannot represent without a word (measured, ClickHouse 26.9: a
  date 2020-13-45 becomes 1900-01-01, 2020-02-30 becomes 2020-03-01, an integer past Int64 wraps
  round, 1.257 read as Decimal(15, 2) is 1.25), so each converted column is checked, and a value
  that does not convert exactly stops the query with ``MARK`` in its message; the server then
  finds the file and line (``bad_value_sql``). An unquoted empty field is NULL and a quoted one
  (``""``) an empty string, as DuckDB's reader reads them (data/raw.py: scan_sql) and as DuckDB's
  COPY writes them (JCC-H's s_comment holds empty strings): a table's answers are the same from
  either engine, and from the Parquet copy DuckDB makes of it (cracking). The columns of text are
  Nullable (a text file cannot say a field is never empty; ClickHouse's own CSV schema inference
  says the same).
- ClickHouse's CSV settings are set per view, each against a default that would change the data:
  ``input_format_csv_trim_whitespaces = 0`` (its default trims the spaces ending TPC-H comments:
  "ly final dependencies: slyly bold " lost its last character, measured),
  ``input_format_csv_detect_header = 0`` (no guessing whether a first line is a header),
  ``format_csv_allow_single_quotes = 0``, ``format_csv_null_representation = ''`` (``\\N`` is text,
  as in DuckDB), and no variable number of columns, default on bad values or tolerated errors.

A table's files are named to ``file()`` as one glob over their directory (``dir/{a,b,c}``):
ClickHouse reads them in parallel. Paths holding a glob's characters (``* ? { }``, and ``,`` in a
file name of several) and tables whose files are in several directories cannot be named that way
and are refused (``Unreadable``); tilewise's own layouts and raw folders are one directory each.
"""

from __future__ import annotations

import os
import re

from tilewise.data.sources import TableSource

MARK = "tilewise: table "  # begins the message of a value a view refuses to convert
TRAILING = "__tilewise_end"  # the empty field after a TBL line's last delimiter
FORMATS = {"parquet": "Parquet", "csv": "CSV", "tbl": "CSV", "json": "JSONEachRow"}
_GLOB = re.compile(r"[*?{}]")
_DEC = re.compile(r"decimal(?:128|256)?\((\d+),\s*(\d+)\)")
_INTS = {"int64": "Int64", "int32": "Int32", "int16": "Int16", "int8": "Int8", "uint64": "UInt64",
         "uint32": "UInt32", "uint16": "UInt16", "uint8": "UInt8"}
_TIMESTAMPS = {"timestamp[s]": 0, "timestamp[ms]": 3, "timestamp[us]": 6, "timestamp[ns]": 9}


class Unreadable(Exception):
    """A source ClickHouse's file() cannot name: the message says which path and why."""


def sql_string(s) -> str:
    """A ClickHouse string literal."""
    return "'" + str(s).replace("\\", "\\\\").replace("'", "\\'") + "'"


def ident(s: str) -> str:
    return "`" + str(s).replace("\\", "\\\\").replace("`", "\\`") + "`"


def glob(src: TableSource) -> str:
    """The one path naming every file of the source for file(): the file, or dir/{a,b,...}."""
    dirs = {os.path.dirname(f) for f in src.files}
    if len(dirs) > 1:
        raise Unreadable(f"table {src.table}: its files are in {len(dirs)} directories; ClickHouse reads a table's "
                         "files from one")
    d = dirs.pop()
    names = [os.path.basename(f) for f in src.files]
    bad = [p for p in [d, *names] if _GLOB.search(p)] or [n for n in names if "," in n and len(names) > 1]
    if bad:
        raise Unreadable(f"table {src.table}: ClickHouse's file() reads {bad[0]!r} as a pattern (it holds one of "
                         "* ? { } or, among several files, a comma)")
    if len(names) == 1:
        return src.files[0]
    return f"{d}/{{{','.join(names)}}}"


# ---- text: read as strings, converted strictly ---------------------------------------------------

def conversion(column: str, arrow: str) -> tuple[str, str, str] | None:
    """(value, check, what) for a text column of Arrow type `arrow` read as Nullable(String) `column`
    (an identifier): value converts it (NULL where it does not convert), check is true where it
    converted exactly, what names the type for messages; None: the text is the value (strings)."""
    c = column
    if arrow in _INTS or arrow in ("double", "float", "bool"):
        t = _INTS.get(arrow) or {"double": "Float64", "float": "Float32", "bool": "Bool"}[arrow]
        v = f"accurateCastOrNull({c}, '{t}')"
        return v, f"isNotNull({v})", f"{'an' if t[0] in 'AEIOU' else 'a'} {t}"
    m = _DEC.fullmatch(arrow)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        v = f"accurateCastOrNull({c}, 'Decimal({p}, {s})')"
        # the same integer digits and 38 - p more decimals: equal only when nothing was cut off
        wide = f"accurateCastOrNull({c}, 'Decimal(38, {s + 38 - p})')"
        return v, f"isNotNull({v}) AND {v} = {wide}", f"a Decimal({p}, {s}) (at most {s} decimals)"
    if arrow == "date32[day]":
        v = f"toDate32OrNull({c})"
        return v, f"isNotNull({v}) AND toString({v}) = {c}", "a date (YYYY-MM-DD, 1900-01-01 to 2299-12-31)"
    if arrow in _TIMESTAMPS:
        v = f"parseDateTime64BestEffortOrNull({c}, {_TIMESTAMPS[arrow]})"
        return v, f"isNotNull({v})", "a timestamp"
    if arrow in ("string", "binary", "large_string", "string_view"):
        return None
    raise Unreadable(f"no ClickHouse type for column type {arrow!r}")


def _columns(src: TableSource) -> list[tuple[str, str]]:
    cols = list(src.column_types())
    return cols + [(TRAILING, "string")] if src.trailing else cols


def structure(src: TableSource) -> str:
    """file()'s structure for a text source: every column as Nullable(String)."""
    return ", ".join(f"{ident(c)} Nullable(String)" for c, _ in _columns(src))


def settings(src: TableSource) -> dict[str, object]:
    """The reader's settings for the source (see the module's notes: each keeps a value as written)."""
    if src.format == "json":
        return {"input_format_json_read_numbers_as_strings": 1, "input_format_json_read_bools_as_strings": 1,
                "input_format_json_read_objects_as_strings": 1, "input_format_json_read_arrays_as_strings": 1,
                "input_format_skip_unknown_fields": 1, "input_format_allow_errors_num": 0,
                "input_format_allow_errors_ratio": 0, "short_circuit_function_evaluation": "'enable'"}
    return {"format_csv_delimiter": sql_string(src.delimiter), "input_format_csv_skip_first_lines": int(src.header),
            "input_format_csv_detect_header": 0, "input_format_csv_trim_whitespaces": 0,
            "format_csv_allow_single_quotes": 0, "format_csv_allow_double_quotes": 1,
            "format_csv_null_representation": "''", "input_format_csv_empty_as_default": 1,
            "input_format_csv_allow_variable_number_of_columns": 0, "input_format_csv_use_default_on_bad_values": 0,
            "input_format_csv_skip_trailing_empty_lines": 1, "input_format_allow_errors_num": 0,
            "input_format_allow_errors_ratio": 0, "short_circuit_function_evaluation": "'enable'"}


def _settings_sql(d: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in d.items())


def source_sql(src: TableSource) -> str:
    """file(...) reading every file of the source (text: every field as Nullable(String))."""
    fmt = FORMATS[src.format]
    if src.format == "parquet":
        return f"file({sql_string(glob(src))}, {fmt})"
    return f"file({sql_string(glob(src))}, {fmt}, {sql_string(structure(src))})"


def message(src: TableSource, column: str, what: str) -> str:
    return f"{MARK}{src.table} column {column}: a value that is not {what}"


def select_sql(src: TableSource) -> str:
    """SELECT of the table's columns, typed, from its files (what the view holds)."""
    if src.format == "parquet":
        return f"SELECT * FROM {source_sql(src)}"
    exprs = []
    for c, t in src.column_types():
        raw = ident(c)
        conv = conversion(raw, t)
        if conv is None:
            exprs.append(raw)
            continue
        value, ok, what = conv
        # the value, with a check that throws on a row whose text did not convert exactly
        guard = f"throwIf(isNotNull({raw}) AND NOT ifNull({ok}, 0), {sql_string(message(src, c, what))})"
        exprs.append(f"tupleElement(({value}, {guard}), 1) AS {raw}")
    return f"SELECT {', '.join(exprs)} FROM {source_sql(src)} SETTINGS {_settings_sql(settings(src))}"


def view_sql(name: str, src: TableSource) -> str:
    """The view serving table `name` from the source's files; replacing it is atomic in an Atomic
    database (a query that already started keeps the view it bound)."""
    return f"CREATE OR REPLACE VIEW {ident(name)} AS {select_sql(src)}"


# ---- finding a bad row -----------------------------------------------------------------------------

_MARKED = re.compile(re.escape(MARK) + r"(.+?) column (.+?): a value that is not (.+?)(?::|\.|$)", re.M)
_AT_ROW = re.compile(r"\(at row (\d+)\)")
_IN_FILE = re.compile(r"\(in file/uri (.+?)\)")


def marked(text: str) -> tuple[str, str, str] | None:
    """(table, column, what) of a view's refusal (MARK) in an error message, else None."""
    m = _MARKED.search(text)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def bad_value_sql(src: TableSource, column: str) -> str:
    """The first row of the source whose `column` does not convert: (file, 0-based data row, text);
    read without parallel parsing, so the row number is the file's own."""
    raw = ident(column)
    t = dict(src.column_types())[column]
    _, ok, _ = conversion(raw, t)
    return (f"SELECT _path, _row_number, {raw} FROM {source_sql(src)} WHERE isNotNull({raw}) AND NOT ifNull({ok}, 0) "
            f"LIMIT 1 SETTINGS {_settings_sql(settings(src))}, input_format_parallel_parsing = 0")


def reparse_sql(src: TableSource, path: str) -> str:
    """Read one file of the source without parallel parsing: its parse error names the file's own row."""
    one = TableSource(src.table, src.format, (path,), src.columns, src.delimiter, src.header, src.trailing)
    every = " + ".join(f"length({ident(c)})" for c, _ in _columns(one))  # every field parsed
    return (f"SELECT sum({every}) FROM {source_sql(one)} "
            f"SETTINGS {_settings_sql(settings(one))}, input_format_parallel_parsing = 0")


def line(src: TableSource, row: int) -> int:
    """The line of a 0-based data row (the header is line 1 where there is one)."""
    return row + 1 + (1 if src.format in ("csv", "tbl") and src.header else 0)


def parse_error(text: str) -> tuple[str | None, int | None, str]:
    """(file, 1-based data row, reason) of ClickHouse's text parser's error message."""
    flat = " ".join(text.split())
    f = _IN_FILE.search(flat)
    r = _AT_ROW.search(flat)
    if "less columns than expected" in flat or "expected ',' before: '\\n'" in flat:
        reason = "too few fields"
    elif "Expected end of line" in flat:
        reason = "too many fields"
    elif "Unexpected end of stream" in flat or "at end of stream" in flat:
        reason = "the row ends in the middle of a value (an unterminated quote or object?)"
    else:
        start = flat.find("DB::Exception: ")
        reason = flat[start + 15 if start >= 0 else 0:].split(": (at row")[0][:200]
    return (f.group(1) if f else None), (int(r.group(1)) if r else None), reason
