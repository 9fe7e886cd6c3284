"""Every native workload's answer against a numpy reference at small size (data dumped by the binary)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tilewise import allocators, binding, launch, native, procs, verification

M64 = 1 << 64


def run(binary: str, *args: str, env: dict | None = None) -> dict:
    cp = subprocess.run([native.binary(binary), *args], capture_output=True, text=True, timeout=60, env=env)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout.strip().splitlines()[-1])


def load(d, name):
    return np.fromfile(d / name, dtype="<u8")


def ref_median(keys, vals):
    order = np.lexsort((vals, keys))
    k, v = keys[order], vals[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[starts, len(k)])
    med = v[starts + (counts - 1) // 2]
    gk = k[starts]
    return len(gk), int(sum(int(a + 1) * int(b) for a, b in zip(gk, med)) % M64)


def ref_count(keys):
    gk, counts = np.unique(keys, return_counts=True)
    return len(gk), int(sum(int(a + 1) * int(b) for a, b in zip(gk, counts)) % M64)


def ref_join(d):
    rk, rp, sk, sp = (load(d, n) for n in ("r_keys.u64", "r_pay.u64", "s_keys.u64", "s_pay.u64"))
    pay = dict(zip(rk.tolist(), rp.tolist()))
    total, rows = 0, 0
    for k, p in zip(sk.tolist(), sp.tolist()):
        if k in pay:
            total += pay[k] * p
            rows += 1
    return rows, total % M64


@pytest.mark.parametrize("dataset", ["moving-cluster", "sequential", "zipf"])
def test_w1_median_per_group_matches_reference(tmp_path, dataset):
    r = run("tw_w1_holistic", "--dataset", dataset, "--records", "20000", "--groups", "500", "--threads", "2",
            "--dump", str(tmp_path))
    rows, checksum = ref_median(load(tmp_path, "keys.u64"), load(tmp_path, "vals.u64"))
    assert r["workload"] == "W1" and r["dataset"] == dataset and r["threads"] == 2
    assert (r["result_rows"], r["checksum"]) == (rows, checksum)
    assert r["max_rss_bytes"] > 0 and r["time_s"] >= 0


@pytest.mark.parametrize("dataset", ["moving-cluster", "sequential", "zipf"])
def test_w2_count_per_group_matches_reference(tmp_path, dataset):
    r = run("tw_w2_distributive", "--dataset", dataset, "--records", "20000", "--groups", "500", "--threads", "2",
            "--dump", str(tmp_path))
    assert (r["result_rows"], r["checksum"]) == ref_count(load(tmp_path, "keys.u64"))


def test_datasets_have_their_shape(tmp_path):
    for ds in ("sequential", "zipf"):
        (tmp_path / ds).mkdir()
        run("tw_w2_distributive", "--dataset", ds, "--records", "10000", "--groups", "100", "--dump", str(tmp_path / ds))
    seq = load(tmp_path / "sequential", "keys.u64")
    assert (np.diff(seq.astype(np.int64)) >= 0).all() and seq[0] == 0 and seq[-1] == 99  # keys increase
    z = np.bincount(load(tmp_path / "zipf", "keys.u64"), minlength=100)
    assert z[0] > z[10] > z[99]  # rank 0 is the heaviest hitter


def test_zipf_exponent_flag_changes_skew(tmp_path):
    for e in ("0.5", "1.5"):
        (tmp_path / e).mkdir()
        run("tw_w2_distributive", "--dataset", "zipf", "--zipf-exponent", e, "--records", "20000", "--groups", "100",
            "--dump", str(tmp_path / e))
    share = {e: np.mean(load(tmp_path / e, "keys.u64") == 0) for e in ("0.5", "1.5")}
    assert share["1.5"] > 2 * share["0.5"]


@pytest.mark.parametrize("binary,name", [("tw_w3_hashjoin", "W3"), ("tw_w4_inlj", "W4")])
def test_joins_match_reference(tmp_path, binary, name):
    r = run(binary, "--records", "3000", "--threads", "2", "--dump", str(tmp_path))
    rows, checksum = ref_join(tmp_path)
    assert r["workload"] == name and r["probe_records"] == 16 * 3000
    assert (r["result_rows"], r["checksum"]) == (rows, checksum)
    assert r["build_s"] >= 0  # W4: the index build is reported apart from the join time


def test_results_do_not_depend_on_threads_or_pinning():
    a = run("tw_w1_holistic", "--records", "30000", "--groups", "300", "--threads", "1")
    b = run("tw_w1_holistic", "--records", "30000", "--groups", "300", "--threads", "3", "--pin", "0,0,0")
    assert a["checksum"] == b["checksum"] and b["pinned_cpus"] == "0,0,0"


def test_alloc_microbenchmark_verifies_and_reports_overhead():
    r = run("tw_allocbench", "--ops", "50000", "--slots", "5000", "--threads", "2")
    assert r["verified"] is True and r["allocations"] > 0
    assert r["requested_peak_bytes"] > 0
    assert r["memory_overhead"] == pytest.approx(r["max_rss_bytes"] / r["requested_peak_bytes"], rel=1e-3)


def test_bad_flags_fail_cleanly():
    cp = subprocess.run([native.binary("tw_w1_holistic"), "--dataset", "nope", "--records", "10"], capture_output=True, text=True)
    assert cp.returncode != 0 and "unknown dataset" in cp.stderr
    cp = subprocess.run([native.binary("tw_w3_hashjoin"), "--bogus", "1"], capture_output=True, text=True)
    assert cp.returncode != 0 and "unknown flag" in cp.stderr


def _some_allocator():
    avail = {k: v for k, v in allocators.available().items() if v}
    if not avail:
        pytest.skip("no preloadable allocator installed")
    return next(iter(avail.items()))


def test_preloaded_allocator_is_mapped_in_the_running_workload():
    name, lib = _some_allocator()
    b = binding.Binding(None, "first-touch", (), name)
    proc = launch.spawn([native.binary("tw_w2_distributive"), "--records", "1000", "--groups", "10", "--sleep-ms", "3000"],
                        b, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        v = verification.verify(proc.pid, b, allocator_wait_s=2.0)
        assert v.allocator_loaded is True, v.problems
        assert verification.maps_contain(proc.pid, lib)
    finally:
        procs.stop(proc)


def test_workload_reports_the_allocator_it_really_used():
    name, lib = _some_allocator()
    from tilewise import topology
    from tilewise.tune import knobs, workloads

    t = topology.load(None)
    p = workloads.Params(records=2000, groups=20)
    r = workloads.run_workload("W1", p, knobs.Config(allocator=name), t)
    assert r.allocator_verified is True
    assert any(lib.endswith(x) or x in lib for x in r.result["allocator_libs"])
    r0 = workloads.run_workload("W1", p, knobs.Config(), t)
    assert r0.result["allocator_libs"] == [] and r0.result["checksum"] == r.result["checksum"]


def test_max_rss_is_the_workloads_own_not_the_launchers():
    """ru_maxrss survives exec: a workload forked from Python must not report Python's peak."""
    from tilewise import topology
    from tilewise.tune import knobs, workloads

    with open("/proc/self/status") as f:
        own = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    r = workloads.run_workload("W2", workloads.Params(records=1000, groups=10), knobs.Config(), topology.load(None))
    assert 0 < r.result["max_rss_bytes"] < own
