"""`tilewise probe exchange`: the pure decisions on fixture machines, the goals' verdicts, and real
runs of tw_exchange here -- every transport moves every byte (the receiver's checksum), the shm
ring's pages sit on the receiver's node, a 64 MB /dev/shm does not limit it (memfd: no file there),
and nothing is left when tilewise is killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from tilewise import procs, topology
from tilewise.errors import UsageError
from tilewise.probes import exchange as X

FIX = Path(__file__).parent / "fixtures"
EPYC = topology.load(str(FIX / "epyc7713x2.xml"))  # 2 nodes, 8 chiplets of 8 cores each per socket


# ---- decisions ----------------------------------------------------------------------------------

def test_default_ends_are_on_two_nodes_else_two_l3s_else_two_cores():
    s, r, why = X.choose_cpus(EPYC, None, None, EPYC.pus)
    assert {EPYC.core_of_cpu[c].numa_node for c in s} == {0} and {EPYC.core_of_cpu[c].numa_node for c in r} == {1}
    assert why == "the two ends on two NUMA nodes" and len(s) == 64  # one CPU per core
    node0 = [c for c in EPYC.pus if EPYC.core_of_cpu[c].numa_node == 0]
    s, r, why = X.choose_cpus(EPYC, None, None, node0)
    assert why == "the two ends on two L3 domains" and len({EPYC.core_of_cpu[c].l3 for c in s + r}) == 2
    one_l3 = [c for c in EPYC.pus if EPYC.core_of_cpu[c].l3 == 0]
    s, r, why = X.choose_cpus(EPYC, None, None, one_l3)
    assert "other cores of one L3" in why and not set(s) & set(r)
    assert X.choose_cpus(EPYC, "0-3", "64", EPYC.pus)[:2] == ((0, 1, 2, 3), (64,))


@pytest.mark.parametrize("cfg,what", [
    (X.Config(transports=("shm", "rdma")), "unknown rdma"),
    (X.Config(transports=("tcp", "tcp")), "named twice"),
    (X.Config(sizes=(12,)), "multiples of 8"),
    (X.Config(sizes=(X.MAX_SIZE * 2,)), "multiples of 8"),
    (X.Config(channels=(0,)), "from 1 to"),
    (X.Config(channels=(1, 1)), "distinct"),
    (X.Config(ring=1000), "a multiple of 4 KiB"),
])
def test_options_refused_before_anything_runs(cfg, what):
    with pytest.raises(UsageError, match=what):
        X.check(cfg)


def test_one_end_without_the_other_and_cpus_not_allowed_are_refused():
    with pytest.raises(UsageError, match="go together"):
        X.choose_cpus(EPYC, "0", None, EPYC.pus)
    with pytest.raises(UsageError, match="not CPUs this process may use"):
        X.choose_cpus(EPYC, "0", "1", [0, 2])
    with pytest.raises(UsageError, match="needs two CPUs"):
        X.choose_cpus(EPYC, None, None, [5])


def test_goals_are_verdicts_on_measured_figures():
    def case(tr, size, gbs):
        return {"transport": tr, "mode": "throughput", "size": size, "channels": 1, "gbs": gbs}

    cases = [case("memcpy", X.MiB, 20.0), case("shm", X.MiB, 12.0), case("tcp", X.MiB, 3.0),
             case("memcpy", 64 * X.MiB, 10.0), case("shm", 64 * X.MiB, 4.0), case("tcp", 64 * X.MiB, 2.0),
             case("shm", 4096, 1.0), case("tcp", 4096, 1.0)]
    s = X.summarize(cases, X.TRANSPORTS, 10.0)  # memcpy of memory, far larger than the caches: 10 GB/s
    goals = {g["goal"].split(" for")[0]: g for g in s["goals"]}
    assert goals["shm >= 3x tcp"]["met"] is False and goals["shm >= 3x tcp"]["worst"] == f"2.00x at {64 * X.MiB} B"
    assert goals["shm >= 0.5 of memcpy"]["met"] is False and "0.40" in goals["shm >= 0.5 of memcpy"]["worst"]
    cases[4]["gbs"], cases[5]["gbs"] = 6.0, 2.0
    assert all(g["met"] for g in X.summarize(cases, X.TRANSPORTS, 10.0)["goals"])  # 4 KiB is not judged
    assert len(X.summarize(cases, X.TRANSPORTS)["goals"]) == 1  # no reference measured: no memcpy verdict
    assert X.summarize(cases, ("unix",))["goals"] == []


def test_message_counts_are_bounded():
    assert X.messages_for(4096) == 4096 and X.messages_for(64 * X.MiB) == 4 and X.messages_for(X.MiB) == 256
    assert X.round_trips_for(8) == 200 and X.round_trips_for(64 * X.MiB) == 5


# ---- real runs ----------------------------------------------------------------------------------

def test_every_transport_moves_every_byte_and_the_ring_sits_on_the_receivers_node(tmp_path):
    out = tmp_path / "res"
    cp = run_cli("probe", "exchange", "--sizes", "64KiB,1MiB", "--channels", "1,2", "--runs", "1", "--ring", "1MiB",
                 "--json", "--out", str(out), timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    assert doc["kind"] == "probe.exchange" and doc["complete"] is True
    got = {(c["transport"], c["mode"], c["size"], c["channels"]) for c in doc["cases"]}
    for tr in X.TRANSPORTS:
        for size in (64 * X.KiB, X.MiB):
            assert (tr, "latency", size, 1) in got and (tr, "throughput", size, 2) in got
    assert all((c.get("gbs") or c.get("latency_us_median")) > 0 for c in doc["cases"])
    node = doc["ring_node"]
    shm = [c for c in doc["cases"] if c["transport"] == "shm" and c["mode"] == "throughput"]
    assert all(c["ring_pages"].get(str(node), 0) == X.MiB // os.sysconf("SC_PAGE_SIZE") for c in shm), shm
    assert {g["goal"].split(" for")[0] for g in doc["goals"]} == {"shm >= 3x tcp", "shm >= 0.5 of memcpy"}
    assert doc["memcpy_reference"]["size"] >= X.REFERENCE_MIN and doc["memcpy_reference"]["gbs"] > 0
    assert {p.name for p in out.iterdir()} == {"exchange.json", "exchange.csv", "exchange.png"}
    shown = run_cli("report", str(out), env={"COLUMNS": "200"})
    assert shown.returncode == 0 and "shm/tcp" in shown.stdout and "round trip" in shown.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root (a private /dev/shm mount)")
def test_a_64mb_dev_shm_does_not_limit_the_ring():
    """Docker's default /dev/shm is 64 MB: the rings are memfd, not files there, so 2 channels of
    64 MiB rings (128 MiB) run, and /dev/shm stays empty."""
    exe = str(Path(sys.executable).parent / "tilewise")
    script = ('mount -t tmpfs -o size=64m tmpfs /dev/shm && '
              f'"{exe}" probe exchange --transports shm --sizes 64MiB --channels 2 --ring 64MiB --runs 1 --json && '
              'test -z "$(ls -A /dev/shm)"')
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                        text=True, timeout=300)
    if "unshare failed" in cp.stderr or "Operation not permitted" in cp.stderr:
        pytest.skip(f"no private mount namespace here: {cp.stderr.strip()[:200]}")
    assert cp.returncode == 0, cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    big = [c for c in doc["cases"] if c["transport"] == "shm" and c["mode"] == "throughput"]
    assert big and big[0]["ring_bytes"] == 64 * X.MiB and big[0]["channels"] == 2


def test_kill_9_of_tilewise_leaves_no_exchange_process():
    tw = subprocess.Popen([sys.executable, "-m", "tilewise", "probe", "exchange", "--sizes", "64MiB", "--runs", "50",
                           "--transports", "tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tools: list = []
    try:
        deadline = time.monotonic() + 60
        while len(tools) < 2:  # the sender and the receiver it forked
            assert tw.poll() is None and time.monotonic() < deadline, "tw_exchange never started"
            time.sleep(0.05)
            table = procs.scan()
            tools = [table[p].id for p in procs.descendants([tw.pid], table) if table[p].comm == "tw_exchange"]
    finally:
        tw.send_signal(signal.SIGKILL)
        tw.wait()
    deadline = time.monotonic() + 10
    while [t for t in tools if t.alive()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [t for t in tools if t.alive()], "tw_exchange outlived tilewise"
