"""PostgreSQL end to end at SF 0.01: `bench tpch` with every answer valid (refresh functions
applied), `up/status/query/down`, every process of a server bound (parallel workers included), and
nothing left behind on any exit path -- no server process, no System V segment, no dynamic shared
memory file, no socket or lock file, no data directory -- after `down`, Ctrl-C of a bench, `kill -9`
of tilewise (+ `tilewise restore`) and `kill -9` of a postmaster (+ `down`). Bad input gets one
`Error:` line naming the fix and starts nothing.

Runs as root (the servers then run as the `tilewise` system user that `make setup` creates) or as
any user (the servers run as that user)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import run_cli, tagged, wait_gone
from tilewise import cpulist, engines, plan, topology
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.engines.postgres import home, runtime

TAG = "TILEWISE_TEST_PG"


def _why_not() -> str | None:
    why = engines.get("postgres").missing()
    if why:
        return why
    try:
        home.run_as()
    except Exception as e:  # noqa: BLE001
        return str(e)
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=f"postgres: {_why_not()}")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pg-data")
    tpch_data.ensure_data(0.01, root)
    return root


@pytest.fixture
def pg_dir(monkeypatch):
    """The test's own directory for the servers' data directories (reachable by the server's user)."""
    d = runtime.DEFAULT_BASE / f"tilewise-test-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o711)
    os.chmod(d, 0o711)
    monkeypatch.setenv(runtime.DIR_VAR, str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tag(state_env, pg_dir):
    """Every process a test starts carries TAG=<value> (servers and backends inherit it); killed after."""
    value = uuid.uuid4().hex
    yield {**state_env, TAG: value, runtime.DIR_VAR: str(pg_dir)}, value
    for p in tagged(TAG, value):
        try:
            p.kill()
        except psutil.Error:
            pass


def roots() -> set[str]:
    """The deployments' directories in the test's own directory."""
    return {p.name for p in Path(os.environ[runtime.DIR_VAR]).glob("tilewise-postgres-*")}


def sysv_of(pids) -> list[str]:
    """System V shared memory segments created by these processes (/proc/sysvipc/shm: cpid)."""
    pids = {str(p) for p in pids}
    out = []
    with open("/proc/sysvipc/shm") as f:
        head = f.readline().split()
        for line in f:
            row = dict(zip(head, line.split()))
            if row.get("cpid") in pids:
                out.append(f"shmid {row['shmid']} of pid {row['cpid']}")
    return out


def dsm_of(pid: int) -> set[str]:
    """The dynamic shared memory files a running postmaster maps (its control segment at least)."""
    with open(f"/proc/{pid}/maps") as f:
        return {ln.split()[-1] for ln in f if "/dev/shm/PostgreSQL." in ln}


def postmasters(value: str) -> list[psutil.Process]:
    """Live postmasters carrying the test's tag (started with -D)."""
    out = []
    for p in tagged(TAG, value):
        try:
            if "-D" in p.cmdline():
                out.append(p)
        except psutil.Error:
            pass
    return out


def ipc_snapshot(pids) -> dict:
    return {"dsm": set().union(*(dsm_of(p) for p in pids)) if pids else set(), "pids": set(pids)}


def assert_nothing_left(value: str, snap: dict, before_roots: set[str]) -> None:
    assert not wait_gone(TAG, value, 30), "server processes left running"
    assert not sysv_of(snap["pids"]), "System V segments left"
    assert snap["dsm"] and not [f for f in snap["dsm"] if os.path.exists(f)], "dynamic shared memory left"
    assert roots() <= before_roots, "data/socket directories left"


def one_error_line(cp) -> str:
    """The one `Error:` line (progress lines may precede it; no traceback)."""
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in cp.stderr, cp.stderr
    return errors[0]


# ---- the benchmark -------------------------------------------------------------------------------------

def test_bench_tpch_every_answer_valid(data_root, tag, tmp_path):
    env, value = tag
    before = roots()
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    out = tmp_path / "res"
    cp = run_cli("bench", "tpch", "--engine", "postgres", "--sf", "0.01", "--policies", policy, "--runs", "1",
                 "--no-warmup", "--no-plots", "--data-dir", str(data_root), "--out", str(out), "--json",
                 env=env, timeout=600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    rec = doc["policies"][policy]
    assert rec["complete"] and not doc["validation"]["wrong_answers"] and not doc["validation"]["failed_queries"]
    assert all(q["valid"] is True for q in rec["queries"].values()) and len(rec["queries"]) == 22
    assert rec["queries"]["q17"].get("rewritten") and not rec["queries"]["q1"].get("rewritten")
    assert doc["refresh"]["applied"] is True
    run = rec["runs"][0]
    assert run["power"]["rf1_s"] > 0 and run["power"]["rf2_s"] > 0  # the refresh functions really ran
    for inst in rec["instances"]:
        assert inst["binding_verified"] is True
        s = inst["settings"]
        assert s["max_parallel_workers"] == str(len(inst["cpus"])) and s["jit"] in ("on", "off")
        assert int(s["shared_buffers"].removesuffix("MB")) >= 128 and inst["load_s"] >= 0
    assert not wait_gone(TAG, value, 30)
    assert not sysv_of(i["pid"] for i in rec["instances"])
    assert roots() <= before


@pytest.mark.slow
def test_bench_jcch_every_answer_valid(tag, tmp_path):
    env, value = tag
    data = tmp_path / "jcch"
    out = tmp_path / "res"
    cp = run_cli("bench", "jcch", "--engine", "postgres", "--sf", "0.01", "--policies", "wim",
                 "--runs", "1", "--no-warmup", "--no-plots", "--data-dir", str(data), "--out", str(out),
                 "--query-timeout", "300", env=env, timeout=900)
    assert cp.returncode == 0, cp.stderr[-3000:]
    rec = json.loads((out / "results.json").read_text())["policies"]["wim"]
    assert len(rec["queries"]) == 22 and all(q["valid"] is True for q in rec["queries"].values())
    assert rec["queries"]["q17"].get("rewritten")
    assert not wait_gone(TAG, value, 30)


# ---- a cluster that outlives the command ---------------------------------------------------------------------

def test_up_status_query_down(data_root, tag):
    env, value = tag
    before = roots()
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    want = plan.plan(topology.load(None), policy)
    cp = run_cli("up", "--engine", "postgres", "--policy", policy, "--sf", "0.01", "--data-dir", str(data_root),
                 "--name", "pg", "--worker-memory", "1g", "--json", env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["healthy"] and doc["engine"] == "postgres"
    st = json.loads(run_cli("status", "--name", "pg", "--json", env=env, timeout=60).stdout)
    workers = sorted(st["members"], key=lambda m: m["instance"])
    assert len(workers) == len(want.instances)
    for w, inst in zip(workers, want.instances):
        assert w["binding_verified"] is True and w["healthy"] and w["memory_mb"] == 1024
        names = [p["name"] for p in w["processes"]]
        assert w["processes"][0]["pid"] == w["pid"] and any("checkpointer" in n for n in names)
        assert all(p["verification"] == "verified" for p in w["processes"])  # the whole tree, from /proc
        for p in w["processes"]:
            assert tuple(sorted(psutil.Process(p["pid"]).cpu_affinity())) == tuple(inst.cpus)
        assert Path(w["socket_dir"], f".s.PGSQL.{w['port']}").exists()
    snap = ipc_snapshot([w["pid"] for w in workers])
    for inst in want.instances:
        q = run_cli("query", "--name", "pg", "--instance", str(inst.id), "--json",
                    "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem", env=env, timeout=60)
        assert q.returncode == 0, q.stderr
        qd = json.loads(q.stdout)
        assert qd["instance"] == inst.id and qd["rows"][0][0] == 60175
    bad = run_cli("query", "--name", "pg", "SELECT * FROM nope", env=env, timeout=60)
    assert bad.returncode == 1 and "nope" in one_error_line(bad)
    assert run_cli("query", "--name", "pg", "--instance", "9", "SELECT 1", env=env).returncode == 2
    # a query that outlives --timeout is cancelled by the server and said so
    slow = run_cli("query", "--name", "pg", "--timeout", "0.5", "SELECT pg_sleep(5)", env=env, timeout=60)
    assert slow.returncode == 1 and "did not finish within 0.5 s" in one_error_line(slow)
    # TCP with the cluster's password (the socket needs none)
    w = workers[0]
    pw = Path(w["socket_dir"]).parent.parent.joinpath("password").read_text().strip()
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=w["port"], user="tilewise", dbname="tilewise", password=pw) as c:
        assert c.execute("SELECT count(*) FROM nation").fetchone()[0] == 25
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=w["port"], user="tilewise", dbname="tilewise", password="wrong")
    down = run_cli("down", "--name", "pg", "--json", env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert w["pid"] in json.loads(down.stdout)["stopped_pids"]  # shut down when asked: still reported stopped
    assert_nothing_left(value, snap, before)
    assert not Path(w["socket_dir"]).exists()


def test_parallel_workers_are_bound(pg_dir):
    """A parallel query's workers are forked by the postmaster after start: they inherit its binding."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("a parallel worker needs an instance of 2 CPUs")
    p = plan.plan(topology.load(None), "wim")
    rt = engines.get("postgres").runtime_class()()
    rt.start(p, memory_mb={i.id: 512 for i in p.instances})
    try:
        m = rt.workers()[0]
        rt.run_query("CREATE TABLE t WITH (fillfactor = 10) AS SELECT g FROM generate_series(1, 2000) g")
        rt.run_query("ANALYZE t")
        seen: list = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                for pr in rt.verify_tree(m)["processes"]:
                    if "parallel worker" in pr["name"]:
                        seen.append(pr)
                time.sleep(0.1)

        slow = "SELECT count(*) FROM t WHERE pg_sleep(0.001) IS NOT NULL"  # ~2 s over two processes
        th = threading.Thread(target=sample)
        th.start()
        try:
            with rt._connection(m.instance) as conn:
                for stmt in ("SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0",
                             "SET min_parallel_table_scan_size = 0"):
                    conn.execute(stmt)
                assert "Gather" in "\n".join(r[0] for r in conn.execute("EXPLAIN " + slow).fetchall())
                conn.execute(slow).fetchall()
        finally:
            stop.set()
            th.join()
        assert seen, "no parallel worker was seen"
        want = cpulist.format(m.binding.cpus)
        assert all(pr["verification"] == "verified" and pr["cpus"] == want for pr in seen), seen
    finally:
        rt.stop()


# ---- every exit path --------------------------------------------------------------------------------------

def _start_bench(env: dict, data_root: Path, out: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "tilewise"
    return subprocess.Popen([str(exe), "bench", "tpch", "--engine", "postgres", "--sf", "0.01", "--policies", "wim",
                             "--runs", "20", "--no-plots", "--data-dir", str(data_root), "--out", str(out)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_running(value: str, proc: subprocess.Popen, timeout: float = 240) -> list[psutil.Process]:
    """The bench's postmasters once a backend of theirs runs queries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        pms = postmasters(value)
        if pms and any("postgres: " in " ".join(c.cmdline()) and "tilewise tilewise" in " ".join(c.cmdline())
                       for p in pms for c in _children(p)):
            return pms
        time.sleep(0.2)
    raise AssertionError("the bench's servers never ran a query")


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children()
    except psutil.Error:
        return []


def test_ctrl_c_of_bench_leaves_nothing(data_root, tag, tmp_path):
    env, value = tag
    before = roots()
    proc = _start_bench(env, data_root, tmp_path / "res")
    try:
        pms = _wait_running(value, proc)
        snap = ipc_snapshot([p.pid for p in pms])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert_nothing_left(value, snap, before)


def test_kill_9_of_tilewise_then_restore(data_root, tag, tmp_path):
    env, value = tag
    before = roots()
    proc = _start_bench(env, data_root, tmp_path / "res")
    try:
        pms = _wait_running(value, proc)
        snap = ipc_snapshot([p.pid for p in pms])
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the postmaster got SIGINT when its parent died (its fast shutdown); restore removes the rest
    rs = run_cli("restore", env=env, timeout=120)
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert_nothing_left(value, snap, before)


def test_down_cleans_up_after_a_killed_postmaster(tag):
    env, value = tag
    before = roots()
    cp = run_cli("up", "--engine", "postgres", "--policy", "wim", "--name", "pgk", "--worker-memory", "512m",
                 "--json", env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    pid = json.loads(cp.stdout)["members"][0]["pid"]
    snap = ipc_snapshot([pid])
    os.kill(pid, signal.SIGKILL)  # no shutdown: its segments stay until PostgreSQL itself removes them
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sysv_of([pid]), "a killed postmaster leaves its System V segment (PostgreSQL's interlock)"
    st = run_cli("status", "--name", "pgk", "--json", env=env, timeout=60)
    assert st.returncode == 3 and not json.loads(st.stdout)["healthy"]
    down = run_cli("down", "--name", "pgk", "--json", env=env, timeout=180)
    assert down.returncode == 0, down.stderr
    assert_nothing_left(value, snap, before)


# ---- bad input --------------------------------------------------------------------------------------------

def _up(env: dict, *extra: str):
    return run_cli("up", "--engine", "postgres", "--policy", "wim", "--name", "bad", *extra, env=env, timeout=180)


def _nothing_started(env: dict, value: str, before: set[str]) -> None:
    assert not wait_gone(TAG, value, 20)
    assert roots() <= before
    assert not list(Path(env["TILEWISE_CLUSTER_DIR"]).glob("bad.json"))


def test_bad_input_port_in_use(tag):
    env, value = tag
    before = roots()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cp = _up({**env, runtime.PORT_VAR: str(port)})
    line = one_error_line(cp)
    assert cp.returncode == 2 and f"port {port}" in line and "in use" in line and runtime.PORT_VAR in line
    _nothing_started(env, value, before)


def test_bad_input_unwritable_data_directory(tag, tmp_path):
    env, value = tag
    before = roots()
    f = tmp_path / "a-file"
    f.write_text("")
    cp = _up({**env, runtime.DIR_VAR: str(f)})
    line = one_error_line(cp)
    assert cp.returncode == 2 and "is not a directory" in line and runtime.DIR_VAR in line
    if os.geteuid() == 0:  # a directory the server's user cannot enter
        closed = tmp_path / "closed"
        closed.mkdir(mode=0o700)
        cp = _up({**env, runtime.DIR_VAR: str(closed)})
        line = one_error_line(cp)
        assert cp.returncode == 2 and "cannot enter" in line and runtime.DIR_VAR in line
    _nothing_started(env, value, before)


def test_bad_input_memory_the_server_refuses(tag):
    env, value = tag
    before = roots()
    cp = _up(env, "--worker-memory", "40t")  # shared_buffers 10 TB: above PostgreSQL's limit
    line = one_error_line(cp)
    assert cp.returncode == 1 and "shared_buffers" in line and "--worker-memory" in line
    _nothing_started(env, value, before)


def test_bad_input_missing_server_binary(tag, tmp_path):
    env, value = tag
    before = roots()
    cp = _up({**env, home.BIN_VAR: str(tmp_path / "no-postgres")})
    line = one_error_line(cp)
    assert cp.returncode != 0 and home.BIN_VAR in line and "postgres and initdb" in line
    _nothing_started(env, value, before)


def test_a_server_that_cannot_start_names_a_log_that_exists(data_root, tag, tmp_path):
    """Under `ulimit -n 32` the server refuses to start: the error quotes its FATAL line and names its
    log, which is kept (the run's sockets and data go); for `up` and for a benchmark alike."""
    env, value = tag
    before = roots()
    scratch = tmp_path / "s"
    scratch.mkdir()
    exe = str(Path(sys.executable).parent / "tilewise")
    for argv in (["up", "--engine", "postgres", "--policy", "wim", "--name", "bad", "--sf", "0.01",
                  "--data-dir", str(data_root)],
                 ["bench", "tpch", "--engine", "postgres", "--sf", "0.01", "--data-dir", str(data_root),
                  "--policies", "wim", "--runs", "1", "--no-warmup", "--no-plots", "--tests", "power",
                  "--out", str(tmp_path / "res")]):
        cp = subprocess.run(["bash", "-c", 'ulimit -n 32; exec "$@"', "-", exe, *argv], capture_output=True,
                            text=True, timeout=180, env={**os.environ, **env, "TMPDIR": str(scratch)})
        line = one_error_line(cp)
        assert cp.returncode == 1 and "did not start" in line and "file descriptors" in line, line
        log = Path(line.rsplit("see its log (kept): ", 1)[1])
        assert log.is_file() and "FATAL" in log.read_text(), line
        kept = log.parent.parent
        assert [p.name for p in kept.iterdir()] == ["logs"]  # nothing but the logs
        shutil.rmtree(kept)
        _nothing_started(env, value, before)


def test_a_failing_initdb_leaves_nothing(tag, tmp_path, monkeypatch):
    """A benchmark's start that fails before any server runs (initdb exits 1) removes the deployment's
    directory itself (a benchmark's journal is its own: committed once everything was stopped)."""
    from tilewise.errors import TilewiseError

    env, value = tag
    before = roots()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "postgres").symlink_to(home.bindir() / "postgres")
    (bindir / "initdb").write_text("#!/bin/sh\necho 'initdb: error: no space left on device' >&2\nexit 1\n")
    (bindir / "initdb").chmod(0o755)
    monkeypatch.setenv(home.BIN_VAR, str(bindir))
    p = plan.plan(topology.load(None), "wim")
    rt = engines.get("postgres").runtime_class()()
    with pytest.raises(TilewiseError, match="initdb"):  # as root the server's user may not even reach it
        rt.start(p, memory_mb={i.id: 512 for i in p.instances})
    assert roots() <= before
    assert not wait_gone(TAG, value, 5)


@pytest.mark.root
def test_bad_input_root_without_a_user(tag):
    env, value = tag
    before = roots()
    cp = _up({**env, home.USER_VAR: "tilewise-no-such-user"})
    line = one_error_line(cp)
    assert cp.returncode == 2 and "refuses to run as root" in line and "useradd" in line
    _nothing_started(env, value, before)
