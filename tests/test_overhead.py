"""`tilewise bench overhead`: its statistics (pure functions) and the command end to end at SF 0.01
(the worker path and the plain baseline it compares are tested in test_duckdb_worker.py)."""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli
from tilewise import plan, topology
from tilewise.bench import overhead as ov
from tilewise.results import stats
from tilewise.benchmarks.tpch import data as tpch_data


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-data")
    tpch_data.ensure_data(0.01, root)
    return root


# ---- statistics ------------------------------------------------------------------------------

def test_abba_and_seeded_random_schedules():
    assert ov.schedule(4, "abba") == [("plain", "tilewise"), ("tilewise", "plain")] * 2
    r = ov.schedule(20, "random", seed=3)
    assert r == ov.schedule(20, "random", seed=3) and all(sorted(x) == ["plain", "tilewise"] for x in r)
    assert len(set(r)) == 2  # both orders occur
    with pytest.raises(Exception, match="unknown order"):
        ov.schedule(2, "sideways")


def test_ratio_interval_is_a_t_interval_on_log_ratios():
    plain = [2.0, 2.2, 1.8, 2.1]
    tw = [2.04, 2.31, 1.836, 2.121]  # ratios 1.02, 1.05, 1.02, 1.01
    r = stats.paired_ratio_ci(plain, tw)
    logs = [math.log(t / p) for p, t in zip(plain, tw)]
    m, sd = sum(logs) / 4, (sum((x - sum(logs) / 4) ** 2 for x in logs) / 3) ** 0.5
    half = 3.182 * sd / 2  # t(0.975, 3) = 3.182, sqrt(4) = 2
    assert r["n"] == 4 and r["ratio"] == pytest.approx(math.exp(m))
    assert r["ci95"] == pytest.approx([math.exp(m - half), math.exp(m + half)])
    assert r["ratios"] == pytest.approx([1.02, 1.05, 1.02, 1.01])


@pytest.mark.parametrize("ci, goal, want", [
    ([0.99, 1.03], 0.05, "shown met"),
    ([1.06, 1.09], 0.05, "shown missed"),
    ([1.01, 1.07], 0.05, "not decided"),
    ([1.01, 1.03], 0.02, "not decided"),
    ([0.97, 1.019], 0.02, "shown met"),
    (None, 0.05, "not decided"),
])
def test_verdict(ci, goal, want):
    assert ov.verdict(ci, goal) == want


def test_summary_per_query_differences_and_time_outside_queries():
    def side(q1, q6, walls):
        return ov.pass_figures({"q1": q1, "q6": q6}, walls)

    rounds = [{"plain": side([1.0, 1.0], [0.5, 0.5], [1.52, 1.54]), "tilewise": side([1.0, 1.01], [0.51, 0.5], [1.55, 1.56])},
              {"plain": side([1.1, 1.0], [0.5, 0.6], [1.62, 1.61]), "tilewise": side([1.1, 1.0], [0.52, 0.6], [1.65, 1.64])},
              {"tilewise": side([1.0, 1.0], [0.5, 0.5], [1.5, 1.5])}]  # an unfinished round is left out
    s = ov.summarise(rounds)
    assert s["rounds"] == 2
    assert rounds[0]["plain"]["outside_queries_s"] == pytest.approx([0.02, 0.04])
    assert s["queries"]["q6"]["diff_ms"]["mean"] == pytest.approx(((0.505 - 0.5) + (0.56 - 0.55)) / 2 * 1e3)
    # outside the queries, per run: wall - sum of query times; a pass's figure is the median over runs
    # round 0: plain [0.02, 0.04] -> 0.03, tilewise [0.04, 0.05] -> 0.045; round 1: 0.015 and 0.035
    assert s["outside_queries_ms"]["diff"]["mean"] == pytest.approx(((0.045 - 0.03) + (0.035 - 0.015)) / 2 * 1e3)
    assert s["ratio"]["ratios"] == pytest.approx([1.555 / 1.53, 1.645 / 1.615])
    assert s["goal"]["verdict"] in ("shown met", "not decided")


# ---- end to end --------------------------------------------------------------------------------

def test_bench_overhead_end_to_end(data_root, tmp_path):
    out = tmp_path / "ov"
    cp = run_cli("bench", "overhead", "--sf", "0.01", "--rounds", "2", "--runs", "1", "--queries", "6,1",
                 "--data-dir", str(data_root), "--out", str(out), "--json", timeout=600)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["kind"] == "overhead" and doc["complete"] and doc["params"]["rounds"] == 2
    assert [r["order"] for r in doc["rounds"]] == [["plain", "tilewise"], ["tilewise", "plain"]]
    for r in doc["rounds"]:
        assert r["plain"]["threads"] == r["tilewise"]["threads"] == len(plan.plan(topology.load(None), "wim").instances[0].cpus)
        assert set(r["plain"]["query_median_s"]) == set(r["tilewise"]["query_median_s"]) == {"q1", "q6"}
    s = doc["summary"]
    assert s["rounds"] == 2 and len(s["ratio"]["ratios"]) == 2 and s["ratio"]["ci95"]
    assert s["goal"]["verdict"] in ("shown met", "shown missed", "not decided")
    assert json.loads((out / "results.json").read_text())["summary"] == s
    sql = json.loads((out / "queries.json").read_text())
    assert sorted(q["query"] for q in sql) == [1, 6]
    text = run_cli("bench", "overhead", "--sf", "0.01", "--rounds", "2", "--runs", "1", "--queries", "6",
                   "--data-dir", str(data_root), "--out", str(tmp_path / "ov2"), timeout=600)
    assert text.returncode == 0, text.stderr
    assert "tilewise / plain =" in text.stdout and "goal <= 1.05:" in text.stdout and "95 % CI" in text.stdout


@pytest.mark.parametrize("args, message", [
    (["--rounds", "1"], "'--rounds' / '-k': '1' is out of range: it must be >= 2"),
    (["--runs", "0"], "'--runs' / '-r': '0' is out of range: it must be >= 1"),
    (["--timeout", "nan"], "'--timeout': 'nan' is not a finite number"),
    (["--sf", "0"], "scale factor must be > 0"),
    (["--tilewise-src", "/nonexistent"], "holds no tilewise package"),
    (["--queries", "23"], "no TPC-H query 23"),
])
def test_bench_overhead_bad_input(tmp_path, args, message):
    cp = run_cli("bench", "overhead", "--out", str(tmp_path / "o"), *args)
    assert cp.returncode == 2 and message in cp.stderr and cp.stderr.startswith("Error:")
