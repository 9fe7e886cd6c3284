"""`tilewise tune --engine postgres` with two allocators at SF 0.01 (paper 003's study on
PostgreSQL): the allocator is preloaded into the postmaster and every process it forks maps it
(backends, background workers), every answer is checked, the engine is restarted for the allocator
and stopped after. Skipped where PostgreSQL is not installed (`make setup`)."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli, wait_gone
from tilewise import engines

pytestmark = pytest.mark.skipif(bool(engines.missing("postgres")), reason=f"PostgreSQL: {engines.missing('postgres')}")


def test_tune_postgres_with_two_allocators(tmp_path, state_env, tpch_sf001):
    data = tpch_sf001
    out = tmp_path / "out"
    env = {**state_env, "TILEWISE_TEST_TAG": str(tmp_path)}
    cp = run_cli("tune", "--engine", "postgres", "--sf", "0.01", "--queries", "1,6", "--allocators", "system,jemalloc",
                 "--mem", "first-touch", "--repeat", "2", "--warmup", "0", "--data-dir", str(data), "--out", str(out),
                 "--json", env=env, timeout=600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["params"]["engine"] == "postgres" and doc["environment"]["engines"]["postgres"].startswith("postgresql")
    assert [c["label"] for c in doc["cases"]] == ["system/first-touch/none", "jemalloc/first-touch/none"]
    for c in doc["cases"]:
        assert not c["failures"] and len(c["runs"]) == 4 and all(r["status"] == "ok" for r in c["runs"]), c
        assert c["answers"]["checked"] == 2 and not c["answers"]["wrong"]
    system, jem = doc["starts"]
    assert jem["allocator"] == "jemalloc"
    for v in jem["verification"] + jem["verification_after"]:
        # the postmaster, its background processes and the backends it forked: the allocator in each
        assert v["processes"] >= 5 and not v["problems"], v
        assert v["allocator_mapped"] >= v["processes"] - v["not_checkable"], v
    assert system["verification_after"][0]["allocator_mapped"] is None
    assert doc["recommendation"]["verdicts"][0]["label"] == "jemalloc/first-touch/none"
    assert (out / "fig8.png").exists() and (out / "change.csv").exists()
    assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path)), "PostgreSQL processes left behind"
