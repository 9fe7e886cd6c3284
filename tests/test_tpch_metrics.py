"""TPC-H's own metrics: the formulas, the stream orders, the refresh data (RF1/RF2) and its
references, and the harness's scheduling, validation across data states and honest results,
driven with an in-process engine (DuckDB connections as replicas; no processes, no timing)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import threading

import duckdb
import pyarrow.parquet as pq
import pytest

from tilewise import plan as planner
from tilewise import topology
from tilewise.bench import harness
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.benchmarks.tpch import metrics as M
from tilewise.benchmarks.tpch import queries as Q
from tilewise.benchmarks.tpch import refresh as RF
from tilewise.engines.contract import Capabilities, EngineSpec, InstanceStatus, QueryResult, Runtime
from tilewise.results import model, report

SF = 0.01


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-metrics-data")
    return tpch_data.dataset(SF, root)


# ---- formulas and orders (pure) -----------------------------------------------------------------

def test_power_throughput_and_qphh_formulas():
    assert M.power_at_size(1.0, [1.0] * 22, [1.0, 1.0]) == pytest.approx(3600.0)
    assert M.power_at_size(10.0, [2.0] * 22, []) == pytest.approx(18000.0)
    # an interval below the longest / 1000 counts as the longest / 1000 (TPC-H 5.4.1.4)
    assert M.power_at_size(1.0, [1000.0, 0.001], []) == pytest.approx(3600.0 / math.sqrt(1000.0 * 1.0))
    assert M.power_at_size(1.0, [], []) is None and M.power_at_size(1.0, [0.0], []) is None
    assert M.throughput_at_size(1.0, 2, 22, 3600.0) == pytest.approx(44.0)
    assert M.throughput_at_size(100.0, 5, 22, 7200.0) == pytest.approx(5500.0)
    assert M.throughput_at_size(1.0, 2, 22, 0.0) is None
    assert M.qphh_at_size(400.0, 100.0) == pytest.approx(200.0) and M.qphh_at_size(None, 1.0) is None


def test_stream_orders_are_the_specifications():
    assert len(Q.STREAM_ORDER) == 41 and all(sorted(r) == list(Q.NUMBERS) for r in Q.STREAM_ORDER)
    assert Q.stream_order(0)[:6] == [14, 2, 9, 20, 6, 17]  # stream 00: the power test
    assert Q.stream_order(1)[:4] == [21, 3, 18, 5] and Q.stream_order(40)[-3:] == [12, 5, 19]
    assert Q.stream_order(41) == Q.stream_order(1)  # wraps around after 40
    assert Q.stream_order(0, [1, 6, 14]) == [14, 6, 1]


def test_default_streams_and_idle_instances():
    class P:
        def __init__(self, n):
            self.instances = [object()] * n

    assert [M.min_streams(sf) for sf in (0.01, 1, 10, 30, 100, 300, 1000)] == [2, 2, 3, 4, 5, 6, 7]
    plans = [("wim", P(1)), ("wic", P(16))]
    assert harness.default_streams(M.min_streams(1.0), True, plans) == 16  # replicas: one stream per instance at least
    assert harness.default_streams(M.min_streams(1.0), False, plans) == 2  # cooperating instances: the spec's minimum
    assert "12 instance(s) stay idle" in harness.idle_warning("wic", 16, 4, True)
    assert harness.idle_warning("wic", 16, 4, False) is None and harness.idle_warning("wic", 16, 16, True) is None


def test_same_deployment_is_recognised():
    one = topology.load("synthetic:Package:1 [NUMANode] L3Cache:1 Core:4 PU:1")
    two = topology.load("synthetic:Package:2 [NUMANode] L3Cache:2 Core:2 PU:1")
    k1 = {p: harness.deployment_key(planner.plan(one, p)) for p in ("wim", "win", "wicp", "wicp-mixed", "auto", "wic")}
    assert k1["wim"] == k1["win"] == k1["wicp"] == k1["wicp-mixed"] == k1["auto"] != k1["wic"]
    k2 = {p: harness.deployment_key(planner.plan(two, p)) for p in ("wim", "win", "wicp")}
    assert len({k2["wim"], k2["win"], k2["wicp"]}) == 3


# ---- the refresh data ---------------------------------------------------------------------------

def test_refresh_sets_follow_the_specification(dataset):
    sets = RF.ensure_sets(dataset, 2)
    n = RF.orders_per_set(SF)
    assert n == 15 and [s.orders_count for s in sets] == [n, n]
    con = duckdb.connect()
    for t, p in dataset.tables.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{p}')")
    for s in sets:
        con.execute(f"CREATE OR REPLACE VIEW o AS SELECT * FROM read_parquet('{s.orders}')")
        con.execute(f"CREATE OR REPLACE VIEW l AS SELECT * FROM read_parquet('{s.lineitem}')")
        con.execute(f"CREATE OR REPLACE VIEW d AS SELECT * FROM read_parquet('{s.delete}')")
        first, last = RF.row_range(SF, s.number)
        keys = [r[0] for r in con.execute("SELECT o_orderkey FROM o ORDER BY 1").fetchall()]
        assert keys == [RF.mk_sparse(i, 1) for i in range(first, last + 1)]  # the unused sparse keys
        assert con.execute("SELECT count(*) FROM o JOIN orders USING (o_orderkey)").fetchone()[0] == 0
        dkeys = [r[0] for r in con.execute("SELECT orderkey FROM d ORDER BY 1").fetchall()]
        assert dkeys == [RF.mk_sparse(i, 0) for i in range(first, last + 1)]
        assert con.execute("SELECT count(*) FROM d JOIN orders ON orderkey = o_orderkey").fetchone()[0] == n
        per_order = con.execute("SELECT count(*), max(l_linenumber), min(l_linenumber) FROM l GROUP BY l_orderkey").fetchall()
        assert len(per_order) == n and all(1 <= c <= 7 and mx == c and mn == 1 for c, mx, mn in per_order)
        assert con.execute("SELECT count(*) FROM o WHERE o_custkey % 3 = 0 OR o_custkey > 1500").fetchone()[0] == 0
        lo, hi = con.execute("SELECT min(o_orderdate), max(o_orderdate) FROM o").fetchone()
        assert dt.date(1992, 1, 1) <= lo and hi <= dt.date(1998, 8, 2)
        # every (part, supplier) of a new lineitem is a row of partsupp: dbgen's bridge formula
        assert con.execute("SELECT count(*) FROM l LEFT JOIN partsupp ON ps_partkey = l_partkey "
                           "AND ps_suppkey = l_suppkey WHERE ps_partkey IS NULL").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM l JOIN part ON p_partkey = l_partkey "
                           "WHERE l_extendedprice <> l_quantity * p_retailprice").fetchone()[0] == 0
        assert con.execute("""SELECT count(*) FROM l JOIN o ON o_orderkey = l_orderkey WHERE
            l_shipdate - o_orderdate NOT BETWEEN 1 AND 121 OR l_commitdate - o_orderdate NOT BETWEEN 30 AND 90
            OR l_receiptdate - l_shipdate NOT BETWEEN 1 AND 30
            OR l_returnflag <> CASE WHEN l_receiptdate <= DATE '1995-06-17' THEN l_returnflag ELSE 'N' END
            OR (l_receiptdate <= DATE '1995-06-17' AND l_returnflag NOT IN ('R', 'A'))
            OR l_linestatus <> CASE WHEN l_shipdate <= DATE '1995-06-17' THEN 'F' ELSE 'O' END""").fetchone()[0] == 0
        bad_status = con.execute("""SELECT count(*) FROM o JOIN (SELECT l_orderkey, bool_and(l_linestatus = 'F') f,
            bool_or(l_linestatus = 'F') anyf FROM l GROUP BY 1) x ON x.l_orderkey = o_orderkey
            WHERE o_orderstatus <> CASE WHEN f THEN 'F' WHEN anyf THEN 'P' ELSE 'O' END""").fetchone()[0]
        assert bad_status == 0
        # the loaded tables' exact column types
        assert pq.read_schema(s.orders) == pq.read_schema(dataset.tables["orders"])
        assert pq.read_schema(s.lineitem) == pq.read_schema(dataset.tables["lineitem"])
    again = RF.ensure_sets(dataset, 1)[0]
    assert pq.read_table(again.orders).equals(pq.read_table(sets[0].orders))  # cached, reproducible


def test_too_many_sets_for_the_scale_factor_is_a_clear_error(dataset):
    from tilewise.errors import UsageError

    with pytest.raises(UsageError, match="refresh sets"):
        RF.ensure_sets(dataset, 1001)


def test_reference_of_a_refreshed_state_and_the_undo(dataset):
    from tilewise.benchmarks import validate

    sets = {s.number: s for s in RF.ensure_sets(dataset, 1)}
    state = RF.State().after("RF1", 1).after("RF2", 1)
    ref, loaded = validate.Reference(dataset, state=state, sets=sets), validate.Reference(dataset)
    assert ref.cache_dir != loaded.cache_dir and state.key in str(ref.cache_dir)
    con = duckdb.connect()
    for t, p in dataset.tables.items():
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{p}')")
    qs = (1, 3, 13, 18)
    for fn in ("RF1", "RF2"):
        for sql in RF.statements(fn, sets[1], dataset):
            con.execute(sql)
    assert all(ref.check(n, con.execute(Q.load(n)).fetchall()).ok for n in qs)
    assert not loaded.check(1, con.execute(Q.load(1)).fetchall()).ok  # RF1/RF2 change Q1's answer
    for fn in ("undo-RF2", "undo-RF1"):
        for sql in RF.statements(fn, sets[1], dataset):
            con.execute(sql)
    assert all(loaded.check(n, con.execute(Q.load(n)).fetchall()).ok for n in qs)


# ---- the harness, with an in-process engine ---------------------------------------------------------

LOCAL = EngineSpec("local", "Local", "in-process DuckDB databases", runtime="", missing=lambda: None,
                   version=lambda: duckdb.__version__, capabilities=Capabilities(replicas=True, refresh=True))


class LocalEngine(Runtime):
    """Replicas as in-process DuckDB databases: the harness's scheduling, refresh and validation
    without worker processes. skip_refresh_on: instance ids that silently do not apply refreshes."""

    spec = LOCAL
    skip_refresh_on: tuple[int, ...] = ()

    def start(self, plan, *, dataset, allocator="system", **settings):
        self.plan, self.dataset = plan, dataset
        self.dbs = {}
        for inst in plan.instances:
            con = duckdb.connect()
            for t, p in dataset.tables.items():
                con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{p}')")
            self.dbs[inst.id] = con
        self.inflight = {i: 0 for i in self.dbs}
        self.lock = threading.Lock()

    def run_query(self, sql, *, instance=None, timeout_s=None):
        with self.lock:
            i = instance if instance is not None else min(self.inflight, key=lambda k: (self.inflight[k], k))
            self.inflight[i] += 1
        try:
            cur = self.dbs[i].cursor()
            rows = cur.execute(sql).fetchall()
            return QueryResult([d[0] for d in cur.description], rows, 0.001 * (1 + i), i)
        finally:
            with self.lock:
                self.inflight[i] -= 1

    def apply_refresh(self, function, rset):
        for i, con in self.dbs.items():
            if i in self.skip_refresh_on:
                continue
            cur = con.cursor()
            cur.execute("BEGIN TRANSACTION")
            for sql in RF.statements(function, rset, self.dataset):
                cur.execute(sql)
            cur.execute("COMMIT")
        return 0.002

    def status(self):
        return [InstanceStatus(i.id, None, i.cpus, i.mem_nodes, i.mem_policy, True, True) for i in self.plan.instances]

    def statuses(self):
        return []  # in process: no process of its own

    def alive(self):
        return False

    def stop(self):
        for con in getattr(self, "dbs", {}).values():
            con.close()
        self.dbs = {}
        return []


class Steps(harness.Reporter):
    def __init__(self, stop_at: int | None = None):
        self.n, self.stop_at, self.messages = 0, stop_at, []

    def message(self, text):
        self.messages.append(text)

    def step(self, label):
        self.n += 1
        if self.stop_at is not None and self.n >= self.stop_at:
            raise KeyboardInterrupt


def _cfg(dataset, tmp_path, **kw):
    base = dict(sf=SF, policies="wim", queries=[1, 6], runs=2, streams=2, out=tmp_path / "out",
                data_dir=dataset.dir.parent, plots=True)
    base.update(kw)
    return harness.Config(**base)


def test_power_and_throughput_tests_with_refresh(dataset, tmp_path):
    doc = harness.run(_cfg(dataset, tmp_path), Steps(), engine_cls=LocalEngine)
    assert doc["complete"] and not doc["interrupted"] and doc["refresh"]["applied"]
    assert [s["set"] for s in doc["refresh"]["sets"]] == [1, 2, 3]  # power: set 1; throughput: 2 streams
    pol = doc["policies"]["wim"]
    assert len(pol["runs"]) == 2 and len(pol["warmup"]) == 1
    run = pol["runs"][0]
    assert run["power"]["order"] == [6, 1] and run["power"]["refresh"] == "RF1/RF2"
    assert [s["order"] for s in run["throughput"]["streams"]] == [[6, 1], [6, 1]]
    assert [r["set"] for r in run["throughput"]["refresh_stream"]] == [2, 3]
    for key in ("power_at_size", "throughput_at_size", "qphh_at_size"):
        assert run[key] > 0
    assert run["qphh_at_size"] == pytest.approx(math.sqrt(run["power_at_size"] * run["throughput_at_size"]))
    assert all(q["valid"] for q in pol["queries"].values())
    assert pol["queries"]["q1"]["times_s"] == [0.001, 0.001] and pol["queries"]["q1"]["warmup_s"] == [0.001]
    names = {m["name"] for m in doc["metrics"]}
    assert {"wim/power@size", "wim/throughput@size", "wim/qphh@size", "wim/q1"} <= names
    s = doc["summary"]["wim"]["qphh_at_size"]
    assert s["n"] == 2 and s["median"] > 0
    assert (tmp_path / "out" / "tpch_metrics.csv").exists() and (tmp_path / "out" / "tpch_metrics.png").exists()


def test_between_runs_only_the_json_is_rewritten_and_tables_and_plots_are_made_once(dataset, tmp_path):
    out = tmp_path / "out"
    seen = []

    class Watch(Steps):
        def step(self, label):
            super().step(label)
            doc = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
            seen.append((doc is not None and bool(doc["metrics"]),
                         sorted(p.name for p in out.iterdir() if p.name != "results.json") if out.exists() else []))

    doc = harness.run(_cfg(dataset, tmp_path), Watch(), engine_cls=LocalEngine)
    assert doc["complete"] and len(seen) > 3
    assert all(files == [] for _, files in seen), seen  # no table or plot while it runs
    assert any(has_metrics for has_metrics, _ in seen[2:])  # the JSON written so far carries its metrics
    assert {"results.csv", "tpch_metrics.csv", "tpch_metrics.png"} <= {
        p.name for p in out.iterdir()}
    written = json.loads((out / "results.json").read_text())
    assert written["plots"] and written["summary"]["wim"]["qphh_at_size"]["n"] == 2


def test_a_replica_that_misses_a_refresh_is_a_wrong_answer(dataset, tmp_path):
    class Skips(LocalEngine):
        skip_refresh_on = (0,)

    with pytest.raises(harness.WrongAnswer):
        harness.run(_cfg(dataset, tmp_path, queries=[1], runs=1, warmup=False), Steps(), engine_cls=Skips)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    q = doc["policies"]["wim"]["queries"]["q1"]
    assert q["valid"] is False and "RF1 of set(s) 1" in q["error"]
    assert doc["summary"]["wim"]["valid"] is False


def test_without_refresh_functions_the_results_say_so(dataset, tmp_path):
    class ReadOnly(LocalEngine):
        spec = dataclasses.replace(LOCAL, capabilities=Capabilities(replicas=True, refresh=False))

    doc = harness.run(_cfg(dataset, tmp_path, refresh=None, runs=1), Steps(), engine_cls=ReadOnly)
    assert doc["refresh"]["applied"] is False and "cannot write" in doc["refresh"]["reason"]
    assert any("without refresh functions" in n for n in doc["notes"])
    run = doc["policies"]["wim"]["runs"][0]
    assert run["power"]["refresh"] == "none" and run["throughput"]["refresh_stream"] is None
    assert run["power_at_size"] > 0 and all(q["valid"] for q in doc["policies"]["wim"]["queries"].values())


def test_power_test_only(dataset, tmp_path):
    doc = harness.run(_cfg(dataset, tmp_path, tests=("power",), runs=1), Steps(), engine_cls=LocalEngine)
    run = doc["policies"]["wim"]["runs"][0]
    assert run["throughput"] is None and run["throughput_at_size"] is None and run["qphh_at_size"] is None
    assert run["power_at_size"] > 0 and [s["set"] for s in doc["refresh"]["sets"]] == [1]
    out, buf = _console()
    report.render(doc, out)
    row = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("wim") and "│" in ln and "-" in ln.split("│")[-1])
    assert row.split("│")[-1].strip() == "-"  # no throughput test: no streams to show in the metrics table


# ---- honest results (issue 10 item 6) ----------------------------------------------------------------

def test_same_deployment_runs_once_and_reports_same_as(dataset, tmp_path):
    t = topology.load(None)
    same = harness.deployment_key(planner.plan(t, "auto")) == harness.deployment_key(planner.plan(t, "wim"))
    rep = Steps()
    doc = harness.run(_cfg(dataset, tmp_path, policies="wim,auto", runs=1), rep, engine_cls=LocalEngine)
    auto = doc["policies"]["auto"]
    if same:  # e.g. one NUMA node: auto is wim
        assert auto["same_as"] == "wim" and not auto["runs"] and not auto["queries"]
        assert doc["summary"]["auto"] == {"same_as": "wim", "complete": True}
        assert not any(m["labels"].get("policy") == "auto" for m in doc["metrics"])
        assert any("same deployment as wim" in m for m in rep.messages)
        out, buf = _console()
        report.render(doc, out)
        assert "= wim" in buf.getvalue()
    else:
        assert auto["same_as"] is None and auto["runs"]
    assert doc["completed"]["policies"] == ["wim", "auto"]


def test_interrupted_before_any_timed_run_writes_no_tables_or_plots(dataset, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        harness.run(_cfg(dataset, tmp_path, policies="wim,wic"), Steps(stop_at=2), engine_cls=LocalEngine)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    doc = model.load(out)
    assert doc["interrupted"] is True and doc["complete"] is False
    assert doc["requested"] == {"policies": ["wim", "wic"], "queries": ["q1", "q6"]}
    assert doc["completed"] == {"policies": [], "queries": {}}
    assert doc["policies"]["wim"]["error"] == "interrupted" and doc["metrics"] == []
    out_c, buf = _console()
    report.render(doc, out_c)
    text = buf.getvalue()
    assert "INTERRUPTED" in text and "no measurements" in text and "q1" not in text


def test_interrupted_in_the_second_policy_keeps_what_was_measured(dataset, tmp_path):
    steps_per_run = 2 + 2 * 2  # power: 2 queries; throughput: 2 streams x 2 queries
    stop = 3 * steps_per_run + 2  # wim: warm-up + 2 runs; then wic's warm-up
    with pytest.raises(KeyboardInterrupt):
        harness.run(_cfg(dataset, tmp_path, policies="wim,wic"), Steps(stop_at=stop), engine_cls=LocalEngine)
    doc = model.load(tmp_path / "out")
    assert doc["interrupted"] and doc["completed"]["policies"] == ["wim"]
    assert doc["completed"]["queries"] == {"wim": ["q1", "q6"]}
    assert doc["policies"]["wic"]["complete"] is False and doc["policies"]["wic"]["error"] == "interrupted"
    assert not any(m["labels"].get("policy") == "wic" for m in doc["metrics"])
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "results.csv" in names and "speedup_per_query.png" not in names  # one policy: nothing to compare
    rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 and all(r.startswith("wim,") for r in rows[1:])


def test_one_run_reports_no_stdev(dataset, tmp_path):
    doc = harness.run(_cfg(dataset, tmp_path, runs=1), Steps(), engine_cls=LocalEngine)
    q = doc["policies"]["wim"]["queries"]["q1"]
    assert q["n"] == 1 and q["stdev_s"] is None and q["ci95_s"] is None
    assert doc["summary"]["wim"]["total_ci95_s"] is None


def _console():
    import io

    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, width=200, no_color=True), buf
