"""The Spark engine adapter on a real local cluster at SF 0.01: workers and executors bound (read
back from /proc), a correct answer, and a killed worker reported (not hung on) and cleaned up."""

from __future__ import annotations

import os
import signal
import time

import duckdb
import psutil
import pytest

from tilewise import plan, topology
from tilewise.benchmarks.tpch import queries
from tilewise.data import Dataset
from tilewise.benchmarks.tpch import data as tpch_data
from tilewise.engines import get
from tilewise.engines import procgroup as sc
from tilewise.errors import TilewiseError, UsageError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tpch_data.ensure_data(0.01, tmp_path_factory.mktemp("tpch-data"))


def _java_with_token(token: str) -> list[psutil.Process]:
    return sc.tagged_processes(token)


def test_engine_binding_answer_and_killed_worker(data_dir):
    policy = "wic" if len(os.sched_getaffinity(0)) >= 2 else "wim"
    p = plan.plan(topology.load(None), policy)
    engine = get("spark").runtime_class()()
    token = None
    try:
        engine.start(p, dataset=Dataset.at(data_dir), memory_mb={i.id: 1024 for i in p.instances})  # --worker-memory 1g
        token = engine.token
        statuses = engine.status()
        assert [s.id for s in statuses] == [i.id for i in p.instances]
        for s, inst in zip(statuses, p.instances):
            assert s.healthy and s.binding_verified, s.detail
            assert tuple(sorted(psutil.Process(s.pid).cpu_affinity())) == tuple(inst.cpus)
            execs = s.extra["executors"]
            assert len(execs) == 1, "one executor per worker"
            # the executor inherited the worker's binding
            assert tuple(sorted(psutil.Process(execs[0]["pid"]).cpu_affinity())) == tuple(inst.cpus)
            assert execs[0]["binding_verified"]
            assert engine.info(inst.id)["threads"] == len(inst.cpus)
        # Q6 against DuckDB on the same files
        res = engine.run_query(queries.load(6))
        assert res.instance == -1 and res.elapsed_s > 0 and len(res.rows) == 1
        con = duckdb.connect()
        for t in ("lineitem",):
            con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data_dir}/{t}.parquet')")
        want = con.execute(queries.load(6)).fetchone()[0]
        assert abs(float(res.rows[0][0]) - float(want)) <= 1e-6 * abs(float(want))
        with pytest.raises(TilewiseError, match="spark query failed"):
            engine.run_query("SELECT * FROM no_such_table")
        with pytest.raises(UsageError):
            engine.run_query("SELECT 1", instance=0)
        # kill one worker (the executor it forked is left behind by the kernel)
        victim = statuses[-1].pid
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        bad = [s for s in engine.status() if s.pid == victim][0]
        assert not bad.healthy and "exited" in bad.detail
        t0 = time.monotonic()
        with pytest.raises(TilewiseError, match=f"worker .*{victim}.*exited"):
            engine.run_query(queries.load(1))
        assert time.monotonic() - t0 < 30, "a dead worker must be reported, not waited on"
    finally:
        engine.stop()
        engine.stop()  # idempotent
    assert token and not _java_with_token(token), "orphaned processes after stop()"
    assert engine.status() == []


def test_engine_refuses_missing_data(tmp_path):
    p = plan.plan(topology.load(None), "wim")
    with pytest.raises(UsageError, match="no Parquet data for table"):
        get("spark").runtime_class()().start(p, dataset=Dataset.at(tmp_path, table_names=("lineitem",)))
