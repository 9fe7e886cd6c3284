"""The `workload` use cases called directly (no subprocess, no click): tune.workload_session for
W1-W4/alloc and tensor.session for T1-T3 (describe: the dry run; run: the results document).
Seconds: one tiny W2 run; the rest plans on saved topologies."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from tilewise import plan
from tilewise.errors import UsageError
from tilewise.tensor import run as tr
from tilewise.tensor import session as tensor_session
from tilewise.tune import knobs
from tilewise.tune import workload_session as session
from tilewise.tune import workloads as wl

EPYC = str(FIXTURES / "epyc7713x2.xml")


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.docs: list[dict] = []

    def message(self, text: str) -> None:
        self.lines.append(text)

    def done(self, doc: dict) -> None:
        self.docs.append(doc)


def test_describe_plans_the_threads_on_a_saved_machine_and_runs_nothing():
    p = wl.Params(records=1000, threads=4)
    doc = session.describe(session.Config("W1", p, session.Knobs(placement="sparse", mem="interleave:0-1"),
                                          topology_src=EPYC))
    assert doc["workload"] == "W1" and doc["config"]["placement"] == "sparse"
    assert doc["config"]["mem"] == "interleave" and doc["config"]["mem_nodes"] == [0, 1]
    assert len(doc["pin"]) == 4 and doc["argv"][-2:] == ["--pin", ",".join(map(str, doc["pin"]))]
    assert "numactl --interleave=0-1" in doc["reproduce"]


def test_flags_win_over_the_tuned_file_and_its_os_switches_need_apply_os(tmp_path):
    path = tmp_path / "tuned.json"
    knobs.save_config(str(path), knobs.TunedFile(knobs.Config("system", "interleave", (0, 1), "dense", "never", None)))
    notes = Notes()
    doc = session.describe(session.Config("W2", wl.Params(threads=2), session.Knobs(config_path=str(path), mem="local"),
                                          topology_src=EPYC), notes)
    assert doc["config"] == {"allocator": "system", "mem": "local", "mem_nodes": [], "placement": "dense",
                             "thp": None, "autonuma": None}  # the file's OS switch is not applied without --apply-os
    assert notes.lines and "also sets OS switches (thp=never)" in notes.lines[0]
    with pytest.raises(UsageError, match="need --apply-os"):
        session.describe(session.Config("W2", wl.Params(), session.Knobs(thp="never"), topology_src=EPYC))
    with pytest.raises(UsageError, match="--topology is for --dry-run only"):
        session.run(session.Config("W2", wl.Params(), session.Knobs(), topology_src=EPYC))


def test_run_returns_and_writes_the_workload_document(tmp_path):
    p = wl.Params(records=20_000, groups=100, threads=1)
    doc = session.run(session.Config("W2", p, session.Knobs(mem="first-touch"), out=str(tmp_path / "out")))
    assert doc["kind"] == "workload" and doc["workload"] == "W2" and doc["complete"] is True
    assert doc["result"]["records"] == 20_000 and doc["allocator_verified"] is True and doc["os_changed"] == []
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["result"] == doc["result"] and saved["label"] == "system/first-touch/none"


def _tensor(**kw) -> tensor_session.Config:
    p = tr.Params("T1", records=1000, device="cpu", rename="auto", runs=1, warmup=0)
    return tensor_session.Config(p, session.Knobs(), topology_src=EPYC, **kw)


def test_tensor_describe_runs_in_the_tile_of_the_plan():
    win = lambda t, gpu: plan.plan(t, "win")  # noqa: E731 - the plan --policy win makes
    doc, p = tensor_session.describe(_tensor(plan=win, policy="win", instance=1))
    want = plan.plan(session.settle(session.Knobs(), EPYC, True, Notes()).topo, "win").instances[1]
    assert p.policy == "win" and doc["tile"]["id"] == 1 and doc["tile"]["cpus"] == list(want.cpus)
    assert doc["config"]["mem"] == want.mem_policy and doc["config"]["mem_nodes"] == list(want.mem_nodes)
    assert doc["gpu"] is None and doc["worker"][-1] != "" and doc["estimated_bytes"] > 0
    with pytest.raises(UsageError, match="instance 9 does not exist"):
        tensor_session.describe(_tensor(plan=win, instance=9))
    with pytest.raises(UsageError, match="--instance needs --policy"):
        tensor_session.describe(_tensor(instance=1))
