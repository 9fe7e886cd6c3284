"""ClickHouse reading tables in place (engines/clickhouse/files.py: a view per table over its files):
`bench tpch --layout tbl` with every answer valid; raw text read strictly, a bad row named by file
and line (ClickHouse's own parser would turn a 13th month into 1900-01-01 and wrap an integer
past Int64 without a word); empty fields read as DuckDB reads them; paths file() would take for a
pattern refused before anything runs. The switch-over under a query loop is tests/test_cracking.py
(parametrized over the engines that switch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli, tagged
from tilewise import engines
from tilewise.data import raw
from tilewise.data.sources import TableSource
from tilewise.engines.clickhouse import files

SERVER = "tilewise.engines.clickhouse.server"
COLS = (("a", "int64"), ("d", "date32[day]"), ("s", "string"), ("m", "decimal128(15, 2)"))


@pytest.fixture(scope="module", autouse=True)
def chdb_installed():
    why = engines.missing("clickhouse")
    if why:
        pytest.fail(f"the ClickHouse tests need chdb ({why})")


def _servers(tag: str):
    return [p for p in tagged("TILEWISE_TEST_TAG", tag) if SERVER in " ".join(p.cmdline())]


# ---- without a server ------------------------------------------------------------------------------

def test_a_view_reads_every_file_of_a_table_as_text_then_converts_it_strictly():
    src = TableSource("lineitem", "tbl", ("/d/lineitem/a.tbl", "/d/lineitem/b.tbl"), COLS, "|", False, True)
    sql = files.view_sql("lineitem", src)
    assert "file('/d/lineitem/{a.tbl,b.tbl}', CSV, '`a` Nullable(String), `d` Nullable(String), `s` " \
           "Nullable(String), `m` Nullable(String), `__tilewise_end` Nullable(String)')" in sql  # the trailing '|'
    assert "__tilewise_end` AS" not in sql and "`s`, tupleElement" in sql  # dropped; a string is its text
    for setting in ("format_csv_delimiter = '|'", "input_format_csv_trim_whitespaces = 0",
                    "input_format_csv_skip_first_lines = 0", "input_format_csv_detect_header = 0"):
        assert setting in sql
    assert "Decimal(38, 25)" in sql  # 1.257 must not become 1.25: compared with the value at 23 more decimals
    pq = TableSource("orders", "parquet", ("/d/o/part-00000.parquet",))
    assert files.view_sql("orders", pq) == "CREATE OR REPLACE VIEW `orders` AS SELECT * FROM file('/d/o/part-00000.parquet', Parquet)"


@pytest.mark.parametrize("paths, why", [
    (("/d/a*/t.csv",), "'/d/a\\*'"), (("/d/{x}.csv",), "'{x}.csv'"), (("/d/a,b.csv", "/d/c.csv"), "'a,b.csv'"),
    (("/d/x/t.csv", "/d/y/t.csv"), "2 directories")])
def test_paths_file_would_read_as_a_pattern_are_refused(paths, why):
    with pytest.raises(files.Unreadable, match=why):
        files.glob(TableSource("t", "csv", paths, COLS))


def test_parse_errors_are_read_for_file_row_and_reason():
    text = ("Code: 27. DB::Exception: Cannot parse input: expected ',' before: '\\n': (at row 3) : Row 2: ... "
            "It's like your file has less columns than expected. : (in file/uri /x/t.csv): While executing File.")
    assert files.parse_error(text) == ("/x/t.csv", 3, "too few fields")
    assert files.marked("DB::Exception: tilewise: table t column d: a value that is not a date (YYYY-MM-DD): while") \
        == ("t", "d", "a date (YYYY-MM-DD)")


# ---- a server on raw tables ---------------------------------------------------------------------

def _raw(d: Path, tables: dict[str, str]) -> Path:
    """A raw directory of CSV tables (name -> rows after the header) with the columns COLS."""
    d.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        (d / f"{name}.csv").write_text("a,d,s,m\n" + rows)
    raw.write_schema(d, {n: TableSource(n, "csv", (str(d / f"{n}.csv"),), COLS) for n in tables})
    return d


def test_raw_text_reads_as_duckdb_reads_it_and_a_bad_row_is_named_by_file_and_line(tmp_path, state_env):
    import duckdb

    good = "1,2020-01-01,x,1.25\n2,,,\n3,2020-02-29,\"\",2\n4,2020-01-03,\\N,3.10\n5,2020-01-04, sp ,0\n"
    d = _raw(tmp_path / "drop", {"t": good, "baddate": "1,2020-01-01,x,1.25\n2,2020-01-02,y,1\n3,2020-13-45,z,1\n",
                                 "wide": "1,2020-01-01,x,1.25\n99999999999999999999,2020-01-01,x,1\n",
                                 "digits": "1,2020-01-01,x,1.257\n", "few": "1,2020-01-01,x,1.25\n2,2020-01-01,x\n"})
    env = dict(state_env, TILEWISE_TEST_TAG=str(tmp_path))
    cp = run_cli("up", "--engine", "clickhouse", "--policy", "wim", "--data", str(d), "--name", "raw", env=env)
    assert cp.returncode == 0, cp.stderr
    try:
        cp = run_cli("query", "--name", "raw", "--json", "SELECT * FROM t ORDER BY a", env=env)
        assert cp.returncode == 0, cp.stderr
        got = [tuple(r) for r in json.loads(cp.stdout)["rows"]]
        src = raw.discover(d, tables=("t",))["t"]
        want = duckdb.connect().execute(f"SELECT * FROM {raw.scan_sql(src)} ORDER BY a").fetchall()
        assert len(got) == len(want) == 5
        assert [(r[0], r[2]) for r in got] == [(r[0], r[2]) for r in want] == \
            [(1, "x"), (2, None), (3, ""), (4, "\\N"), (5, " sp ")]  # "" is '' and empty NULL; spaces kept
        assert [str(r[1]) if r[1] else None for r in got] == [str(r[1]) if r[1] else None for r in want]
        num = [None if r[3] is None else float(r[3]) for r in got]
        assert num == [None if r[3] is None else float(r[3]) for r in want] == [1.25, None, 2.0, 3.1, 0.0]
        fix = "fix or remove that row"
        for table, says in (("baddate", "baddate.csv line 4: column d: '2020-13-45' is not a date"),
                            ("wide", "wide.csv line 3: column a: '99999999999999999999' is not an Int64"),
                            ("digits", "digits.csv line 2: column m: '1.257' is not a Decimal(15, 2)"),
                            ("few", "few.csv line 3: too few fields")):
            cp = run_cli("query", "--name", "raw", f"SELECT sum(a), max(d), max(m) FROM {table}", env=env)
            assert cp.returncode != 0 and says in cp.stderr and fix in cp.stderr, cp.stderr
            assert len(cp.stderr.strip().splitlines()) == 1 and cp.stderr.startswith("Error: ")
        cp = run_cli("query", "--name", "raw", "SELECT count(*) FROM t", env=env)  # the server answers after them
        assert cp.returncode == 0 and "5" in cp.stdout
    finally:
        assert run_cli("down", "--name", "raw", env=env).returncode == 0
    assert not _servers(str(tmp_path))


def test_a_table_whose_path_file_would_read_as_a_pattern_is_refused_and_nothing_runs(tmp_path, state_env):
    d = _raw(tmp_path / "drop{1}", {"t": "1,2020-01-01,x,1.25\n"})
    env = dict(state_env, TILEWISE_TEST_TAG=str(tmp_path))
    cp = run_cli("up", "--engine", "clickhouse", "--policy", "wim", "--data", str(d), "--name", "pat", env=env)
    assert cp.returncode == 2 and [ln.startswith("Error: ") for ln in cp.stderr.splitlines()].count(True) == 1
    assert "reads" in cp.stderr and "as a pattern" in cp.stderr and "move the files" in cp.stderr, cp.stderr
    assert not _servers(str(tmp_path))
    assert run_cli("status", "--name", "pat", env=env).returncode != 0  # nothing recorded


def test_bench_tpch_on_tbl_read_in_place_every_answer_valid(tmp_path, tmp_path_factory):
    data_root = tmp_path_factory.mktemp("tpch-data")
    cp = run_cli("bench", "tpch", "--engine", "clickhouse", "--sf", "0.01", "--policies", "wim", "--runs", "1",
                 "--tests", "power", "--layout", "tbl", "--no-plots", "--out", str(tmp_path / "res"),
                 "--data-dir", str(data_root), "--json", timeout=300, env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["layout"]["name"] == "tbl" and doc["layout"]["tables"]["lineitem"]["format"] == "tbl"
    assert doc["refresh"]["applied"] is False and "read in place" in doc["refresh"]["reason"]
    pol = doc["policies"]["wim"]
    assert sorted(pol["queries"], key=lambda q: int(q[1:])) == [f"q{n}" for n in range(1, 23)]
    assert all(rec["valid"] is True for rec in pol["queries"].values()), \
        {q: rec.get("detail") or rec.get("error") for q, rec in pol["queries"].items() if rec["valid"] is not True}
    assert not _servers(str(tmp_path))
