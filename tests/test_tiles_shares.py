"""Which tile owns which part of the data (engines/tiles/shares.py, pure): the refusal of more tiles
than files, and what a worker's log says it read."""

from __future__ import annotations

import pytest

from tilewise.bench import on_layout
from tilewise.engines import splits
from tilewise.engines.tiles import shares
from tilewise.errors import UsageError


def test_a_tile_that_would_own_no_file_is_refused_naming_the_fix():
    shares.check({"lineitem": 8, "nation": 1}, 4)  # 8 files over 4 tiles; a one-file table is cut in ranges
    shares.check({"lineitem": 3}, 2)  # uneven (2 and 1 files), but every tile owns some
    with pytest.raises(UsageError) as e:
        shares.check({"lineitem": 4, "orders": 2, "nation": 1}, 4)
    assert "4 tiles cannot each own a share of table orders: it has 2 files" in str(e.value)
    assert "parquet-4" in e.value.hint and "at most 2 tiles" in e.value.hint
    with pytest.raises(UsageError, match="share of layout parquet-2"):
        shares.check({"parquet-2": 2}, 3, "layout")


def test_the_layouts_file_count_is_known_before_any_data_is_made():
    assert on_layout.files_per_table("parquet-8-rg64k") == 8
    assert on_layout.files_per_table("parquet-2+sorted-l_shipdate") == 2
    assert on_layout.files_per_table("parquet") is None and on_layout.files_per_table("csv") is None


def test_a_workers_log_gives_its_tasks_bytes_and_files():
    log = ("tilewise-tiles worker listening on shm:/x/worker-0.sock\n"
           'tilewise-tiles scan: [["/d/lineitem/part-00000.parquet", -1, -1, 1000], ["/d/nation.parquet", 0, 40, 80]]\n'
           "some other line\n"
           'tilewise-tiles scan: [["/d/lineitem/part-00000.parquet", 0, 500, 1000]]\n'
           'tilewise-tiles scan: [["/d/cut short", 0,\n')  # a worker that died while writing
    d = shares.read_log(log)
    assert d == {"tasks": 2, "input_bytes": 1000 + 40 + 500,
                 "files": {"/d/lineitem/part-00000.parquet", "/d/nation.parquet"}}
    other = shares.read_log('tilewise-tiles scan: [["/d/lineitem/part-00001.parquet", -1, -1, 990], '
                            '["/d/nation.parquet", 40, 80, 80]]\n')
    assert d["files"] & other["files"] == {"/d/nation.parquet"}  # what both read


def test_the_prediction_is_the_coordinators_rule():
    """File k goes to tile k mod N (affinity.rs's routing of task k mod N, task = file k mod N)."""
    files = [{"bytes": 100, "row_groups": [{"offset": 4, "compressed": 96, "rows": 10}]} for _ in range(6)]
    per = splits.per_tile(files, 4, 4, splits.FileAffinity())
    assert [t["files"] for t in per] == [2, 2, 1, 1]


def test_bench_refuses_more_tiles_than_files_before_anything_is_made(tmp_path):
    """4 tiles (a synthetic 4-core machine's wic) over a 2-file layout: one line, nothing made."""
    from conftest import run_cli

    cp = run_cli("bench", "tpch", "--engine", "tiles", "--topology", "synthetic:package:1 core:4 pu:1",
                 "--sf", "0.01", "--data-dir", str(tmp_path / "data"), "--layout", "parquet-2", "--policies", "wic",
                 "--out", str(tmp_path / "out"), env={"TILEWISE_STATE_DIR": str(tmp_path / "state")}, timeout=120)
    if "cannot run here" in cp.stderr:
        pytest.skip(cp.stderr.strip())
    assert cp.returncode == 2 and cp.stderr.count("Error:") == 1, cp.stderr
    assert "4 tiles cannot each own a share of layout parquet-2: it has 2 files" in cp.stderr
    assert "--layout parquet-4" in cp.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()


def test_the_coordinators_per_query_lines_are_summed_per_tile():
    log = ('tilewise-tiles coordinator (Flight SQL) listening on 127.0.0.1:1\n'
           'tilewise-tiles query: {"n":1,"tiles":{},"coordinator":{"tasks":1,"rows_scanned":0,"bytes_in":0,'
           '"messages_in":0,"latency_ns":0,"decode_ns":0}}\n'
           'tilewise-tiles query: {"n":2,"tiles":{"0":{"tasks":3,"rows_scanned":10,"bytes_in":100,"messages_in":2,'
           '"latency_ns":5,"decode_ns":1},"1":{"tasks":3,"rows_scanned":30,"bytes_in":50,"messages_in":1,'
           '"latency_ns":7,"decode_ns":2}},"coordinator":{"tasks":1,"bytes_in":9,"messages_in":1}}\n'
           'tilewise-tiles query: {"n":3,"unmeasured":"the metrics of some tasks did not arrive within 3 s"}\n'
           'tilewise-tiles query: {"n":5,"tiles":{"0":{"rows_scanned":5}},"coordinator":{}}\n'
           'tilewise-tiles query: {"n":4,"tiles":{"0":{"rows_scanned":1000}},"coordinator":{}}\n'
           'tilewise-tiles query: {"n":6,"tiles":{"0":{"rows_sca')  # a line cut short
    got, seen, unmeasured = shares.read_coordinator_log(log, skip={4})
    assert got["0"] == {"rows_scanned": 15, "bytes_in": 100, "messages_in": 2, "latency_ns": 5, "decode_ns": 1}
    assert got["1"]["rows_scanned"] == 30 and got["coordinator"]["bytes_in"] == 9
    assert seen == {1, 2, 3, 4, 5} and unmeasured == {3}  # 4: given up on by tilewise, so not summed


def test_tile_balance_sums_per_tile_and_names_the_most_uneven_query():
    from tilewise.results.kinds.benchmark import tile_balance

    queries = {"q1": [{"tile": 0, "tasks": 1, "rows_scanned": 50}, {"tile": 1, "tasks": 1, "rows_scanned": 50}],
               "q9": [{"tile": 0, "tasks": 2, "rows_scanned": 90, "bytes_in": 7}, {"tile": 1, "tasks": 2, "rows_scanned": 10}]}
    sums, worst, ratio = tile_balance(queries)
    assert sums[0]["rows_scanned"] == 140 and sums[1]["rows_scanned"] == 60 and sums[0]["bytes_in"] == 7
    assert worst == "q9" and ratio == pytest.approx(1.8)
    _, worst, ratio = tile_balance(queries, "bytes_in")
    assert worst == "q9" and ratio == pytest.approx(2.0)
    # a query whose figures never came counts nowhere (its zeros are not a measurement)
    queries["q14a"] = [{"tile": 0, "tasks": 9, "rows_scanned": 0, "unmeasured": 1},
                       {"tile": 1, "tasks": 9, "rows_scanned": 900, "unmeasured": 1}]
    sums, worst, _ = tile_balance(queries)
    assert sums[0]["tasks"] == 3 and sums[1]["rows_scanned"] == 60 and worst == "q9"
