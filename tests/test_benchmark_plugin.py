"""The benchmark contract from outside the tree: a tiny benchmark package in tmp_path, registered
through the entry-point group `tilewise.benchmarks` (a .dist-info on sys.path, no pip install), is
found by `data generate`, gets its own `bench <name>` command, and runs through the harness with
its own catalog (a query in two parts: ids 2a/2b), stream orders, metrics and no refresh functions;
plus query selection over multi-part ids. Seconds: in-process DuckDB replicas, tiny tables."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from conftest import run_cli
from test_tpch_metrics import LocalEngine, Steps
from tilewise import benchmarks
from tilewise.bench import harness
from tilewise.benchmarks.spec import Catalog, query_number
from tilewise.errors import UsageError

PLUGIN = '''
"""Tiny: two tables, three queries (query 2 in two parts), its own metrics, no refresh functions."""
from pathlib import Path

from tilewise.benchmarks.spec import Benchmark, Catalog, Data, Metrics
from tilewise.data import Dataset, store
from tilewise.errors import UsageError

TABLES = ("item", "sale")
FORMAT = "tiny-data/1"
SQL = {
    1: "select count(*) as n, sum(s_qty) as q from sale",
    "2a": "select i_name, sum(s_qty) as q from sale join item on s_item = i_id group by i_name order by i_name",
    "2b": "select i_name, avg(s_qty) as a from sale join item on s_item = i_id group by i_name",
}
IDS = (1, "2a", "2b")


def _build(tmp: Path, sf: float) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = int(100 * sf)
    pq.write_table(pa.table({"i_id": [1, 2, 3], "i_name": ["bolt", "nut", "screw"]}), tmp / "item.parquet")
    pq.write_table(pa.table({"s_item": [1 + i % 3 for i in range(n)], "s_qty": [1 + i % 7 for i in range(n)]}),
                   tmp / "sale.parquet")
    return {"sf": sf, "generator": "tiny 1"}


class _Data(Data):
    tables = TABLES

    def check_sf(self, sf) -> float:
        v = float(sf)
        if not v >= 0.1:
            raise UsageError(f"Tiny needs SF >= 0.1, got {sf}")
        return v

    def set_dir(self, sf, seed=None, data_dir=None) -> Path:
        return Path(data_dir or store.cache_root("tiny")) / f"tiny-sf{self.check_sf(sf):g}"

    def is_valid(self, d) -> bool:
        return store.is_valid(d, FORMAT, TABLES)

    def dataset(self, sf, data_dir=None, *, seed=None, log=None, progress=None) -> Dataset:
        d = store.ensure(self.set_dir(sf, None, data_dir), FORMAT, lambda tmp: _build(tmp, sf), what="Tiny",
                         log=log, tables=TABLES)
        return Dataset("tiny", sf, d, title="Tiny", table_names=TABLES)


class _Metrics(Metrics):
    names = (("power_at_size", "Power"), ("throughput_at_size", "Throughput"), ("qpht", "QphT"))

    def min_streams(self, sf) -> int:
        return 3

    def figures(self, m):
        power = m.queries * 3600.0 / sum(m.power_s) if m.power_s else None
        through = m.streams * m.queries * 3600.0 / m.interval_s if m.interval_s else None
        # QphT needs the refresh functions and the load time: without either it is not QphT
        whole = power and through and m.refresh and m.load_s is not None
        return {"power_at_size": power, "throughput_at_size": through, "qpht": (power * through) ** 0.5 if whole else None}

    def notes(self, *, queries, total_queries, refresh_reason):
        return [f"no QphT: {refresh_reason}"] if refresh_reason else []


SPEC = Benchmark(
    name="tiny", title="Tiny", about="a two-table test benchmark", data=_Data(),
    catalog=Catalog("Tiny", IDS, SQL.__getitem__, lambda s: IDS if s % 2 == 0 else IDS[::-1]),
    metrics=_Metrics(),
)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """tinybench.py plus tinybench-1.0.dist-info/entry_points.txt in a directory on sys.path (and on
    PYTHONPATH for the `tilewise` subprocesses)."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "tinybench.py").write_text(PLUGIN)
    di = root / "tinybench-1.0.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: tinybench\nVersion: 1.0\n")
    (di / "entry_points.txt").write_text(textwrap.dedent("""\
        [tilewise.benchmarks]
        tiny = tinybench:SPEC
        """))
    monkeypatch.syspath_prepend(str(root))
    sys.modules.pop("tinybench", None)
    benchmarks.REGISTRY.refresh()  # installed after this process read its entry points
    env = {"PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    yield root, env
    benchmarks.REGISTRY.refresh()


def test_data_generate_and_bench_find_a_plugin_benchmark(plugin, tmp_path):
    _, env = plugin
    assert "tiny" in benchmarks.names() and benchmarks.REGISTRY.entry("tiny").origin.endswith("of tinybench")
    cp = run_cli("data", "generate", "--benchmark", "tiny", "--sf", "1", "--data-dir", str(tmp_path / "data"),
                 "--json", env=env)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["benchmark"] == "tiny" and doc["rows"] == {"item": 3, "sale": 100}
    assert doc["dir"] == str(tmp_path / "data" / "tiny-sf1")
    cp = run_cli("bench", "tiny", "--sf", "0.01", "--data-dir", str(tmp_path / "data"), env=env)
    assert cp.returncode == 2 and "Tiny needs SF >= 0.1" in cp.stderr and len(cp.stderr.splitlines()) == 1, cp.stderr
    cp = run_cli("bench", "tiny", "--params", "skewed", "--out", str(tmp_path / "x"), env=env)
    assert cp.returncode == 2 and "--params applies to `tilewise bench jcch` or `tilewise bench tpcds` only" in cp.stderr, cp.stderr


def test_the_harness_runs_a_plugin_benchmark_by_its_spec(plugin, tmp_path):
    cfg = harness.Config(benchmark="tiny", sf=1, policies="wim", runs=1, warmup=False, streams=2, out=tmp_path / "out",
                      data_dir=tmp_path / "data", plots=False, queries=benchmarks.get("tiny").catalog.parse("1,2"))
    doc = harness.run(cfg, Steps(), engine_cls=LocalEngine)
    assert doc["complete"] and doc["params"]["benchmark"] == "tiny" and doc["params"]["queries"] == [1, "2a", "2b"]
    assert doc["requested"]["queries"] == ["q1", "q2a", "q2b"]
    assert doc["refresh"]["applied"] is False and doc["refresh"]["reason"] == "Tiny has no refresh functions here"
    assert "no QphT: Tiny has no refresh functions here" in doc["notes"]
    run = doc["policies"]["wim"]["runs"][0]
    assert run["power"]["order"] == [1, "2a", "2b"] and run["power"]["refresh"] == "none"
    assert [s["order"] for s in run["throughput"]["streams"]] == [["2b", "2a", 1], [1, "2a", "2b"]]
    assert run["power_at_size"] > 0 and run["throughput_at_size"] > 0 and run["qpht"] is None
    assert all(q["valid"] is True and q["times_s"] for q in doc["policies"]["wim"]["queries"].values())
    assert doc["validation"]["reference"].startswith("datafusion")


def test_multi_part_query_ids_and_selection():
    cat = Catalog("X", (1, 6, "14a", "14b", 15), lambda q: "select 1", lambda s: (15, "14b", "14a", 6, 1))
    assert cat.parse("1,6") == [1, 6] and cat.parse("14") == ["14a", "14b"] and cat.parse("q14b") == ["14b"]
    assert cat.parse("14-15,1") == ["14a", "14b", 15, 1] and cat.parse(None) == [1, 6, "14a", "14b", 15]
    assert cat.stream_order(1, ["14a", 1, 6]) == ["14a", 6, 1]
    assert [cat.key(q) for q in (6, "14a")] == ["q6", "q14a"] and cat.ref_key(6) == "q06"
    assert query_number("14b") == 14 and cat.check([6, "14a", 6]) == [6, "14a"]
    for bad in ("2", "16", "14c", "x", ""):
        with pytest.raises(UsageError):
            cat.parse(bad)
    with pytest.raises(UsageError, match="no X query '14c'"):
        cat.check(["14c"])
