"""After kill -9 of a benchmark, `tilewise restore` removes the run's own working directory (its
sockets, logs, tables.json, spill directories) as it stops what the run started: the directory is
journaled before it exists."""

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

import pytest

from conftest import run_cli, wait_gone


@pytest.fixture
def short_tmp():
    """A TMPDIR short enough for the run's sockets (a long one makes runs use /tmp instead)."""
    d = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    d.chmod(0o711)  # the user PostgreSQL runs as (root runs it as `tilewise`) enters it
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("engine", ["duckdb", "tiles"])
def test_restore_after_kill_9_of_a_benchmark_removes_its_working_directory(tmp_path, tpch_sf001, short_tmp, engine):
    """tiles: its workers' sockets (unix, shm) live in the working directory; its rings are memfds, so
    no shared-memory file can outlive the processes."""
    from tilewise import engines

    why = engines.get(engine).missing()
    if why:
        pytest.skip(why)
    tmp = short_tmp
    env = {**os.environ, "TMPDIR": str(tmp), "TILEWISE_STATE_DIR": str(tmp_path / "state"),
           "TILEWISE_TEST_TAG": str(tmp_path)}
    shm_before = set(os.listdir("/dev/shm"))
    bench = subprocess.Popen(
        [sys.executable, "-m", "tilewise", "bench", "tpch", "--engine", engine, "--sf", "0.01", "--data-dir",
         str(tpch_sf001), "--policies", "wic" if engine == "tiles" else "wim", "--runs", "500", "--no-warmup",
         "--tests", "power", "--no-refresh", "--no-plots", "--out", str(tmp_path / "out")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not [d for d in tmp.glob(f"tilewise-{engine}-*") if (d / "logs").is_dir()]:
            assert bench.poll() is None, "the benchmark ended before its servers started"
            assert time.monotonic() < deadline, "no working directory appeared"
            time.sleep(0.1)
        [work] = tmp.glob(f"tilewise-{engine}-*")
        time.sleep(1.5)  # its servers are up and answering
    finally:
        bench.send_signal(signal.SIGKILL)
        bench.wait()
    assert work.is_dir()  # nothing of tilewise ran to remove it
    cp = run_cli("restore", "--json", env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert not work.exists() and not list(tmp.iterdir()), list(tmp.iterdir())
    assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path), 10)  # no worker, no coordinator
    assert set(os.listdir("/dev/shm")) <= shm_before
    assert str(work) in json.dumps(json.loads(cp.stdout))  # restore says what it removed
    again = run_cli("restore", env=env, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout
    assert not Path(tmp_path / "state" / "journals").exists() or not list((tmp_path / "state" / "journals").iterdir())


def _bench(tmp_path, data_dir, engine: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tilewise", "bench", "tpch", "--engine", engine, "--sf", "0.01", "--data-dir",
         str(data_dir), "--policies", "wim", "--runs", "500", "--no-warmup", "--tests", "power",
         "--no-refresh", "--no-plots", "--out", str(tmp_path / "out")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


# Spark and Trino take about a minute each here (their JVMs' start): with the slow tests
# (TILEWISE_SLOW=1, `make test-all`); the deferral under test is the contract's, wrapped around every
# engine's stop() alike (engines.contract.Runtime.__init_subclass__)
@pytest.mark.parametrize("engine", ["duckdb", "postgres", "clickhouse", "tiles", pytest.param("spark", marks=pytest.mark.slow),
                                    pytest.param("trino", marks=pytest.mark.slow)])
def test_a_burst_of_ctrl_c_during_clean_up_leaves_nothing(tmp_path, tpch_sf001, engine, short_tmp):
    """SIGINT every 0.1 s from the first one on, through the whole clean-up: the run still stops and
    removes everything it made (processes, working and data directories, its journal)."""
    from tilewise import engines

    why = engines.get(engine).missing()
    if why:
        pytest.skip(why)
    tmp = short_tmp
    state = tmp_path / "state"
    env = {**os.environ, "TMPDIR": str(tmp), "TILEWISE_STATE_DIR": str(state), "TILEWISE_POSTGRES_DIR": str(tmp)}
    bench = _bench(tmp_path, tpch_sf001, engine, env)
    deadline = time.monotonic() + 240
    while not (tmp_path / "out" / "results.json").exists() or not json.loads(
            (tmp_path / "out" / "results.json").read_text())["policies"].get("wim", {}).get("instances"):
        assert bench.poll() is None, bench.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "the servers did not start"
        time.sleep(0.2)
    made = sorted(p.name for p in tmp.iterdir())
    assert made  # its working directory (and PostgreSQL's data directory) exist now
    end = time.monotonic() + 4
    while bench.poll() is None and time.monotonic() < end:
        bench.send_signal(signal.SIGINT)
        time.sleep(0.1)
    _, err = bench.communicate(timeout=120)
    assert bench.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert not list(tmp.iterdir()), (made, list(tmp.iterdir()))
    assert not (state / "journals").exists() or not list((state / "journals").iterdir())
