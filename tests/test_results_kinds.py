"""Result kinds, each one module of results.kinds: every kind's checked-in result files (written by
the real commands, environment scrubbed; older formats too) load, read back through the kind's
typed view without losing a key, and render the golden tables and CSV files; the plots carry the
tables' confidence intervals; the elastic daemon's log is a results document written line by line.

Regenerate the golden files after a deliberate change of the tables with
TILEWISE_REGEN_GOLDEN=1 pytest tests/test_results_kinds.py (and say why in the commit)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from conftest import FIXTURES, run_cli
from tilewise.errors import UsageError
from tilewise.results import document, kinds, model, output, report, stats
from tilewise.results.body import Record
from tilewise.results.kinds import benchmark as tpch
from tilewise.results.kinds import elastic_log

V1, V2 = FIXTURES / "results-v1", FIXTURES / "results-v2"
DOCS = sorted([*V1.glob("*.json"), *V1.glob("elastic-log-*.jsonl"), *V2.glob("*.json")])
DOCS = [p for p in DOCS if not p.name.startswith("tpch-vs-") and ".replay." not in p.name]
NEEDS_HARDWARE = {"probe.gpu": "host<->device copies need an NVIDIA GPU with its driver; no machine here has one"}
LOGS = sorted(V1.glob("elastic-log-*.jsonl"))
REGEN = os.environ.get("TILEWISE_REGEN_GOLDEN") == "1"
GOLDEN_ENV = {"COLUMNS": "160", "NO_COLOR": "1"}


def _golden(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs (regenerate with TILEWISE_REGEN_GOLDEN=1 if intended)"


def _shown(doc: dict) -> str:
    buf = io.StringIO()
    report.render(doc, Console(file=buf, width=160, no_color=True))
    text = buf.getvalue()
    for name, body in report.csv_files(doc).items():
        text += f"==> {name} <==\n{body}"
    return text


@pytest.mark.parametrize("path", DOCS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_kind_loads_reads_back_and_renders_its_golden_tables(path):
    doc = model.load(path)
    k = kinds.get(doc["kind"])
    assert k is not None and doc["version"] == model.VERSION
    assert k.view(doc).to_json() == doc  # the typed view keeps every key
    if not path.name.startswith("elastic-log-"):
        _golden(path.parent / f"{path.stem}.report.txt", _shown(doc))


@pytest.mark.parametrize("path", [p for p in DOCS if p.parent == V2], ids=lambda p: p.name)
def test_the_metrics_a_kind_derives_are_the_ones_its_documents_were_written_with(path):
    doc = model.load(path)
    if kinds.get(doc["kind"]) is None or kinds.get(doc["kind"]).metrics is None:
        pytest.skip(f"{doc['kind']}: the document carries its own metrics")
    stored = json.loads(json.dumps(doc["metrics"]))
    assert model.with_metrics(doc)["metrics"] == stored


def test_every_kind_is_one_module_with_its_own_view():
    names = kinds.names()
    assert set(names) >= {"benchmark", "elastic", "elastic.log", "elastic.tick", "probe.latency", "probe.bandwidth",
                          "probe.stream", "workload", "tune", "overhead"}
    for name in names:
        k = kinds.get(name)
        assert k.name == name and issubclass(k.document, document.Document)
    assert kinds.get("nosuch") is None
    loaded = {model.load(p)["kind"] for p in DOCS}
    # a checked-in result file of every kind, made by the real command; except the kinds that only
    # hardware this project's machines lack can produce (never a hand-made stand-in)
    assert loaded == set(names) - set(NEEDS_HARDWARE)


# ---- the typed views -------------------------------------------------------------------------------

def test_records_keep_unknown_keys_and_leave_out_absent_ones():
    d = {"times_s": [1.0, 2.0], "rows": 4, "future_field": {"x": 1}}
    q = tpch.Query.from_json(d)
    assert q.times_s == [1.0, 2.0] and q.rows == 4 and q.median_s is None and q.extra == {"future_field": {"x": 1}}
    assert q.to_json() == d
    q.median_s = 1.5
    assert q.to_json() == {**d, "median_s": 1.5}
    doc = tpch.BenchmarkDoc.from_json({"kind": "benchmark", "policies": {"wim": {"queries": {"q1": {"median_s": 2.0}}}}})
    assert doc.policies["wim"].queries["q1"].median_s == 2.0 and doc.params.engine is None


@pytest.mark.parametrize("bad, where", [
    ({"policies": []}, "policies is not a JSON object"),
    ({"policies": {"wim": {"queries": {"q1": [1]}}}}, "policies.wim.queries.q1 is not a JSON object"),
    ({"policies": {"wim": {"times": 1, "run_wall_s": 3}}}, "policies.wim.run_wall_s is not a list"),
])
def test_a_malformed_body_is_a_one_line_error(bad, where):
    with pytest.raises(UsageError, match=where):
        tpch.BenchmarkDoc.from_json({"kind": "benchmark", **bad}, "results document")


def test_record_defaults_are_not_shared():
    class_ = tpch.Policy
    a, b = class_(), class_()
    a.run_wall_s.append(1.0)
    assert b.run_wall_s == [] and isinstance(a, Record)


# ---- statistics: one helper ------------------------------------------------------------------------

def test_percentile_by_rank():
    xs = [float(x) for x in range(1, 101)]
    assert stats.percentile(xs, 99) == 100.0 and stats.percentile(xs, 50) == 51.0
    assert stats.percentile([3.0, 1.0, 2.0], 99) == 3.0  # fewer than 100 values: the worst
    assert stats.percentile([], 50) is None
    s = stats.summarize([1.0, 2.0, 3.0, 4.0], percentiles=(50, 95, 99))
    assert (s["p50"], s["p95"], s["p99"], s["median"]) == (3.0, 4.0, 4.0, 2.5)
    assert stats.summarize([], percentiles=(99,))["p99"] is None
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_no_percentile_or_summary_is_computed_outside_stats():
    """The harnesses, the daemon, the probes and the tuner call results.stats; none sorts values
    to pick a percentile of its own."""
    src = Path(__file__).resolve().parents[1] / "src" / "tilewise"
    offenders = []
    for p in src.rglob("*.py"):
        if p.parent.name == "results" and p.name == "stats.py":
            continue
        text = p.read_text()
        for needle in ("* 0.99", "0.99 *", "* 0.95", "0.95 *", "len(s) // 2]", "len(ms) // 2]", "statistics.fmean(",
                       "statistics.stdev("):
            if needle in text:
                offenders.append(f"{p.relative_to(src)}: {needle}")
    assert offenders == []


# ---- the elastic daemon's log --------------------------------------------------------------------------

@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_old_elastic_logs_replay_as_before(path):
    """Logs written by tilewise before the results model: `elastic --replay` prints and returns
    what it did then (the golden files were made with that tilewise)."""
    rel = os.path.relpath(path)
    for args, ext in (([], "replay.txt"), (["--json"], "replay.json")):
        cp = run_cli("elastic", "--replay", rel, *args, env=GOLDEN_ENV)
        assert cp.returncode == 0, cp.stderr
        _golden(path.parent / f"{path.stem}.{ext}", cp.stdout.replace(rel, "LOG"))
    doc = model.load(path)
    assert doc["kind"] == "elastic.log" and doc["meta"]["upgraded_from"] == "tilewise-elastic version 1"
    assert doc["complete"] and [m["name"] for m in doc["metrics"]] == ["cores", "tick_cpu"]


def test_log_is_written_line_by_line_and_a_cut_log_still_loads(tmp_path):
    from tilewise import topology

    t = topology.load("synthetic:Package:1 [NUMANode] L3Cache:1 Core:2 PU:1")
    path = tmp_path / "el.jsonl"
    old = model.load(V1 / "elastic-log-live.jsonl")
    with output.LineWriter(path, model.new("elastic.log", topo=t, params={"target": ["pid 1"], "mode": "dense"})) as w:
        for r in old["records"][:-1]:
            w.write(r)
        lines = path.read_text().splitlines()
        assert len(lines) == len(old["records"])  # flushed as written: a crash now loses nothing
        cut = model.load(path)  # the daemon killed here: no end record
        assert cut["kind"] == "elastic.log" and not cut["complete"] and not cut["interrupted"]
        w.write(elastic_log.end_record(t=4.0, stop_reason="duration reached", stats=old["records"][-1]["stats"]))
    doc = model.load(path)
    assert doc["format"] == model.FORMAT and doc["complete"] and doc["meta"]["finished"]
    assert doc["environment"]["topology"]["summary"] and doc["params"]["mode"] == "dense"
    assert doc["records"] == old["records"][:-1] + [doc["records"][-1]]
    same = elastic_log.replay_summary(elastic_log.KIND.view(doc), "x")
    assert same == elastic_log.replay_summary(elastic_log.KIND.view(old), "x")  # the same summary as the old log
    path.write_text(path.read_text()[:-20])  # the last line cut short (killed mid-write)
    torn = model.load(path)
    assert len(torn["records"]) == len(doc["records"]) - 1 and "cut short" in torn["warnings"][-1]
    buf = io.StringIO()
    report.render(torn, Console(file=buf, width=160, no_color=True))
    assert "40 ticks" in buf.getvalue() and "no end record" in buf.getvalue()


def test_replay_of_something_else_is_a_one_line_error(tmp_path):
    from tilewise.elastic.session import read_log

    with pytest.raises(UsageError, match="not a tilewise elastic log: it holds benchmark results"):
        read_log(str(V2 / "tpch.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "log", "format": "tilewise-elastic", "version": 1}\n{"not": "a tick"}\n')
    with pytest.raises(UsageError, match="line 2 of the elastic log is neither a tick nor an event"):
        read_log(str(bad))


# ---- plots with the tables' confidence intervals ------------------------------------------------------

def _whiskers(png_doc, monkeypatch, fn):
    """The error bars a plot function draws: [(low, high)] per bar with an interval."""
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, *a, **kw):
        err = kw.get("yerr") if kw.get("yerr") is not None else kw.get("xerr")
        mids = y if kw.get("yerr") is not None else x
        drawn.extend((m - e, m + e) for m, e in zip(mids, err))
        return real(self, x, y, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    paths = fn()
    return paths, drawn


def test_tpch_plots_show_the_tables_intervals(tmp_path, monkeypatch):
    doc = model.load(V2 / "tpch-duckdb.json")
    paths, drawn = _whiskers(doc, monkeypatch, lambda: report.plot_files(doc, tmp_path))
    assert {p.name for p in paths} == {"speedup_per_query.png", "geomean_speedup.png", "tpch_metrics.png"}
    summ = doc["summary"]["wic"]["qphh_at_size"]["ci95"]
    assert any(lo == pytest.approx(summ[0]) and hi == pytest.approx(summ[1]) for lo, hi in drawn)
    wim, wic = (doc["policies"][p]["queries"]["q18"]["times_s"] for p in ("wim", "wic"))
    ci = stats.ratio_ci(wic, wim)["ci95"]  # the speedup of wic over wim on q18
    assert any(lo == pytest.approx(ci[0]) and hi == pytest.approx(ci[1]) for lo, hi in drawn)


def test_tune_plot_shows_the_tables_intervals(tmp_path, monkeypatch):
    doc = model.load(V2 / "tune.json")
    paths, drawn = _whiskers(doc, monkeypatch, lambda: report.plot_files(doc, tmp_path))
    assert [p.name for p in paths] == ["fig6.png"]
    want = sorted(tuple(c["ci95_s"]) for c in doc["cases"])
    assert [x for lo_hi in sorted(drawn) for x in lo_hi] == pytest.approx([x for lo_hi in want for x in lo_hi])


# ---- `tilewise report` of two runs -----------------------------------------------------------------------

def test_tpch_next_to_jcch_is_golden(tmp_path):
    args = ["report", str(V2 / "tpch-duckdb.json"), str(V2 / "jcch-duckdb.json"), "--label", "tpch", "--label", "jcch"]
    cp = run_cli(*args, env=GOLDEN_ENV)
    assert cp.returncode == 0, cp.stderr
    _golden(V2 / "tpch-vs-jcch.txt", cp.stdout)
    cp = run_cli(*args, "--json", env=GOLDEN_ENV)
    assert cp.returncode == 0, cp.stderr
    _golden(V2 / "tpch-vs-jcch.json", cp.stdout)
    pair = [("a", model.load(V2 / "tpch-duckdb.json")), ("b", model.load(V2 / "jcch-duckdb.json"))]
    (cmp,) = report.kind_comparisons(pair)
    assert cmp.key == "tpch_vs_jcch" and cmp.plot(tmp_path).read_bytes()[:4] == b"\x89PNG"
    assert report.kind_comparisons(pair[:1]) == []


def test_a_document_of_the_old_tpch_kind_loads_as_the_benchmark_kind():
    raw = json.loads((V2 / "tpch.json").read_text())  # written by `bench tpch` when the kind was "tpch"
    assert raw["kind"] == "tpch" and all("tpch_runs" in p for p in raw["policies"].values() if not p.get("same_as"))
    doc = model.load(V2 / "tpch.json")
    assert doc["kind"] == "benchmark"
    for name, pol in doc["policies"].items():
        assert "tpch_runs" not in pol and "tpch_warmup" not in pol
        assert pol.get("runs", []) == raw["policies"][name].get("tpch_runs", [])
        assert pol.get("warmup", []) == raw["policies"][name].get("tpch_warmup", [])
    typed = kinds.get("benchmark").view(doc)
    assert typed.policies["wim"].runs and typed.policies["wim"].runs[0].power_at_size > 0
    assert not {"tpch_runs", "tpch_warmup"} & set(typed.policies["wim"].extra)  # no key of the old kind left unread
