"""The probes' use cases called directly (no subprocess, no click): probes.matrix.run (latency,
bandwidth), probes.stream.run and probes.gpu.run return their results documents, tell a reporter
their progress, and hand the document to the writer (also when interrupted). Tiny sizes, seconds."""

from __future__ import annotations

import copy
import os

import pytest

from tilewise import devices
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import gpu, matrix, stream
from tilewise.results import model

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
PAIR = f"{CPUS[0]},{CPUS[-1]}" if len(CPUS) >= 2 else str(CPUS[0])


class Seen:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.total = None
        self.advanced = 0
        self.written: list[dict] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def start(self, total: int) -> None:
        self.total = total

    def advance(self) -> None:
        self.advanced += 1

    def write(self, doc: dict) -> None:
        self.written.append(copy.deepcopy(doc))  # as the file holds it at that moment


@two_cpus
def test_latency_run_reports_progress_and_writes_the_document():
    seen = Seen()
    cfg = matrix.Config(matrix.LatencyParams(samples=3, iters=20, warmup=10, modes=("cas",)), cpus=PAIR)
    doc = matrix.run(cfg, seen, writer=seen.write)
    assert doc["kind"] == "probe.latency" and doc["complete"] is True and doc["cpus"] == [CPUS[0], CPUS[-1]]
    assert seen.total == 2 and seen.advanced == 2 and len(doc["raw"]) == 2  # both ordered pairs, one mode
    assert seen.messages[0].startswith("latency: ") and "estimated" in seen.messages[0]
    assert seen.written[-1]["raw"] == doc["raw"]
    assert model.upgrade(doc)["kind"] == "probe.latency"  # a current results document


def test_one_cpu_is_refused_before_anything_runs():
    seen = Seen()
    with pytest.raises(UsageError, match="needs two CPUs"):
        matrix.run(matrix.Config(matrix.BandwidthParams(samples=2), cpus=str(CPUS[0])), seen, writer=seen.write)
    assert seen.written == [] and seen.total is None


class CtrlC(Seen):
    def advance(self) -> None:  # Ctrl-C after the first pair's result
        raise KeyboardInterrupt


@two_cpus
def test_an_interrupted_pair_probe_is_written_as_stopped_with_what_it_measured():
    seen = CtrlC()
    with pytest.raises(KeyboardInterrupt):
        matrix.run(matrix.Config(matrix.BandwidthParams(size=64 * 1024, samples=2), cpus=PAIR), seen, writer=seen.write)
    last = seen.written[-1]
    assert last["complete"] is False and last["interrupted"] is True and len(last["raw"]) == 1


@two_cpus
def test_stream_run_rewrites_the_document_after_each_case():
    seen = Seen()
    cfg = stream.Config(cpus=PAIR, policies="wim,wic", sizes=(64 * 1024,), ntimes=2)
    doc = stream.run(cfg, seen, writer=seen.write)
    assert doc["kind"] == "probe.stream" and doc["complete"] is True and doc["size_rule"] == "from --sizes"
    assert [c["policy"] for c in doc["cases"]] == ["wim", "wic"] and seen.total == 2 and seen.advanced == 2
    assert [len(d["cases"]) for d in seen.written] == [1, 2]  # a late failure loses nothing
    with pytest.raises(UsageError, match="--policies is empty"):
        stream.run(stream.Config(cpus=PAIR, policies=" , "))


def test_gpu_run_refuses_in_one_line_where_cuda_has_no_gpu():
    if devices.discover().cuda:
        pytest.skip("a CUDA GPU is here: the refusal needs a machine without one")
    seen = Seen()
    with pytest.raises(TilewiseError, match="no CUDA GPU here"):
        gpu.run(gpu.Config(device="cuda", size=4096, reps=1), writer=seen.write)
    assert seen.written == []  # refused before a document was started
