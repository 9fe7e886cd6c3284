"""After kill -9 of a benchmark, `tilewise restore` removes the run's own working directory (its
sockets, logs, tables.json, spill directories) as it stops what the run started: the directory is
journaled before it exists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_cli


def test_restore_after_kill_9_of_a_benchmark_removes_its_working_directory(tmp_path, tpch_sf001):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "TILEWISE_STATE_DIR": str(tmp_path / "state")}
    bench = subprocess.Popen(
        [sys.executable, "-m", "tilewise", "bench", "tpch", "--sf", "0.01", "--data-dir", str(tpch_sf001),
         "--policies", "wim", "--queries", "1", "--runs", "500", "--no-warmup", "--tests", "power", "--no-refresh",
         "--no-plots", "--out", str(tmp_path / "out")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not [d for d in tmp.glob("tilewise-duckdb-*") if (d / "logs").is_dir()]:
            assert bench.poll() is None, "the benchmark ended before its servers started"
            assert time.monotonic() < deadline, "no working directory appeared"
            time.sleep(0.1)
        [work] = tmp.glob("tilewise-duckdb-*")
        time.sleep(0.5)  # its server is up and answering
    finally:
        bench.send_signal(signal.SIGKILL)
        bench.wait()
    assert work.is_dir()  # nothing of tilewise ran to remove it
    cp = run_cli("restore", "--json", env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert not work.exists() and not list(tmp.iterdir()), list(tmp.iterdir())
    assert str(work) in json.dumps(json.loads(cp.stdout))  # restore says what it removed
    again = run_cli("restore", env=env, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout
    assert not Path(tmp_path / "state" / "journals").exists() or not list((tmp_path / "state" / "journals").iterdir())
