"""`tilewise tune --engine E` (paper 003's study on a running engine), engine-generic: on the
process-per-connection stand-in (tests/fixtures/forking_engine: a server forking a child per
connection, the shape of PostgreSQL) through the real CLI and an entry point, and on DuckDB in this
process with OS switches under a fake root. tests/test_postgres_tune.py runs it on PostgreSQL.
SF 0.01, two queries, two or three runs: the figures mean nothing here, the mechanics do."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli, wait_gone
from tilewise import changes, plan, topology
from tilewise.errors import UsageError
from tilewise.tune import engine as engine_tune
from tilewise.tune import knobs
from tilewise.tune.os_switches import SWITCHES

THP = "sys/kernel/mm/transparent_hugepage/enabled"


@pytest.fixture
def data_root(tpch_sf001):
    return tpch_sf001


def test_tune_a_process_per_connection_engine_with_two_allocators(forking_env, data_root, tmp_path):
    out = tmp_path / "out"
    cp = run_cli("tune", "--engine", "forking", "--sf", "0.01", "--queries", "1,6", "--allocators", "system,jemalloc",
                 "--mem", "first-touch", "--repeat", "2", "--warmup", "1", "--data-dir", str(data_root),
                 "--out", str(out), "--json", env=forking_env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    assert doc["kind"] == "tune.engine" and doc["complete"] and doc["params"]["queries"] == ["q1", "q6"]
    assert [c["label"] for c in doc["cases"]] == ["system/first-touch/none", "jemalloc/first-touch/none"]
    for c in doc["cases"]:
        assert not c["failures"], c["failures"]
        assert [(r["query"], r["repeat"]) for r in c["runs"]] == [("q1", 0), ("q6", 0), ("q1", 1), ("q6", 1)]
        assert all(r["status"] == "ok" and r["elapsed_s"] > 0 for r in c["runs"])
        assert c["answers"] == {"checked": 2, "wrong": [], "not_comparable": []}  # validated against DataFusion
    assert len(doc["starts"]) == 2  # an allocator takes a restart
    jem = doc["starts"][1]
    assert jem["allocator"] == "jemalloc" and jem["start_s"] > 0
    after = jem["verification_after"][0]
    # the server and the child it forked for the queries' connection: the preloaded allocator is in both
    assert after["processes"] >= 2 and after["allocator_mapped"] >= 2 and not after["problems"], after
    assert doc["starts"][0]["verification_after"][0]["allocator_mapped"] is None  # system: nothing preloaded
    rec = doc["recommendation"]
    assert rec["label"] in {c["label"] for c in doc["cases"]} and rec["reasons"]
    assert {v["label"] for v in rec["verdicts"]} == {"jemalloc/first-touch/none"}
    for f in ("results.json", "results.csv", "change.csv", "fig8.png", "tuned.json"):
        assert (out / f).exists(), f
    assert json.loads((out / "tuned.json").read_text())["target"]["engine"] == "forking"
    cp = run_cli("report", str(out), env=forking_env)
    assert cp.returncode == 0 and "latency change against the default" in cp.stdout and "recommendation:" in cp.stdout
    assert not wait_gone("TILEWISE_TEST_TAG", forking_env["TILEWISE_TEST_TAG"]), "engine processes left behind"


def _fake_root(tmp_path):
    r = tmp_path / "root"
    (r / THP).parent.mkdir(parents=True)
    (r / THP).write_text("always [madvise] never\n")
    (r / "proc/sys/kernel").mkdir(parents=True)
    (r / "proc/sys/kernel/numa_balancing").write_text("0\n")
    (r / "proc/sys/kernel/random").mkdir(parents=True)
    (r / "proc/sys/kernel/random/boot_id").write_text("boot-a\n")
    return r


def test_os_switches_apply_to_the_running_engine_without_a_restart(tmp_path, data_root):
    """THP states share one DuckDB start (no restart), each applied around its runs and restored."""
    root = _fake_root(tmp_path)
    seen = []

    class Rep(engine_tune.Reporter):
        def message(self, text):
            if text.startswith("  ") and " run " in text:
                seen.append((text.split()[0], SWITCHES["thp"].parse((root / THP).read_text())))

    cfg = engine_tune.Config(engine="duckdb", sf="0.01", queries="6", allocators="system", mem="first-touch",
                             repeat=2, warmup=0, apply_os=True, thp="never,always", os_root=str(root),
                             data_dir=str(data_root), out=str(tmp_path / "out"))
    doc = engine_tune.run(cfg, Rep())
    assert [c["label"] for c in doc["cases"]] == ["system/first-touch/none", "system/first-touch/none/thp=never",
                                                 "system/first-touch/none/thp=always"]
    assert len(doc["starts"]) == 1 and doc["starts"][0]["cases"] == [0, 1, 2]  # one engine start for all three
    assert all(len(c["runs"]) == 2 and not c["failures"] for c in doc["cases"])
    # interleaved round by round (every other round in reverse), each state applied while its queries ran
    assert [s for _, s in seen] == ["madvise", "never", "always", "always", "never", "madvise"], seen
    assert SWITCHES["thp"].parse((root / THP).read_text()) == "madvise"  # restored
    assert not list((changes.state_dir() / "journals").glob("*.json"))  # nothing left to undo


def test_placement_binds_the_instance_to_k_cpus_in_that_order():
    t = topology.load("synthetic:Package:2 [NUMANode] L3Cache:2 Core:2 PU:1")
    base = plan.plan(t, "wim")
    dense = engine_tune.deployment(base, knobs.Config(placement="dense"), t, 3)
    sparse = engine_tune.deployment(base, knobs.Config(placement="sparse"), t, 3)
    assert dense.instances[0].cpus == (0, 1, 2)  # one L3, then the next of the same node
    assert sparse.instances[0].cpus == (0, 2, 4)  # node 0, node 1, then node 0's other L3
    inter = engine_tune.deployment(base, knobs.Config(mem="interleave", mem_nodes=(0, 1)), t, None)
    assert inter.instances[0].cpus == base.instances[0].cpus
    assert (inter.instances[0].mem_policy, inter.instances[0].mem_nodes) == ("interleave", (0, 1))
    with pytest.raises(UsageError, match="--cores"):
        engine_tune.check_placements(["none", "dense"], None, base)
    with pytest.raises(UsageError, match="below the instance's 8 CPUs"):
        engine_tune.check_placements(["dense"], 8, base)
    with pytest.raises(UsageError, match="--placements dense"):
        engine_tune.check_placements(["none"], 2, base)


def test_engine_options_are_checked(tmp_path):
    cp = run_cli("tune", "--sf", "1", "--", "true")
    assert cp.returncode == 2 and "--sf applies to --engine" in cp.stderr
    cp = run_cli("tune", "--engine", "duckdb", "-w", "W1")
    assert cp.returncode == 2 and "one of --workload W, --engine E" in cp.stderr
    cp = run_cli("tune", "--engine", "duckdb", "--records", "10", "--out", str(tmp_path))
    assert cp.returncode == 2 and "--records" in cp.stderr
    cp = run_cli("tune", "--engine", "duckdb", "--queries", "99", "--out", str(tmp_path))
    assert cp.returncode == 2 and "no TPC-H query 99" in cp.stderr


def test_an_engine_linking_its_own_allocator_gets_none_preloaded():
    """ClickHouse links jemalloc: chdb aborts under any preloaded allocator (measured), so the sweep
    refuses one up front, and without --allocators sweeps only the engine's own."""
    from tilewise import engines

    ch = engines.get("clickhouse")
    assert ch.capabilities.linked_allocator == "jemalloc"
    with pytest.raises(UsageError, match="links its own allocator \\(jemalloc\\)"):
        engine_tune.check_allocators(ch, ["system", "tcmalloc"])
    engine_tune.check_allocators(ch, ["system"])
    engine_tune.check_allocators(engines.get("duckdb"), ["system", "jemalloc"])
