"""The results model: statistics, versioned documents with upgrade-on-load (golden files written by
the previous formats), the writer, the comparison of runs (`tilewise report`), the system check,
and the layering rules."""

from __future__ import annotations

import ast
import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from conftest import FIXTURES, run_cli
from tilewise import environment
from tilewise.errors import UsageError
from tilewise.results import model, report, stats
from tilewise.results.output import Writer

V1 = FIXTURES / "results-v1"
SRC = Path(__file__).resolve().parents[1] / "src" / "tilewise"


def _console(width: int = 200):
    buf = io.StringIO()
    return Console(file=buf, width=width, no_color=True), buf


# ---- statistics --------------------------------------------------------------------------------

def test_summary_of_one_value_has_no_spread():
    s = stats.summarize([2.0])
    assert s["n"] == 1 and s["median"] == s["min"] == s["max"] == 2.0
    assert s["stdev"] is None and s["ci95"] is None and s["rel_spread"] is None and s["outliers"] == []


def test_confidence_interval_matches_student_t():
    xs = [10.0, 11.0, 12.0, 13.0, 14.0]
    s = stats.summarize(xs)
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) * sd / sqrt(n)
    assert s["ci95"] == pytest.approx([12.0 - half, 12.0 + half])
    assert s["stdev"] == pytest.approx(math.sqrt(2.5))
    assert stats.t975(1) == 12.706 and stats.t975(35) == 2.042 and stats.t975(5000) == 1.96
    assert stats.summarize([0.001, 0.1])["ci95"][0] == 0.0  # a time never has a negative bound


def test_outliers_by_modified_z_score():
    assert stats.outliers([1.0, 1.01, 0.99, 1.0, 1.02, 3.0]) == [5]
    assert stats.outliers([1.0, 1.0, 1.0, 1.0, 2.0]) == [4]  # MAD 0: the mean absolute deviation stands in
    assert stats.outliers([1.0, 1.0, 9.0]) == []  # too few values to call anything an outlier
    assert stats.outliers([1.0, 1.1, 1.2, 1.3]) == []


def test_ratio_interval():
    r = stats.ratio_ci([1.0, 1.02, 0.98, 1.01], [2.0, 2.04, 1.96, 2.02])
    assert r["ratio"] == pytest.approx(2.0, rel=1e-3) and r["ci95"][0] > 1.9 and r["ci95"][1] < 2.1
    same = stats.ratio_ci([1.0, 1.1, 0.9], [1.05, 0.95, 1.0])
    assert same["ci95"][0] < 1.0 < same["ci95"][1]
    assert stats.ratio_ci([1.0], [2.0]) == {"ratio": 2.0, "ci95": None}
    assert stats.ratio_ci([], [1.0]) is None


# ---- documents and upgrades ----------------------------------------------------------------------

def test_new_document_carries_command_versions_and_topology(tmp_path):
    from tilewise import topology

    t = topology.load("synthetic:Package:1 [NUMANode] L3Cache:1 Core:2 PU:1")
    doc = model.new("workload", topo=t, params={"x": 1}, engines={"duckdb": "9.9"},
                    argv=["/usr/bin/tilewise", "workload", "W1", "--records", "1e3"])
    assert doc["format"] == "tilewise-results" and doc["version"] == model.VERSION and doc["kind"] == "workload"
    assert doc["meta"]["command"] == "tilewise workload W1 --records 1e3"
    assert doc["meta"]["tilewise_version"] and "git_commit" in doc["meta"]
    env = doc["environment"]
    assert env["engines"] == {"duckdb": "9.9"} and env["topology"]["document"]["cores"] == 2
    with pytest.raises(ValueError):
        model.new("nosuch", topo=t, params={})


@pytest.mark.parametrize("name, kind, first_metric", [
    ("tpch.json", "benchmark", "wim/q1"),
    ("probe-latency.json", "probe.latency", "cas/l3"),
    ("tune.json", "tune", "system/first-touch/none"),
    ("elastic.json", "elastic", "q6/os/throughput"),
])
def test_old_files_load_and_upgrade(name, kind, first_metric):
    old = json.loads((V1 / name).read_text())
    doc = model.load(V1 / name)
    assert doc["format"] == model.FORMAT and doc["version"] == model.VERSION and doc["kind"] == kind
    assert doc["meta"]["upgraded_from"].startswith(old["format"])
    assert doc["metrics"][0]["name"] == first_metric and doc["metrics"][0]["values"]
    out, buf = _console()
    report.render(doc, out)  # the old run's tables come back
    assert buf.getvalue().strip()


def test_upgraded_tpch_keeps_raw_times():
    old = json.loads((V1 / "tpch.json").read_text())
    doc = model.load(V1 / "tpch.json")
    assert doc["params"]["engine"] == "duckdb" and doc["params"]["queries"] == [1, 6]
    m = model.metrics_by_name(doc)["wic/q6"]
    assert m["values"] == old["policies"]["wic"]["queries"]["q6"]["times_s"]


@pytest.mark.parametrize("doc, message", [
    ({"format": "tilewise-results", "version": 99, "kind": "benchmark"}, "newer than this tilewise reads"),
    ({"format": "tilewise-results", "kind": "benchmark"}, "without a version"),
    ({"format": "tilewise-results", "version": 2, "kind": "nosuch"}, "unknown results kind"),
    ({"format": "tilewise-tune-results", "version": 7}, "result format 'tilewise-tune-results' version 7"),
    ({"format": "something-else"}, "result format 'something-else'"),
    ({"no": "format"}, "result format None"),
    ([1, 2], "not a results document"),
])
def test_unknown_versions_are_clear_errors(tmp_path, doc, message):
    p = tmp_path / "results.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=message):
        model.load(tmp_path)


def test_unreadable_files_are_clear_errors(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        model.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        model.load(tmp_path / "bad.json")


# ---- the writer ----------------------------------------------------------------------------------

def _tpch_doc(times: dict[str, list[float]] | None = None, **extra) -> dict:
    times = times if times is not None else {"wim": [1.0, 1.2], "wic": [0.5, 0.6]}
    pols = {}
    for name, ts in times.items():
        q = {"times_s": ts, "rows": 1, "valid": True, **stats.query_stats(ts)}
        pols[name] = {"policy": name, "instances": [{}], "run_wall_s": ts, "queries": {"q1": q}, "complete": bool(ts)}
    doc = {"format": model.FORMAT, "version": model.VERSION, "kind": "benchmark", "meta": {"command": "x"},
           "interrupted": False, "complete": True, "environment": {}, "params": {"engine": "duckdb", "sf": 1, "streams": 1,
                                                                                  "runs": 2},
           "metrics": [], "warnings": [], "policies": pols}
    doc.update(extra)
    return doc


def test_writer_removes_files_this_run_does_not_produce(tmp_path):
    w = Writer(tmp_path)
    w.write(_tpch_doc())
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "results.csv", "speedup_per_query.png",
                                                    "geomean_speedup.png"}
    # a later run in the same folder that measured nothing: no table, no plot of the older run
    Writer(tmp_path).write(_tpch_doc({"wim": [], "wic": []}, interrupted=True, complete=False))
    assert {p.name for p in tmp_path.iterdir()} == {"results.json"}


def test_writer_without_folder_writes_nothing(tmp_path):
    doc = Writer(None).write(_tpch_doc())
    assert doc["metrics"] and not list(tmp_path.iterdir())


# ---- comparing runs ------------------------------------------------------------------------------

def test_compare_verdicts():
    before = _tpch_doc({"wim": [1.0, 1.01, 0.99, 1.0]})
    after = _tpch_doc({"wim": [0.5, 0.51, 0.49, 0.5]})
    same = _tpch_doc({"wim": [1.0, 0.98, 1.02, 1.01]})
    for d in (before, after, same):
        model.with_metrics(d)
    after["environment"] = {"hostname": "B"}
    before["environment"] = {"hostname": "A"}
    cmp = report.compare([("before", before), ("after", after), ("same", same)])
    row = next(r for r in cmp["metrics"] if r["name"] == "wim/q1")
    assert row["vs_first"][0]["verdict"] == "better" and row["vs_first"][0]["ratio"] == pytest.approx(0.5, rel=0.01)
    assert row["vs_first"][1]["verdict"] == "same"
    assert cmp["environment_differences"]["hostname"] == ["A", "B", None]
    out, buf = _console()
    report.render_comparison(cmp, out)
    assert "better" in buf.getvalue() and "environment differences" in buf.getvalue()
    assert report.compare([("a", before)], select="nomatch/*")["metrics"] == []
    worse = report.compare([("after", after), ("before", before)])["metrics"][0]["vs_first"][0]
    assert worse["verdict"] == "worse"


def test_report_command_compares_two_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    Writer(a, plots=False).write(_tpch_doc({"wim": [1.0, 1.02, 0.98]}))
    Writer(b, plots=False).write(_tpch_doc({"wim": [2.0, 2.02, 1.98]}))
    cp = run_cli("report", str(a), str(b), "--json", "--out", str(tmp_path / "cmp"))
    assert cp.returncode == 0, cp.stderr
    cmp = json.loads(cp.stdout)
    assert [r["label"] for r in cmp["runs"]] == ["a", "b"]
    row = next(r for r in cmp["metrics"] if r["name"] == "wim/q1")
    assert row["vs_first"][0]["verdict"] == "worse"
    for f in ("report.json", "report.csv", "report.png"):
        assert (tmp_path / "cmp" / f).stat().st_size > 0
    cp = run_cli("report", str(a), str(V1 / "tpch.json"))  # an old file compares with a new one
    assert cp.returncode == 0 and "wim/q1" in cp.stdout, cp.stderr
    cp = run_cli("report", str(a))
    assert cp.returncode == 0 and "median seconds per query" in cp.stdout
    for args, message in ((["report"], "no results given"), (["report", str(tmp_path / "none")], "cannot read"),
                          (["report", str(a), str(b), "--label", "x"], "--label"),
                          (["report", str(a), str(b), "--metrics", "zzz*"], "no metric matches")):
        cp = run_cli(*args)
        assert cp.returncode == 2 and cp.stderr.startswith("Error: ") and message in cp.stderr, cp.stderr


# ---- the system check ------------------------------------------------------------------------------

def _fake_sys(root: Path, *, governor="powersave", no_turbo="0", thp="always [madvise] never", numa="1"):
    for c in (0, 1):
        d = root / f"sys/devices/system/cpu/cpu{c}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(governor + "\n")
    (root / "sys/devices/system/cpu/intel_pstate").mkdir(parents=True)
    (root / "sys/devices/system/cpu/intel_pstate/no_turbo").write_text(no_turbo + "\n")
    (root / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text(thp + "\n")
    (root / "sys/kernel/mm/transparent_hugepage/defrag").write_text("always defer [madvise] never\n")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/numa_balancing").write_text(numa + "\n")


def test_system_check_finds_what_makes_timings_unstable(tmp_path):
    _fake_sys(tmp_path)
    busy = [{"pid": 42, "name": "java", "cpu_pct": 97.0}]
    found = environment.system_check(root=tmp_path, cpus=[0, 1], numa_nodes=2, loadavg=(3.5, 2.0, 1.0),
                                     processes=lambda: busy)
    assert found["governor"] == {"powersave": [0, 1]} and found["turbo"] is True
    assert found["thp_enabled"] == "madvise" and found["autonuma"] == "on" and found["loadavg"] == [3.5, 2.0, 1.0]
    text = " | ".join(found["warnings"])
    for needle in ("governor powersave on CPUs 0-1", "cpupower frequency-set -g performance", "turbo boost is on",
                   "load average 3.50 on 2 CPU(s)", "AutoNUMA is on", "java (pid 42, 97 %)"):
        assert needle in text, needle


def test_system_check_quiet_machine_has_no_warnings(tmp_path):
    _fake_sys(tmp_path, governor="performance", no_turbo="1", numa="0")
    found = environment.system_check(root=tmp_path, cpus=[0, 1], numa_nodes=2, loadavg=(0.1, 0.1, 0.1),
                                     processes=lambda: [])
    assert found["warnings"] == [] and found["turbo"] is False and found["autonuma"] == "off"
    bare = environment.system_check(root=tmp_path / "nothing", cpus=[0], loadavg=(0.0, 0.0, 0.0), processes=None)
    assert bare["governor"] is None and bare["turbo"] is None and bare["busy_processes"] is None
    assert bare["warnings"] == []  # what cannot be read is recorded as unknown, not warned about


# ---- layering ----------------------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_nothing_below_the_command_line_imports_it():
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if "cli" not in p.relative_to(SRC).parts and p.name != "__main__.py"  # the entry point
                 and any(m == "tilewise.cli" or m.startswith("tilewise.cli.") for m in _imports(p))]
    assert offenders == []


def test_topology_model_does_not_import_its_renderer_and_engines_do_not_import_bench():
    assert not any("render" in m for m in _imports(SRC / "topology" / "model.py"))
    for p in (SRC / "engines").glob("*.py"):
        assert not any(m.startswith("tilewise.bench") for m in _imports(p)), p.name
    assert not any(m.startswith("tilewise.cli") for m in _imports(SRC / "results" / "report.py"))


def test_the_reporting_module_only_dispatches_and_compares():
    """No result kind is named in results/report.py: what a kind shows is its own module's."""
    from tilewise.results import kinds

    tree = ast.parse((SRC / "results" / "report.py").read_text())
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not literals & set(kinds.names())
    for name in kinds.names():  # and no kind module reaches into another (or into report)
        mod = kinds.REGISTRY.entry(name).target.split(":")[0]
        path = SRC.parent / (mod.replace(".", "/") + ".py")
        own = _imports(path) - {"tilewise.results.kinds.Kind"}
        assert not {m for m in own if m.startswith(("tilewise.results.kinds.", "tilewise.results.report"))}, path


# ---- golden output (pyperf's way: the CLI against checked-in result files) ------------------------

V2 = FIXTURES / "results-v2"
GOLDEN_ENV = {"COLUMNS": "160", "NO_COLOR": "1"}


def test_report_output_is_golden():
    """tests/fixtures/results-v2/tpch.json was written by the harness (in-process engine, fake clock)
    with its environment scrubbed; regenerate the .txt files with the same command when the
    tables change on purpose."""
    cp = run_cli("report", str(V2 / "tpch.json"), env=GOLDEN_ENV)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == (V2 / "tpch.txt").read_text()
    cp = run_cli("report", str(V1 / "tpch.json"), str(V2 / "tpch.json"), "--label", "before", "--label", "after",
                 env=GOLDEN_ENV)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == (V2 / "compare.txt").read_text()
