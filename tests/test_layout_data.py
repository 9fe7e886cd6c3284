"""Raw tables and layout transformations (tilewise.data.raw, tilewise.data.layouts): names, strict
reading with file and line, copies built whole or not at all, checked, reused, swept after a crash,
and a full disk that leaves nothing half-written."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tilewise.data import layouts as L
from tilewise.data import raw
from tilewise.errors import TilewiseError, UsageError


def _csv(d: Path, name: str = "t", rows: int = 1000, extra: str = "") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.csv"
    lines = ["id,day,price,label"] + [f"{i},1996-0{1 + i % 9}-1{i % 10},{i % 97}.{i % 100:02d},x{i % 7}"
                                      for i in range(rows)]
    p.write_text("\n".join(lines) + "\n" + extra)
    return p


# ---- names (pure) ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["csv", "tbl", "parquet-1", "parquet-8", "parquet-8-rg64k", "parquet-16-rg1m",
                                  "parquet-8-sorted-l_shipdate", "parquet-8+sorted-l_shipdate",
                                  "parquet-2-rg100000-sorted-o_orderdate"])
def test_layout_names_say_what_they_are_and_read_back(name):
    spec = L.parse(name)
    assert spec.name == name
    if "+" in name:
        assert spec.copies == 2 and spec.copy(True).sort is None and spec.sorted_copy().sort == "l_shipdate"
    elif "sorted" in name:
        assert spec.copy(True).sort == spec.sort and spec.copy(False).sort is None


@pytest.mark.parametrize("name, msg", [("parquet-0", "out of range"), ("parquet-8-rg10", "too small"),
                                       ("orc-4", "unknown layout"), ("", "unknown layout"),
                                       ("parquet-8-sorted-", "unknown layout")])
def test_bad_layout_names_are_one_line_errors(name, msg):
    with pytest.raises(UsageError, match=msg):
        L.parse(name)


def test_an_as_is_layout_must_be_the_sources_format():
    assert L.parse("csv", source_format="csv").raw
    with pytest.raises(UsageError, match="writes Parquet layouts only"):
        L.parse("tbl", source_format="csv")


# ---- raw tables ------------------------------------------------------------------------------

def test_discover_infers_csv_and_json_and_reads_schema_json_for_tbl(tmp_path):
    _csv(tmp_path)
    (tmp_path / "j.json").write_text('{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n')
    (tmp_path / "parts").mkdir()
    for i in range(2):
        (tmp_path / "parts" / f"p{i}.tbl").write_text(f"{i}|a{i}|\n{i + 10}|b{i}|\n")
    with pytest.raises(UsageError, match="TBL files carry no column names"):
        raw.discover(tmp_path)
    (tmp_path / "schema.json").write_text(json.dumps({"format": "tilewise-schema/1", "tables": {
        "parts": {"format": "tbl", "columns": [["k", "int64"], ["v", "string"]]}}}))
    srcs = raw.discover(tmp_path)
    assert set(srcs) == {"t", "j", "parts"}
    assert srcs["t"].columns == (("id", "int64"), ("day", "date32[day]"), ("price", "double"), ("label", "string"))
    assert srcs["j"].columns == (("a", "int64"), ("b", "string"))
    assert len(srcs["parts"].files) == 2 and srcs["parts"].trailing and srcs["parts"].delimiter == "|"
    made = L.Store(tmp_path / "out").ensure(srcs["parts"], L.CopySpec(1))
    assert made.source.rows == 4


def test_a_malformed_csv_row_is_an_error_naming_file_and_line_and_nothing_is_written(tmp_path):
    src = raw.discover(tmp_path / "d" if _csv(tmp_path / "d", extra="1000,1996-01-01,3.5\n") else None)["t"]
    store = L.Store(tmp_path / "out")
    with pytest.raises(raw.RawDataError, match=r"t\.csv line 1002: expected 4 fields, found 3.*never skips"):
        store.ensure(src, L.CopySpec(2))
    assert not (tmp_path / "out" / "t" / "parquet-2").exists()
    assert [p.name for p in (tmp_path / "out" / "t").iterdir()] == []  # no temporary left, and no lock file (it goes with the build)


def test_a_value_that_does_not_convert_names_its_line_and_column(tmp_path):
    _csv(tmp_path / "d", rows=50, extra="50,not-a-date,1.0,x\n")
    (tmp_path / "d" / "schema.json").write_text(json.dumps({"format": "tilewise-schema/1", "tables": {"t": {
        "format": "csv", "columns": [["id", "int64"], ["day", "date32[day]"], ["price", "decimal128(15, 2)"],
                                     ["label", "string"]]}}}))
    src = raw.discover(tmp_path / "d")["t"]
    with pytest.raises(raw.RawDataError, match=r"line 52: column day"):
        L.Store(tmp_path / "out").ensure(src, L.CopySpec(1))


def test_json_whose_types_change_is_an_error_with_the_line(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "j.json").write_text('{"a": 1}\n{"a": 2}\n{"a": "three"}\n')
    with pytest.raises(raw.RawDataError, match=r"j\.json line 3: key 'a' holds a string here and a number before"):
        raw.discover(d)
    # declared types: the transformation catches it, with the line too
    (d / "schema.json").write_text(json.dumps({"format": "tilewise-schema/1", "tables": {
        "j": {"format": "json", "columns": [["a", "int64"]]}}}))
    with pytest.raises(raw.RawDataError, match=r"j\.json line 3"):
        L.Store(tmp_path / "out").ensure(raw.discover(d)["j"], L.CopySpec(1))


# ---- copies -----------------------------------------------------------------------------------

def test_a_copy_is_made_once_checked_reused_and_remade_when_its_source_changes(tmp_path):
    p = _csv(tmp_path / "d", rows=5000)
    src = raw.discover(tmp_path / "d")["t"]
    store = L.Store(tmp_path / "out")
    a = store.ensure(src, L.CopySpec(3, 2048, "price"))
    assert a.built and a.source.rows == 5000 and len(a.source.files) == 3
    assert [sum(1 for _ in range(g)) for g in a.source.extra["row_groups"]] == a.source.extra["row_groups"]
    import duckdb

    days = duckdb.sql(f"SELECT price FROM read_parquet({list(a.source.files)})").fetchall()
    assert days == sorted(days)  # sorted across the files: they hold contiguous ranges in order
    assert a.manifest["cost"]["bytes_written"] == sum(os.path.getsize(f) for f in a.source.files)
    b = store.ensure(src, L.CopySpec(3, 2048, "price"))
    assert not b.built and b.source.files == a.source.files
    Path(a.source.files[1]).write_bytes(b"PAR1 broken")  # a damaged copy is never read: it is made again
    assert store.lookup(src, L.CopySpec(3, 2048, "price")) is None
    assert store.ensure(src, L.CopySpec(3, 2048, "price")).built
    p.write_text(p.read_text() + "5000,1996-01-01,1.0,y\n")  # the source changed: a new copy
    src2 = raw.discover(tmp_path / "d")["t"]
    assert store.lookup(src2, L.CopySpec(3, 2048, "price")) is None
    assert store.ensure(src2, L.CopySpec(3, 2048, "price")).source.rows == 5001


def test_a_quoted_empty_field_is_an_empty_string_and_copies_read_otherwise_are_made_again(tmp_path):
    """DuckDB's COPY writes '' as "" and NULL as nothing (JCC-H's s_comment holds ''): read back the same."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "t.csv").write_text('id,label\n1,""\n2,\n3,x\n')
    src = raw.discover(d)["t"]
    import duckdb

    assert duckdb.sql(f"SELECT * FROM {raw.scan_sql(src)}").fetchall() == [(1, ""), (2, None), (3, "x")]
    store = L.Store(tmp_path / "out")
    made = store.ensure(src, L.CopySpec(1))
    assert duckdb.sql(f"SELECT * FROM read_parquet({list(made.source.files)})").fetchall() == [(1, ""), (2, None), (3, "x")]
    man_path = Path(made.source.files[0]).parent / L.TABLE_MANIFEST
    man = json.loads(man_path.read_text())
    del man["source"]["reader"]  # made by a reader that read "" as NULL
    man_path.write_text(json.dumps(man))
    assert store.lookup(src, L.CopySpec(1)) is None and store.ensure(src, L.CopySpec(1)).built


def test_a_sort_column_that_does_not_exist_is_refused_naming_close_ones(tmp_path):
    _csv(tmp_path / "d")
    srcs = raw.discover(tmp_path / "d")
    with pytest.raises(UsageError, match=r"no table has a column 'prices'.*price"):
        L.Store(tmp_path / "out").realize(srcs, L.parse("parquet-2-sorted-prices"))
    assert not (tmp_path / "out").exists()


def test_what_a_killed_builder_left_is_swept_by_the_next(tmp_path):
    _csv(tmp_path / "d")
    src = raw.discover(tmp_path / "d")["t"]
    left = tmp_path / "out" / "t" / ".parquet-2.tmp-killed"
    left.mkdir(parents=True)
    (left / "part-00000.parquet").write_bytes(b"half")
    logs = []
    L.Store(tmp_path / "out").ensure(src, L.CopySpec(2), L.Hooks(log=logs.append))
    assert not left.exists() and any("did not finish" in m for m in logs)


def test_a_full_disk_midway_leaves_nothing_half_written(tmp_path):
    _csv(tmp_path / "d", rows=3000)
    src = raw.discover(tmp_path / "d")["t"]

    def full(i, path):
        if i == 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.raises(TilewiseError, match="out of disk space .* the partial copy was removed"):
        L.Store(tmp_path / "out").ensure(src, L.CopySpec(4), L.Hooks(after_file=full))
    assert [p.name for p in (tmp_path / "out" / "t").iterdir()] == []  # nothing, not even the lock file


def test_a_copy_whose_rows_differ_from_the_sources_is_never_kept(tmp_path):
    """The check of a copy: the rows read back must carry the source rows' fingerprint. A file that
    changes under the writer (here: rewritten without its last row) fails it."""
    import pyarrow.parquet as pq

    _csv(tmp_path / "d", rows=2000)
    src = raw.discover(tmp_path / "d")["t"]

    def tamper(i, path):
        t = pq.read_table(path)
        pq.write_table(t.slice(0, t.num_rows - 1), path)

    with pytest.raises(TilewiseError, match="does not hold the source's rows"):
        L.Store(tmp_path / "out").ensure(src, L.CopySpec(2), L.Hooks(after_file=tamper))
    assert [p.name for p in (tmp_path / "out" / "t").iterdir()] == []  # nothing, not even the lock file


@pytest.mark.root
def test_a_real_full_file_system_leaves_nothing_half_written(tmp_path):
    _csv(tmp_path / "d", rows=60000)
    src = raw.discover(tmp_path / "d")["t"]
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(TilewiseError, match="disk space"):
            L.Store(mnt).ensure(src, L.CopySpec(8))
        assert [p.name for p in (mnt / "t").iterdir()] == []  # nothing, not even the lock file
    finally:
        subprocess.run(["umount", str(mnt)])


def test_raw_and_parquet_read_the_same_rows(tmp_path):
    """A table read from CSV, TBL and Parquet gives the same rows (types from one vocabulary)."""
    import duckdb

    _csv(tmp_path / "d", rows=300)
    csv = raw.discover(tmp_path / "d")["t"]
    srcs = raw.from_parquet({"t": Path(L.Store(tmp_path / "o").ensure(csv, L.CopySpec(1)).source.files[0])}, "tbl",
                            tmp_path / "tb")
    raw.finish_set(tmp_path / "tb", "tbl", "test", srcs)
    assert raw.set_valid(tmp_path / "tb")
    tbl = raw.discover(tmp_path / "tb")["t"]
    got = [sorted(duckdb.sql(f"SELECT * FROM {raw.scan_sql(s)}").fetchall()) for s in (csv, tbl)]
    assert got[0] == got[1] and len(got[0]) == 300


# ---- what a user names: messages that say what is wrong (issue 31, class 4) --------------------------

def test_a_one_column_csv_is_read_and_a_header_without_rows_is_named(tmp_path):
    (tmp_path / "t.csv").write_text("a\n1\n2\n")
    src = raw.discover(tmp_path)["t"]
    assert src.header and src.column_types() == (("a", "int64"),)
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(UsageError, match="has a header line but no rows"):
        raw.discover(tmp_path)


@pytest.mark.parametrize("make, what", [
    (lambda p: p.symlink_to(p.parent / "nowhere.csv"), "a dangling symbolic link"),
    (lambda p: p.symlink_to(p), "a symbolic link loop"),
    (lambda p: os.mkfifo(p), "a FIFO, not a table file"),
])
def test_a_table_name_that_is_no_regular_file_is_named(tmp_path, make, what):
    make(tmp_path / "t.csv")
    with pytest.raises(UsageError, match=what):
        raw.discover(tmp_path)


def test_a_short_row_is_named_by_its_line_not_called_a_missing_header(tmp_path):
    from conftest import run_cli

    d = tmp_path / "d"
    d.mkdir()
    (d / "t.csv").write_text("a,b\n1,2\n3\n")
    assert raw.discover(d)["t"].header  # the header is there
    (tmp_path / "q.sql").write_text("select count(*) from t;\n")
    cp = run_cli("data", "layout", "--data", str(d), "--sql", str(tmp_path / "q.sql"), "--runs", "1", timeout=120)
    assert cp.returncode != 0 and "line 3: expected 2 fields, found 1" in cp.stderr, cp.stderr
    assert "header" not in cp.stderr and cp.stderr.count("Error:") == 1


def test_an_empty_sysfs_source_and_a_layout_store_name_their_own_option(tmp_path):
    from tilewise import topology
    from tilewise.data import store

    with pytest.raises(UsageError, match="sysfs: names no directory"):
        topology.load("sysfs:")
    with pytest.raises(UsageError, match="pass --layout-dir DIR"):
        with store.locked(Path("/proc/nope/t/x"), "--layout-dir"):
            pass
