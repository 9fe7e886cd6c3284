"""bench jcch: per-stream JCC-H parameters run, validated and recorded; the same
parameters for every policy; bad flags; and the TPC-H-next-to-JCC-H comparison of `report`
(driven with the in-process engine of test_tpch_metrics: no processes, no timing)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from conftest import run_cli
from test_tpch_metrics import LocalEngine, Steps
from tilewise.benchmarks.jcch import queries as JQ
from tilewise.bench import harness
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.errors import UsageError
from tilewise.results import model, report
from tilewise.results.kinds import benchmark as bench_kind

QUERIES = [2, 3, 13, 17, 18, 22]


class Recording(LocalEngine):
    """Remembers the SQL each policy's engine ran."""

    ran: list[list[str]] = []

    def start(self, plan, *, dataset, allocator="system", **settings):
        super().start(plan, dataset=dataset, allocator=allocator)
        self.sql: list[str] = []
        Recording.ran.append(self.sql)

    def run_query(self, sql, *, instance=None, timeout_s=None):
        self.sql.append(sql)
        return super().run_query(sql, instance=instance)


def _cfg(ds, out, **kw):
    base = dict(benchmark="jcch", sf=0.1, policies="wim,wic", queries=QUERIES, runs=1, warmup=False, streams=2,
                refresh=False, seed=7, data_dir=ds.dir.parent, out=out, plots=True)
    base.update(kw)
    return harness.Config(**base)


@pytest.fixture(scope="module")
def jcch_run(jcch_sf01, tmp_path_factory):
    Recording.ran = []
    out = tmp_path_factory.mktemp("jcch-run") / "res"
    doc = harness.run(_cfg(jcch_sf01, out), Steps(), engine_cls=Recording)
    return doc, out, list(Recording.ran)


def test_streams_run_their_own_parameters_and_every_answer_is_validated(jcch_run):
    doc, out, ran = jcch_run
    p = doc["params"]
    assert (p["benchmark"], p["query_params"], p["query_seed"]) == ("jcch", "skewed", 7)
    assert p["dataset"]["benchmark"] == "jcch" and p["dataset"]["seed"] == 0
    qp = doc["query_parameters"]
    assert qp["params"] == "skewed" and qp["seed"] == 7 and sorted(qp["streams"]) == ["0", "1", "2"]
    want = {JQ.binding(n, "skewed", seed=7, stream=s, sf=0.1).sql for n in QUERIES for s in (0, 1, 2)}
    assert set(ran[0]) == want  # power test = stream 0, throughput = streams 1 and 2
    assert set(ran[1]) == set(ran[0])  # every policy runs the same parameters
    for s in ("0", "1", "2"):
        assert qp["streams"][s]["q17"] == {"brand": "Brand#55", "container": "LG BOX"}
        assert qp["streams"][s]["q22"]["codes"][:5] == ["40", "50", "60", "70", "80"]
        assert qp["streams"][s]["q3"] == JQ.binding(3, "skewed", seed=7, stream=int(s), sf=0.1).params
    for pol in ("wim", "wic"):
        assert all(q["valid"] is True for q in doc["policies"][pol]["queries"].values())
    assert not doc["validation"]["wrong_answers"]
    saved = model.load(out)
    assert saved["query_parameters"] == qp
    assert (out / "speedup_per_query.png").exists()
    buf = io.StringIO()
    report.render(saved, Console(file=buf, width=200))
    assert "JCC-H (skewed) duckdb" in buf.getvalue() and "TPC-H duckdb" not in buf.getvalue()


def test_normal_parameters_and_the_tpch_texts_stay_for_tpch(jcch_sf01, tmp_path):
    Recording.ran = []
    doc = harness.run(_cfg(jcch_sf01, tmp_path / "n", params="normal", policies="wim", queries=[13], tests=("power",)),
                   Steps(), engine_cls=Recording)
    words = doc["query_parameters"]["streams"]["0"]["q13"]
    assert "mine" in words["word1"] and "gold" in words["word2"]
    assert doc["policies"]["wim"]["queries"]["q13"]["valid"] is True


def test_bad_flags_are_usage_errors(tmp_path):
    for kw in ({"benchmark": "tpch", "params": "skewed"}, {"benchmark": "jcch", "params": "weird"},
               {"benchmark": "jcch", "sf": 0.001}, {"benchmark": "no-such-benchmark"}, {"benchmark": "jcch", "seed": -1}):
        cfg = harness.Config(**{"sf": 0.1, "out": tmp_path / "x", "policies": "wim", **kw})
        with pytest.raises(UsageError):
            harness.check_config(cfg)
    for args in (["--seed", "1"], ["--params", "normal"], ["--data-seed", "2"]):
        cp = run_cli("bench", "tpch", "--sf", "0.01", *args, "--out", str(tmp_path / "y"))
        assert cp.returncode == 2 and cp.stderr.startswith("Error: ") and "`tilewise bench jcch`" in cp.stderr, cp.stderr
    # each benchmark has its own command: the old `bench tpch --benchmark jcch` says which
    cp = run_cli("bench", "tpch", "--benchmark", "jcch", "--sf", "0.01", "--out", str(tmp_path / "z"))
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [
        "Error: --benchmark is gone: each benchmark has its own command (`tilewise bench tpch` runs TPC-H); "
        "use `tilewise bench jcch` with the same options"] and not (tmp_path / "z").exists()


# ---- TPC-H next to JCC-H ---------------------------------------------------------------------------

def _doc(bench, engine, medians):
    return {"kind": "benchmark", "params": {"engine": engine, "sf": 1, "benchmark": bench,
                                       "query_params": "skewed" if bench == "jcch" else None},
            "policies": {pol: {"queries": {q: {"median_s": t} for q, t in qs.items()}} for pol, qs in medians.items()}}


def test_benchmark_comparison_is_per_query_speedup_over_the_baseline():
    t = _doc("tpch", "duckdb", {"wim": {"q1": 4.0, "q2": 2.0}, "win": {"q1": 1.0, "q2": 1.0}})
    j = _doc("jcch", "duckdb", {"wim": {"q1": 3.0, "q2": 2.0}, "win": {"q1": 2.0, "q2": 1.0}, "wic": {"q1": 1.0}})
    cmp = bench_kind.benchmark_comparison(t, j)
    assert cmp["baseline"] == "wim" and cmp["queries"] == ["q1", "q2"] and list(cmp["policies"]) == ["win"]
    win = cmp["policies"]["win"]
    assert win["tpch"] == [4.0, 2.0] and win["jcch"] == [1.5, 2.0]
    assert win["tpch_geomean"] == pytest.approx(8 ** 0.5) and win["jcch_geomean"] == pytest.approx(3 ** 0.5)
    assert bench_kind.benchmark_pair([("a", t), ("b", j)]) == (("a", t), ("b", j))
    assert bench_kind.benchmark_pair([("a", t), ("b", t)]) is None
    with pytest.raises(UsageError):
        bench_kind.benchmark_comparison(t, _doc("jcch", "spark", {"wim": {"q1": 1.0}, "win": {"q1": 1.0}}))
    with pytest.raises(UsageError):
        bench_kind.benchmark_comparison(t, _doc("jcch", "duckdb", {"wim": {"q1": 1.0}}))


def test_report_shows_and_plots_tpch_next_to_jcch(jcch_run, tmp_path):
    _, jcch_out, _ = jcch_run
    data = tmp_path / "data"
    tpch_data.ensure_data(0.01, data)
    tout = tmp_path / "tpch"
    harness.run(harness.Config(sf=0.01, policies="wim,wic", queries=QUERIES, runs=1, warmup=False, streams=2, refresh=False,
                         data_dir=data, out=tout, plots=False), Steps(), engine_cls=LocalEngine)
    cp = run_cli("report", str(tout), str(jcch_out), "--out", str(tmp_path / "cmp"))
    assert cp.returncode == 0, cp.stderr
    assert "per-query speedup over wim" in cp.stdout and "wic TPC-H" in cp.stdout and "wic JCC-H" in cp.stdout
    assert (tmp_path / "cmp" / "tpch_vs_jcch.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert doc["tpch_vs_jcch"]["queries"] == [f"q{n}" for n in QUERIES]
    assert len(doc["tpch_vs_jcch"]["policies"]["wic"]["jcch"]) == len(QUERIES)
