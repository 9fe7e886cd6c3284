"""The tiles engine (issue 30, on the `tiles` branch): datafusion-distributed workers bound per tile
and a Flight SQL coordinator. End to end at SF 0.01 with 2 tiles over each exchange, every answer
valid; up/status/query/down through ADBC; a tile killed during a query; the build's one-line error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli, wait_gone
from tilewise import engines
from tilewise.engines.tiles import build

pytestmark = pytest.mark.skipif(engines.get("tiles").missing() is not None,
                                reason=f"tiles: {engines.get('tiles').missing()}")


@pytest.mark.parametrize("exchange", ["shm", "unix", "tcp"])
def test_bench_tpch_over_each_exchange_every_answer_valid(tpch_sf001, tmp_path, exchange):
    out = tmp_path / "res"
    cp = run_cli("bench", "tpch", "--engine", "tiles", "--exchange", exchange, "--sf", "0.01",
                 "--data-dir", str(tpch_sf001), "--policies", "wic", "--runs", "1", "--no-warmup",
                 "--tests", "power", "--no-plots", "--out", str(out), "--json",
                 env={"TILEWISE_TEST_TAG": str(tmp_path)}, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["params"]["exchange"] == exchange
    pol = next(iter(doc["policies"].values()))
    assert sorted(pol["queries"]) == sorted(f"q{n}" for n in range(1, 23))
    assert all(q["valid"] is True for q in pol["queries"].values()), pol["queries"]
    assert all(i["binding_verified"] is True for i in pol["instances"])
    assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path), 10)


def test_up_query_over_flight_sql_and_a_killed_tile(tpch_sf001, state_env, tmp_path):
    env = {**state_env, "TILEWISE_TEST_TAG": str(tmp_path)}
    cp = run_cli("up", "--engine", "tiles", "--policy", "wic", "--sf", "0.01", "--data-dir", str(tpch_sf001),
                 "--name", "t", "--json", env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    up = json.loads(cp.stdout)
    try:
        uri = up["endpoint"]
        assert uri.startswith("grpc://")
        # a standard client: the ADBC Flight SQL driver
        import adbc_driver_flightsql.dbapi as flightsql

        with flightsql.connect(uri) as con, con.cursor() as cur:
            cur.execute("select count(*) as n from lineitem")
            assert cur.fetch_arrow_table().column("n").to_pylist() == [60175]
        workers = [m for m in up["members"] if m["role"] == "worker"]
        os.kill(workers[1]["pid"], signal.SIGKILL)
        cp = run_cli("query", "--name", "t", "select l_returnflag, count(*) from lineitem group by 1", env=env,
                     timeout=60)
        assert cp.returncode != 0 and cp.stderr.count("Error:") == 1
        st = json.loads(run_cli("status", "--name", "t", "--json", env=env, timeout=60).stdout)
        assert st["healthy"] is False
    finally:
        cp = run_cli("down", "--name", "t", env=env, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path), 10)


def test_a_failing_build_is_one_line_with_the_compilers_first_error_and_the_log(tmp_path, monkeypatch):
    crate = tmp_path / "crate"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(textwrap.dedent("""\
        [package]
        name = "tilewise-tiles"
        version = "0.0.0"
        edition = "2021"
        [profile.tilewise]
        inherits = "release"
        opt-level = 1
        """))
    (crate / "src" / "main.rs").write_text("fn main() { let x: u32 = \"no\"; }\n")
    subprocess.run(["cargo", "generate-lockfile"], cwd=crate, check=True, capture_output=True)
    monkeypatch.setattr(build, "CRATE", crate)
    monkeypatch.setenv(build.CACHE_VAR, str(tmp_path / "cache"))
    from tilewise.errors import TilewiseError

    with pytest.raises(TilewiseError) as e:
        build.build()
    text = str(e.value)
    assert "error[E0308]: mismatched types" in text and "src/main.rs" in text
    log = Path(text.rsplit("the whole log: ", 1)[1])
    assert log.is_file() and "mismatched types" in log.read_text()
