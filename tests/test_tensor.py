"""The tensor workloads T1-T3 (thesis 004, ch. 3): renaming decisions, generators, the tensor
programs against numpy, and `tilewise workload T1|T2|T3` end to end on CPU with every answer
checked; bad input; CUDA runs marked `device` (they need a GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilewise.errors import UsageError
from tilewise.tensor import data, rename
from tilewise.tensor import run as tr

torch = pytest.importorskip("torch", reason="the tensor runtime is an extra: pip install 'tilewise[tensor]'")


def _has_cuda() -> bool:
    from tilewise import devices

    return bool(devices.discover().cuda)


# ---- renaming (a decision on numbers) --------------------------------------------------------------

GiB = 2**30


def test_rename_auto_picks_none_offset_dense_by_range_and_budget():
    assert rename.plan(0, 999, 1000, "auto", GiB).method == "none"
    r = rename.plan(-500, 499, 1000, "auto", GiB)
    assert (r.method, r.offset, r.bins) == ("offset", -500, 1000)
    r = rename.plan(10**12, 10**12 + 9, 10, "auto", 1 << 20)  # max+1 does not fit, the span does
    assert (r.method, r.bins) == ("offset", 10)
    r = rename.plan(-(2**63), 2**63 - 1, 1000, "auto", GiB)
    assert r.method == "dense" and "EiB" in r.reason and "1,000 keys" in r.reason


def test_rename_refusals_name_the_size():
    with pytest.raises(UsageError, match=r"745\.1 GiB .*100,000,000,000 bins x 8 B.*1\.0 GiB allowed"):
        rename.plan(0, 10**11 - 1, 5, "none", GiB, what="T1")
    with pytest.raises(UsageError, match="non-negative"):
        rename.plan(-1, 5, 5, "none", GiB)
    with pytest.raises(UsageError, match=r"16 B .*x 2.*8 B allowed"):  # two bincounts (a non-unique join)
        rename.plan(0, 0, 1, "offset", 8, counters=2)
    assert rename.plan(0, 0, 1, "offset", 16, counters=2).bins_bytes == 16
    with pytest.raises(UsageError, match="unknown renaming"):
        rename.plan(0, 1, 1, "hash", GiB)


# ---- generators -------------------------------------------------------------------------------------

def test_generators_are_deterministic_and_shaped():
    k = data.keys("unique", 1000, 1000, 0.5, 7)
    assert sorted(k.tolist()) == list(range(1000))
    assert np.array_equal(k, data.keys("unique", 1000, 1000, 0.5, 7))
    z = data.keys("zipf", 20000, 100, 1.0, 1)
    counts = np.bincount(z, minlength=100)
    assert z.min() >= 0 and z.max() < 100 and counts[0] > 5 * counts[50]  # rank 0 is the heaviest
    s = data.keys("sparse", 5000, 300, 0.5, 3)
    u = data.keys("uniform", 5000, 300, 0.5, 3)
    assert np.unique(s).size == np.unique(u).size  # injective
    assert s.min() < 0 and s.max() > 2**60
    r, s2 = data.relations("unique", 100, 3, 100, 0.5, 1)
    assert len(r) == 100 and len(s2) == 300 and np.unique(s2).size == 300


def test_rmat_has_livejournal_proportions_and_a_skewed_degree():
    nodes, edges = data.graph_size(0.001)
    assert (nodes, edges) == (4848, 68994)
    src, dst = data.rmat(nodes, edges, 3)
    assert len(src) == len(dst) == edges
    assert src.min() >= 0 and max(src.max(), dst.max()) < nodes
    deg = np.sort(np.bincount(dst, minlength=nodes))[::-1]
    assert deg[0] > 10 * max(1, np.median(deg))  # power law: a few hubs
    s2, _ = data.rmat(nodes, edges, 3)
    assert np.array_equal(src, s2)


# ---- the tensor programs against numpy --------------------------------------------------------------

def test_bincount_programs_match_numpy():
    from tilewise.tensor import ops

    rng = np.random.default_rng(0)
    k = rng.integers(0, 50, 400)
    assert int(ops.distinct_count(torch.from_numpy(k), 50)) == np.unique(k).size
    r, s = rng.integers(0, 30, 200), rng.integers(0, 40, 300)
    want = sum(int((r == x).sum()) * int((s == x).sum()) for x in range(40))
    assert int(ops.join_count(torch.from_numpy(r), torch.from_numpy(s), 0)) == want
    ru, su = rng.permutation(100), rng.permutation(150)
    assert int(ops.join_count_unique(torch.from_numpy(ru), torch.from_numpy(su), 150)) == 100
    (a, b), n = ops.rename_dense(torch.tensor([-5, 10**15, -5]), torch.tensor([10**15, 7]))
    assert n == 3 and a.tolist() == [0, 2, 0] and b.tolist() == [2, 1]


def test_pagerank_by_scatter_add_matches_the_numpy_reference():
    from tilewise.tensor import ops, worker

    src, dst = data.rmat(500, 4000, 1)
    s, d = torch.from_numpy(src), torch.from_numpy(dst)
    inv, dang = ops.pagerank_prerequisites(s, 500, torch.float64)
    v, it, _ = ops.pagerank(ops.pagerank_step, s, d, inv, dang, 500, 0.85, 30, 0.0)
    ref, rit = worker.pagerank_numpy(src, dst, 500, 0.85, 30, 0.0)
    assert it == rit == 30
    assert np.allclose(v.numpy(), ref, rtol=1e-12) and abs(ref.sum() - 1) < 1e-12
    v2, it2, delta = ops.pagerank(ops.pagerank_step, s, d, inv, dang, 500, 0.85, 1000, 1e-10)
    assert it2 < 1000 and delta < 1e-10  # convergence by threshold


# ---- parameters (pure) --------------------------------------------------------------------------------

def test_params_validate_and_resolve():
    d = tr.Params("T3").resolved()
    assert (d["scale"], d["iterations"], d["damping"], d["variants"]) == (0.01, 50, 0.85, ["eager", "compiled", "scipy"])
    assert tr.Params("T1", device="cuda").resolved()["variants"][-1] == "cudf"
    for bad, match in [(tr.Params("T3", records=5), "--records does not apply to T3"),
                       (tr.Params("T1", scale=1.0), "--scale applies to T3"),
                       (tr.Params("T1", ratio=2), "--ratio applies to T2"),
                       (tr.Params("T1", dataset="rmat"), "T1 datasets"),
                       (tr.Params("T1", variants=("cudf",)), "run on a GPU"),
                       (tr.Params("T1", device="tpu"), "not a device")]:
        with pytest.raises(UsageError, match=match):
            tr.validate(bad)
    with pytest.raises(UsageError, match="has no variant scipy"):
        tr.parse_variants("eager,scipy", "T1")


def test_memory_estimate_refuses_before_starting():
    with pytest.raises(UsageError, match=r"needs about .* use a smaller --scale"):
        tr.check_memory(tr.Params("T3", scale=8.0).resolved(), available=4 * GiB)
    tr.check_memory(tr.Params("T1", records=1000).resolved(), available=4 * GiB)


def test_summary_ratios_and_thesis_figures():
    doc = {"workload": "T3", "variants": [
        {"name": "eager", "median_s": 2.0, "checked": True, "transfer_s": 1.0},
        {"name": "compiled", "median_s": 1.0, "checked": True, "transfer_s": 1.0},
        {"name": "scipy", "median_s": 4.0, "checked": False},
        {"name": "cugraph", "skipped": "not installed"}]}
    s = tr.summarize(doc, "cuda:0")
    rows = {r["name"]: r for r in s["rows"]}
    assert rows["compiled"]["ratio_to_eager"] == 0.5 and rows["compiled"]["ratio_to_eager_with_transfer"] == 2 / 3
    assert rows["scipy"]["ratio_to_eager_with_transfer"] == 4 / 3
    assert rows["compiled"]["thesis"]["ratio_to_eager"] == [0.2, 0.2]  # TVM 5x on GPU
    assert rows["cugraph"]["skipped"] and s["checked"] is False  # scipy's answer was wrong
    assert tr.wrong_answers(doc) == ["scipy: None"]


# ---- end to end on CPU ------------------------------------------------------------------------------------

def _run(cli, *args):
    cp = cli("workload", *args, "--runs", "1", "--warmup", "0", "--json", timeout=300)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def _all_checked(doc, names):
    assert doc["kind"] == "workload.tensor" and doc["checked"] is True and doc["complete"] is True
    assert [v["name"] for v in doc["variants"]] == names
    assert all(v["checked"] and v["median_s"] > 0 for v in doc["variants"])
    assert doc["verification"]["ok"] is True


def test_t1_end_to_end_eager_compiled_native_duckdb(cli, tmp_path):
    doc = _run(cli, "T1", "--records", "20000", "--out", str(tmp_path))
    _all_checked(doc, ["eager", "compiled", "native", "duckdb"])
    assert doc["reference"]["answer"] == 20000 and doc["rename"]["method"] == "none"
    assert doc["variants"][1]["compile_s"] > 0
    assert {m["name"] for m in doc["metrics"]} == {"T1/eager", "T1/compiled", "T1/native", "T1/duckdb"}
    assert (tmp_path / "tensor.csv").read_text().count("\n") == 5 and (tmp_path / "tensor.png").is_file()
    assert "checked" in cli("report", str(tmp_path)).stdout


def test_t1_sparse_negative_keys_are_renamed(cli):
    doc = _run(cli, "T1", "--dataset", "sparse", "--records", "5000", "--groups", "1000", "--variants", "eager,native")
    _all_checked(doc, ["eager", "native"])
    assert doc["rename"]["method"] == "dense" and doc["reference"]["answer"] <= 1000


def test_t2_unique_and_non_unique_keys(cli):
    doc = _run(cli, "T2", "--records", "5000", "--ratio", "2", "--variants", "eager,native,duckdb")
    _all_checked(doc, ["eager", "native", "duckdb"])
    assert doc["reference"]["answer"] == 5000 and doc["variants"][0]["algorithm"].startswith("unique keys")
    doc = _run(cli, "T2", "--dataset", "zipf", "--records", "5000", "--groups", "100", "--variants", "eager,native,duckdb",
               "--placement", "dense")
    _all_checked(doc, ["eager", "native", "duckdb"])
    assert doc["variants"][0]["algorithm"].startswith("non-unique keys") and doc["reference"]["answer"] > 5000
    assert doc["omp_places"]  # the placement reaches torch's OpenMP threads


def test_t3_pagerank_checked_against_the_reference(cli):
    doc = _run(cli, "T3", "--scale", "0.0005", "--iterations", "20", "--variants", "eager,scipy", "--policy", "win")
    _all_checked(doc, ["eager", "scipy"])
    assert doc["nodes"] == 2424 and doc["edges"] == 34497
    assert all(v["max_rel_diff"] < 1e-9 and v["iterations"] == 20 for v in doc["variants"])
    assert doc["tile"]["id"] == 0
    doc = _run(cli, "T3", "--scale", "0.0005", "--iterations", "500", "--tolerance", "1e-9", "--variants", "eager",
               "--dtype", "float32")
    _all_checked(doc, ["eager"])
    assert doc["variants"][0]["iterations"] < 500


# ---- bad input: one Error line each --------------------------------------------------------------------

def _error(cli, *args, code=2):
    cp = cli("workload", *args)
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == code, cp.stderr
    assert lines[-1].startswith("Error: ") and sum(l.startswith("Error:") for l in lines) == 1
    assert "Traceback" not in cp.stderr
    return lines[-1]


def test_bad_input(cli):
    assert "745.1 GiB" in _error(cli, "T1", "--dataset", "uniform", "--groups", "100G", "--records", "1000",
                                 "--rename", "none", "--bincount-memory", "1GiB")
    assert "even after renaming by offset" in _error(cli, "T1", "--dataset", "sparse", "--records", "1000",
                                                     "--rename", "offset", "--variants", "eager")
    assert "applies to the tensor workloads" in _error(cli, "W1", "--device", "cpu")
    assert "not a device" in _error(cli, "T1", "--device", "tpu")
    assert "choose one of W1" in _error(cli, "T9")
    if not _has_cuda():
        assert "no CUDA GPU here" in _error(cli, "T1", "--device", "cuda", code=1)
        assert "no CUDA GPU here" in _error(cli, "T3", "--device", "cuda:GPU-1234", code=1)


# ---- on a GPU (device) ------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU here (NVML finds none)")


@pytest.mark.device
@gpu
@pytest.mark.parametrize("w,args", [("T1", ["--records", "1000000"]), ("T2", ["--records", "1000000"]),
                                    ("T3", ["--scale", "0.01"])])
def test_on_cuda_checked_with_transfer(cli, w, args):
    doc = _run(cli, w, *args, "--device", "cuda")
    assert doc["checked"] and doc["device"] == "cuda:0"
    eager = doc["variants"][0]
    assert eager["device"] == "cuda:0" and eager["transfer_s"] > 0
    assert doc["gpu"]["uuid"].startswith("GPU-") and doc["gpu"]["visible"] == doc["gpu"]["uuid"]


@pytest.mark.device
@gpu
def test_cuda_index_that_does_not_exist(cli):
    assert "there is no GPU 64 here" in _error(cli, "T1", "--device", "cuda:64")


def test_gpu_check_reads_the_workers_own_view():
    from tilewise.tensor.run import gpu_check

    u = "GPU-84bc1679-aa5f-9954-5afe-8c689c01ec13"
    seen = {"count": 1, "visible": u, "cuda_uuid": "84bc1679-aa5f-9954-5afe-8c689c01ec13"}
    assert gpu_check(seen, u)["state"] == "verified"
    assert gpu_check({**seen, "cuda_uuid": "00000000-aa5f-9954-5afe-8c689c01ec13"}, u)["state"] == "mismatch"
    assert gpu_check({**seen, "count": 2}, u)["got"].startswith("2 GPU(s) visible")
    assert gpu_check({**seen, "cuda_uuid": None}, u)["state"] == "not checkable"
