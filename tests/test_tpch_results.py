"""TPC-H results: summary, CSV, table rendering (no engine involved)."""

from __future__ import annotations

import io

import pytest

from tilewise.bench import harness
from tilewise.errors import UsageError
from tilewise.results import model, report, stats
from tilewise.results.output import Writer


def _doc():
    def q(times, valid=True):
        return {"times_s": times, "rows": 1, "valid": valid, **stats.query_stats(times)}

    return {
        "format": model.FORMAT, "version": model.VERSION, "kind": "benchmark", "meta": {"command": "tilewise bench tpch"},
        "interrupted": False, "complete": True, "environment": {}, "metrics": [], "warnings": [],
        "params": {"engine": "duckdb", "sf": 0.01, "streams": 1, "runs": 2},
        "policies": {
            "wim": {"policy": "wim", "instances": [{"cpus": [0, 1], "mem_nodes": [0]}], "run_wall_s": [3.0, 5.0],
                    "queries": {"q1": q([2.0, 2.0]), "q6": q([1.0, 1.0])}, "complete": True},
            "wic": {"policy": "wic", "instances": [{"cpus": [0], "mem_nodes": [0]}, {"cpus": [1], "mem_nodes": [0]}],
                    "run_wall_s": [2.0, 2.0], "queries": {"q1": q([1.0, 1.0]), "q6": q([0.25, 0.25], valid=False)},
                    "complete": True},
        },
    }


def test_summary_baseline_is_first_policy():
    s = report.prepare(_doc())["summary"]
    assert s["wim"]["total_s"] == 4.0 and s["wim"]["geomean_speedup_vs_baseline"] == pytest.approx(1.0)
    assert s["wic"]["geomean_speedup_vs_baseline"] == pytest.approx((2.0 * 4.0) ** 0.5)
    assert s["wic"]["throughput_speedup_vs_baseline"] == pytest.approx(2.0)
    assert s["wim"]["valid"] is True and s["wic"]["valid"] is False
    assert s["wim"]["runs"] == 2 and s["wim"]["total_ci95_s"][0] <= 4.0 <= s["wim"]["total_ci95_s"][1]


def test_writer_files_and_metrics(tmp_path):
    w = Writer(tmp_path / "out", plots=False)
    w.write(_doc())
    back = model.load(tmp_path / "out")
    assert back["summary"]["wic"]["total_s"] == 2.0
    names = [m["name"] for m in back["metrics"]]
    assert names == ["wim/q1", "wim/q6", "wim/run_wall", "wic/q1", "wic/q6", "wic/run_wall"]
    rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 2 and rows[1].startswith("wim,q1,1,2.000000")


def test_table_marks_wrong_answers():
    from rich.console import Console

    buf = io.StringIO()
    doc = _doc()
    report.prepare(doc)
    report.render(doc, Console(file=buf, width=150, no_color=True))
    text = buf.getvalue()
    assert "WRONG" in text and "wim" in text and "4.000" in text


def test_one_run_has_no_stdev_and_no_interval():
    s = stats.query_stats([1.5])
    assert s["n"] == 1 and s["stdev_s"] is None and s["ci95_s"] is None and s["median_s"] == 1.5


def test_policy_list_parsing():
    assert harness.parse_policies("wim, wic,n=4") == [("wim", "wim", None), ("wic", "wic", None), ("n=4", "n", 4)]
    for bad in ("", "wim,wim", "n=x"):
        with pytest.raises(UsageError):
            harness.parse_policies(bad)
