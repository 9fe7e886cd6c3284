"""`up` and `join` as a use case called directly (no subprocess, no click): cluster.start checks
everything before the first process starts, then starts the engine's runtime bound and recorded,
and returns the status document with the start-up time and the connect hints. Seconds: DuckDB
servers without data."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import wait_gone
from tilewise import cluster, engines, plan, topology
from tilewise.errors import TilewiseError, UsageError


@pytest.fixture
def state(state_env, monkeypatch):
    for k, v in state_env.items():
        monkeypatch.setenv(k, v)
    return Path(state_env["TILEWISE_CLUSTER_DIR"])


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _cfg(**kw) -> cluster.Config:
    kw.setdefault("plan", lambda t: plan.plan(t, "wim"))
    return cluster.Config(kw.pop("engine", engines.DEFAULT_BENCH), **kw)


def _no_join_engine() -> str:
    return next(s.name for s in engines.specs(lambda s: not s.capabilities.join))


@pytest.mark.parametrize("kw, error", [
    ({"name": "../x"}, "bad cluster name"),
    ({"allocator": "nope"}, "nope"),
    ({"engine": "nope"}, "nope"),
    ({"join": "127.0.0.1:1", "engine": None}, "cannot join a cluster on another host"),
    ({"worker_memory": "1k"}, "--worker-memory"),
])
def test_refusals_come_before_the_plan_and_anything_started(state, kw, error):
    if kw.get("engine", "") is None:
        kw["engine"] = _no_join_engine()
    planned = []
    with pytest.raises((UsageError, TilewiseError), match=error):
        cluster.start(_cfg(plan=lambda t: planned.append(t) or plan.plan(t, "wim"), **kw))
    assert planned == []
    assert not state.exists() or not any(state.iterdir())  # nothing recorded, nothing started


def test_a_plan_that_cannot_be_made_starts_nothing(state):
    with pytest.raises(UsageError, match="nope"):
        cluster.start(_cfg(plan=lambda t: plan.plan(t, "nope")))
    assert not state.exists() or not any(state.iterdir())


def test_coordinator_memory_is_refused_for_an_engine_without_a_coordinator(state):
    spec = next((s for s in engines.specs(lambda s: s.capabilities.coordinator_memory is None)), None)
    if spec is None:
        pytest.skip("every engine here has a coordinator")
    with pytest.raises(UsageError, match="--coordinator-memory sizes the"):
        cluster.start(_cfg(engine=spec.name, coordinator_memory="1g"))


def test_start_records_a_bound_cluster_and_down_stops_it(state):
    spec = engines.get(engines.DEFAULT_BENCH)
    if spec.missing():
        pytest.skip(spec.missing())
    log = Log()
    doc = cluster.start(_cfg(name="direct"), log)
    try:
        want = plan.plan(topology.load(None), "wim")
        assert doc["name"] == "direct" and doc["engine"] == spec.name and doc["healthy"] is True
        assert doc["startup_s"] >= 0 and isinstance(doc["connect"], list)
        workers = [m for m in doc["members"] if m["role"] == "worker"]
        assert len(workers) == len(want.instances)
        for w, inst in zip(workers, want.instances):
            assert tuple(sorted(psutil.Process(w["pid"]).cpu_affinity())) == tuple(inst.cpus)
        assert (state / "direct.json").is_file()
    finally:
        gone = cluster.down(cluster.load("direct"))
    assert gone["stopped_pids"] and not wait_gone("TILEWISE_CLUSTER_DIR", str(state))
    assert not (state / "direct.json").exists()
