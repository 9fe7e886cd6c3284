"""The ClickHouse engine (chdb): `bench tpch --engine clickhouse` at SF 0.01 with every answer valid
(refresh functions applied on every replica), `up/status/query/down`, the refresh functions' all or
nothing, nothing left running after `down` or a Ctrl-C of the bench, and bad input as one `Error:`
line with nothing half-started. chdb is part of `make test` (the `clickhouse` extra: `tilewise engines install clickhouse`): these tests
run in the default suite and fail, naming the install, where it is missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_cli, tagged, wait_gone
from tilewise import cpulist, engines, plan, topology
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.data import Dataset
from tilewise.engines.clickhouse import server
from tilewise.engines.contract import Query
from tilewise.engines.replicas import Client

SERVER = "tilewise.engines.clickhouse.server"
# `tilewise` with chdb hidden from this Python (as where it is not installed): sys.modules[name] = None
# makes importlib.util.find_spec() answer None and `import chdb` fail
WITHOUT_CHDB = "import sys; sys.modules['chdb'] = None; from tilewise.cli import main; main(sys.argv[1:])"


@pytest.fixture(scope="module", autouse=True)
def chdb_installed():
    why = engines.missing("clickhouse")
    if why:
        pytest.fail(f"the ClickHouse tests need chdb ({why})")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-data")
    tpch_data.ensure_data(0.01, root)
    return root


def _policy() -> str:
    return "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"


def _servers(tag: str) -> list[psutil.Process]:
    return [p for p in tagged("TILEWISE_TEST_TAG", tag) if SERVER in " ".join(p.cmdline())]


# ---- without servers ------------------------------------------------------------------------------

def test_refresh_statements_are_planned_or_refused():
    """The server applies (and can undo) INSERT ... SELECT and DELETE ... WHERE; anything else is
    refused before a row changes."""
    assert server._plan("INSERT INTO orders SELECT * FROM file('/x.parquet', Parquet)") == \
        ("insert", "orders", "SELECT * FROM file('/x.parquet', Parquet)")
    assert server._plan("DELETE FROM lineitem WHERE l_orderkey IN (SELECT 1)") == \
        ("delete", "lineitem", "l_orderkey IN (SELECT 1)")
    with pytest.raises(ValueError, match="only"):
        server._plan("UPDATE orders SET o_comment = ''")


def test_tpch_q5_keeps_its_join_order_and_nothing_else_changes():
    from tilewise.benchmarks.tpch import queries

    spec = engines.get("clickhouse")
    for n in queries.NUMBERS:
        text = queries.load(n)
        for bench in ("tpch", "jcch"):
            out = spec.sql(text, Query(bench, n, 0, f"q{n:02d}"))
            if n == 5:
                assert out == text + "\nSETTINGS query_plan_optimize_join_order_limit = 0"
            else:
                assert out == text
    assert set(spec.dialect.table["tpch"]) == set(spec.dialect.table["jcch"]) == {"5"}


# ---- the benchmark ----------------------------------------------------------------------------------

def test_bench_tpch_every_answer_valid(tmp_path, data_root):
    out = tmp_path / "res"
    policies = _policy()  # several instances where there are cores for them: the refresh functions reach every replica
    cp = run_cli("bench", "tpch", "--engine", "clickhouse", "--sf", "0.01", "--policies", policies, "--runs", "1",
                 "--no-plots", "--out", str(out), "--data-dir", str(data_root), "--json", timeout=300,
                 env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["params"]["engine"] == "clickhouse" and doc["environment"]["engines"]["clickhouse"].startswith("chdb 4.")
    assert doc["refresh"]["applied"] is True and [s["set"] for s in doc["refresh"]["sets"]] == [1, 2, 3]
    want = {label: plan.plan(topology.load(None), label) for label in policies.split(",")}
    for label, pol in doc["policies"].items():
        assert len(pol["instances"]) == len(want[label].instances)
        for inst in pol["instances"]:
            assert inst["binding_verified"] is True and inst["threads"] == len(inst["cpus"])  # max_threads = cores
            assert inst["rss_peak_mb"] >= inst["rss_loaded_mb"] >= inst["rss_anon_loaded_mb"] > 0  # RSS per instance
        assert sorted(pol["queries"], key=lambda q: int(q[1:])) == [f"q{n}" for n in range(1, 23)]
        assert all(rec["valid"] is True for rec in pol["queries"].values()), \
            {q: rec.get("detail") or rec.get("error") for q, rec in pol["queries"].items() if rec["valid"] is not True}
        assert pol["queries"]["q5"]["rewritten"] is True and not pol["queries"]["q13"].get("rewritten")
        for r in pol["runs"]:
            assert r["power"]["rf1_s"] > 0 and r["qphh_at_size"] > 0
    assert not _servers(str(tmp_path))


def test_bench_jcch_power_every_answer_valid(tmp_path_factory, tmp_path):
    """JCC-H's 22 queries with its skewed parameters, one power test (its refresh functions are
    TPC-H's, checked above)."""
    from tilewise.benchmarks.jcch import data as jcch

    root = tmp_path_factory.mktemp("jcch-data")
    jcch.dataset(0.01, root, seed=0)
    cp = run_cli("bench", "jcch", "--engine", "clickhouse", "--sf", "0.01", "--policies", "wim", "--runs", "1",
                 "--tests", "power", "--no-refresh", "--no-plots", "--out", str(tmp_path / "j"),
                 "--data-dir", str(root), "--json", timeout=300, env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr[-3000:]
    queries = json.loads(cp.stdout)["policies"]["wim"]["queries"]
    assert len(queries) == 22 and all(rec["valid"] is True for rec in queries.values())
    assert not _servers(str(tmp_path))


# ---- up / status / query / refresh / down ---------------------------------------------------------

def test_up_status_query_refresh_down(state_env, data_root):
    env = {**state_env, "TILEWISE_TEST_TAG": state_env["TILEWISE_CLUSTER_DIR"]}
    d = Path(env["TILEWISE_CLUSTER_DIR"])
    want = plan.plan(topology.load(None), _policy())
    cp = run_cli("up", "--engine", "clickhouse", "--policy", _policy(), "--sf", "0.01", "--data-dir", str(data_root),
                 "--name", "ch", "--worker-memory", "1g", "--json", env=env, timeout=240)
    try:
        assert cp.returncode == 0, cp.stderr
        doc = json.loads(cp.stdout)
        assert doc["healthy"] and doc["engine"] == "clickhouse"
        workers = sorted(doc["members"], key=lambda m: m["instance"])
        assert [m["role"] for m in workers] == ["worker"] * len(want.instances)
        for w, inst in zip(workers, want.instances):  # bound through the process edge, read back here too
            assert tuple(sorted(psutil.Process(w["pid"]).cpu_affinity())) == tuple(inst.cpus)
            assert w["cpus"] == cpulist.format(inst.cpus) and w["binding_verified"] is True
            assert w["threads"] == len(inst.cpus) and w["memory_mb"] == 1024
            assert oct(Path(w["socket"]).stat().st_mode & 0o777) == "0o600"
            work = d / "ch" / "work" / f"instance-{inst.id}" / "chdb"  # ClickHouse's files: in the cluster's own
            assert work.is_dir() and oct(work.parent.stat().st_mode & 0o777) == "0o700"
        for inst in want.instances:  # each instance answers from its own copy
            q = run_cli("query", "--name", "ch", "--instance", str(inst.id), "--json",
                        "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem", env=env, timeout=60)
            assert q.returncode == 0, q.stderr
            qd = json.loads(q.stdout)
            assert qd["instance"] == inst.id and qd["columns"] == ["n", "q"] and qd["rows"][0][0] == 60175
        bad = run_cli("query", "--name", "ch", "--instance", "0", "SELECT * FROM nope", env=env, timeout=60)
        assert bad.returncode == 1 and bad.stderr.startswith("Error: ") and "nope" in bad.stderr
        sock = workers[0]["socket"]
        with Client(sock, 0, "ClickHouse").connect() as c:
            # a query that fails while running, then others on the same server: right answers (chdb
            # hands the next answer on a failed connection the failed one's output; it is closed)
            with pytest.raises(Exception, match="Division by zero"):
                c.query("SELECT sum(toDecimal64(number, 2) / toDecimal64(number % 2, 2)) FROM numbers(10)")
            for _ in range(3):
                assert c.query("SELECT count(*) FROM orders").rows == [(15000,)]
            assert c.info()["connections_discarded"] >= 1
            # a refresh function is all or nothing: the second statement fails, the first is undone
            rows = lambda: c.query("SELECT count(*), sum(o_totalprice) FROM orders").rows  # noqa: E731
            before = rows()
            reply = c.request({"op": "execute", "sql": [
                "DELETE FROM orders WHERE o_orderkey < 100",
                "INSERT INTO orders SELECT * FROM orders WHERE o_orderkey < 100",
                "INSERT INTO lineitem SELECT * FROM no_such_table"]}, "applying")
            assert reply["ok"] is False and "no_such_table" in reply["error"]
            assert rows() == before
            assert c.query("SELECT count(*) FROM system.tables WHERE name LIKE '_tilewise_undo_%'").rows == [(0,)]
            reply = c.request({"op": "execute", "sql": ["DELETE FROM orders WHERE o_orderkey < 100"]}, "applying")
            assert reply["ok"] is True and rows()[0][0] < before[0][0]
        st = run_cli("status", "--name", "ch", "--json", env=env, timeout=60)
        assert st.returncode == 0 and json.loads(st.stdout)["healthy"] is True
    finally:
        dn = run_cli("down", "--name", "ch", "--json", env=env, timeout=60)
    assert dn.returncode == 0, dn.stderr
    assert not wait_gone("TILEWISE_CLUSTER_DIR", str(d)), "ClickHouse servers left after down"
    assert not list(d.glob("*.json")) and not (d / "ch").exists()  # chdb's directory went with it


def test_sigint_of_bench_leaves_nothing(tmp_path, data_root):
    """Ctrl-C in the middle of a run: exit 130, every server stopped, no file of theirs left (chdb's
    database directory lives in the run's temporary directory, which goes too)."""
    out = tmp_path / "i"
    tmp = Path(tempfile.mkdtemp(prefix="tw-ch-"))  # short: the servers' socket paths live under it
    exe = str(Path(sys.executable).parent / "tilewise")
    proc = subprocess.Popen([exe, "bench", "tpch", "--engine", "clickhouse", "--sf", "0.01", "--policies", _policy(),
                             "--runs", "1000", "--queries", "1,6", "--no-plots", "--out", str(out),
                             "--data-dir", str(data_root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TILEWISE_TEST_TAG=str(tmp_path), TMPDIR=str(tmp)))
    try:
        seen: list[psutil.Process] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            seen = seen or _servers(str(tmp_path))
            try:
                if json.loads((out / "results.json").read_text())["policies"][_policy()]["runs"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        assert seen, f"no ClickHouse server appeared (bench: {proc.poll()})"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path)), "processes left after Ctrl-C"
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in seen)
    left = list(tmp.iterdir())
    shutil.rmtree(tmp, ignore_errors=True)
    assert not left, left  # the run's directory (logs, sockets, chdb's files)


# ---- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", [["bench", "tpch", "--sf", "0.01", "--policies", "wim", "--out", "OUT"],
                                 ["up", "--sf", "0.01", "--name", "x"]])
def test_chdb_missing_is_one_error_naming_the_install(tmp_path, state_env, cmd):
    args = [str(tmp_path / "o") if a == "OUT" else a for a in cmd]
    cp = subprocess.run([sys.executable, "-c", WITHOUT_CHDB, *args, "--engine", "clickhouse"],
                        capture_output=True, text=True, timeout=120, env={**os.environ, **state_env})
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 1 and len(lines) == 1, cp.stderr
    assert lines[0] == ("Error: ClickHouse cannot run here: the Python package chdb (in-process ClickHouse) is not "
                        "installed: run `tilewise engines install clickhouse` (about 0.9 GB installed: chdb and chdb-core)")
    assert not (tmp_path / "o").exists() and not list(Path(state_env["TILEWISE_CLUSTER_DIR"]).glob("*.json"))


def test_memory_clickhouse_refuses_is_one_error_and_nothing_runs(tmp_path, data_root, state_env):
    """A --worker-memory ClickHouse would lower (above 90 % of the memory it sees): refused before a
    query runs, every server stopped and its files gone, for bench and up alike."""
    tag = str(tmp_path)
    tmp = Path(tempfile.mkdtemp(prefix="tw-ch-"))  # the bench's run directory goes here
    env = {**state_env, "TILEWISE_TEST_TAG": tag, "TMPDIR": str(tmp)}
    try:
        for cmd in (["bench", "tpch", "--out", str(tmp_path / "o"), "--policies", "wim", "--queries", "1"],
                    ["up", "--name", "big"]):
            cp = run_cli(*cmd, "--engine", "clickhouse", "--sf", "0.01", "--data-dir", str(data_root),
                         "--worker-memory", "64t", env=env, timeout=120)
            lines = cp.stderr.strip().splitlines()
            assert cp.returncode == 2 and lines[-1].startswith("Error: ClickHouse instance 0: ClickHouse lowers "
                                                                 "max_server_memory_usage to "), cp.stderr
            assert "Traceback" not in cp.stderr and "use --worker-memory" in lines[-1]
            assert not wait_gone("TILEWISE_TEST_TAG", tag)
        left = list(tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert not left, left
    clusters = Path(state_env["TILEWISE_CLUSTER_DIR"])
    assert not list(clusters.glob("*.json")) and not (clusters / "big").exists()


def test_tables_that_do_not_fit_are_refused_by_the_server(tmp_path):
    """A server whose tables exceed its memory limit says so on one line and exits 2 before it
    listens (the runtime turns that line into the user's error)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"s": [f"{i:0>200}" for i in range(1_500_000)]}), big)  # ~300 MB as ClickHouse Strings
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"big": str(big)}))
    work = tmp_path / "work"
    work.mkdir()
    cp = subprocess.run([sys.executable, "-m", SERVER, "--socket", str(tmp_path / "s.sock"), "--tables", str(tables),
                         "--memory-mb", "256", "--workdir", str(work)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith(server.serve.REFUSED)]
    assert line, cp.stdout + cp.stderr
    why = json.loads(line[0][len(server.serve.REFUSED):])
    assert "table big does not fit in ClickHouse's memory limit" in why["message"] and "--worker-memory" in why["hint"]
    assert not (tmp_path / "s.sock").exists()


def test_each_instance_bound_and_sized_from_its_cores(data_root):
    """The runtime directly: every server bound as planned (read back from /proc), max_threads = its CPUs."""
    from tilewise.engines.clickhouse.runtime import ClickHouseServers

    p = plan.plan(topology.load(None), _policy())
    with ClickHouseServers() as eng:
        eng.start(p, dataset=Dataset.at(data_root / "sf0.01", sf=0.01), memory_mb={i.id: 512 for i in p.instances})
        for inst, st in zip(p.instances, eng.status()):
            assert st.binding_verified and st.healthy
            with open(f"/proc/{st.pid}/status") as f:
                fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            assert cpulist.parse(fields["Cpus_allowed_list"].strip()) == tuple(sorted(inst.cpus))
            info = eng.info(inst.id)
            assert info["threads"] == len(inst.cpus) and info["version"].startswith("ClickHouse 26.")
        pids = [s.pid for s in eng.status()]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_a_preloaded_allocator_is_refused_before_anything_starts(tmp_path, data_root, state_env):
    """chdb links jemalloc and aborts under any preloaded allocator: bench and up refuse it in one
    line before a server starts (tune --engine does the same for --allocators)."""
    tag = str(tmp_path)
    env = {**state_env, "TILEWISE_TEST_TAG": tag}
    for cmd in (["bench", "tpch", "--out", str(tmp_path / "o"), "--policies", "wim", "--queries", "1"],
                ["up", "--name", "alloc"]):
        cp = run_cli(*cmd, "--engine", "clickhouse", "--sf", "0.01", "--data-dir", str(data_root),
                     "--allocator", "tcmalloc", env=env, timeout=120)
        assert cp.returncode == 2, cp.stderr
        assert cp.stderr.strip().splitlines()[-1] == (
            "Error: ClickHouse links its own allocator (jemalloc): preloading tcmalloc into it makes it abort (memory "
            "one allocator hands out, the other frees); use --allocator system"), cp.stderr
        assert not wait_gone("TILEWISE_TEST_TAG", tag)
    assert not (tmp_path / "o" / "results.json").exists()
