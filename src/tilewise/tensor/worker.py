"""The process that runs one tensor workload (T1-T3), started bound by tilewise.tensor.run.

`python -m tilewise.tensor.worker SPEC.json` generates the data (first touch in this bound process,
so it lands where the binding says), computes the exact reference with numpy, writes the key files
the native baseline reads (when asked), times every in-process variant (torch eager and compiled,
DuckDB, scipy, and cuDF/cugraph where they are installed) and prints one JSON object on its last
line of stdout. An error the user can act on (bad input found in the data, no CUDA device, no torch)
is {"error": "...", "usage": true|false} on that line with exit status 0, so the parent reports it
as one line; a crash is a non-zero exit with its traceback on stderr.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from tilewise.errors import TilewiseError, UsageError
from tilewise.tensor import SQL_VARIANT, data, ops, rename

PR_CHECK = {"float64": 1e-9, "float32": 1e-3}  # max relative difference of any node's rank vs the reference


class WorkerError(Exception):
    pass


def _clock(sync):
    if sync:
        sync()
    return time.perf_counter()


def _timed(fn, runs: int, warmup: int, sync=None) -> tuple[list[float], object]:
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(runs):
        t0 = _clock(sync)
        out = fn()
        times.append(_clock(sync) - t0)
    return times, out


# ---- data and the exact references (numpy) ----------------------------------------------------

def make_inputs(spec: dict) -> dict:
    w = spec["workload"]
    if w == "T1":
        return {"keys": data.keys(spec["dataset"], spec["records"], spec["groups"], spec["zipf_exponent"], spec["seed"])}
    if w == "T2":
        r, s = data.relations(spec["dataset"], spec["records"], spec["ratio"], spec["groups"], spec["zipf_exponent"], spec["seed"])
        return {"r": r, "s": s}
    nodes, edges = data.graph_size(spec["scale"])
    src, dst = data.rmat(nodes, edges, spec["seed"])
    return {"src": src, "dst": dst, "nodes": nodes}


def pagerank_numpy(src, dst, n: int, damping: float, iterations: int, tolerance: float) -> tuple[np.ndarray, int]:
    """The reference PageRank: float64, scatter-add by numpy's weighted bincount."""
    out = np.bincount(src, minlength=n).astype(np.float64)
    inv = np.divide(1.0, out, out=np.zeros(n), where=out > 0)
    dangling = out == 0
    v = np.full(n, 1.0 / n)
    it = 0
    for it in range(1, iterations + 1):
        nv = (1 - damping) / n + damping * (np.bincount(dst, weights=(v * inv)[src], minlength=n) + v[dangling].sum() / n)
        delta = np.abs(nv - v).sum()
        v = nv
        if tolerance > 0 and delta < tolerance:
            break
    return v, it


def reference(spec: dict, inp: dict) -> dict:
    w = spec["workload"]
    if w == "T1":
        return {"answer": int(np.unique(inp["keys"]).size), "method": "exact: numpy.unique over the same keys (sort-based)"}
    if w == "T2":
        ur, cr = np.unique(inp["r"], return_counts=True)
        us, cs = np.unique(inp["s"], return_counts=True)
        _, ir, is_ = np.intersect1d(ur, us, assume_unique=True, return_indices=True)
        unique = bool(cr.max(initial=1) == 1 and cs.max(initial=1) == 1)
        return {"answer": int(np.sum(cr[ir].astype(object) * cs[is_].astype(object))) if len(ir) else 0,
                "method": "exact: numpy.unique counts of both sides, intersected (sum of count products)",
                "unique_keys": unique}
    v, it = pagerank_numpy(inp["src"], inp["dst"], inp["nodes"], spec["damping"], spec["iterations"], spec["tolerance"])
    return {"ranks": v, "iterations": it,
            "method": "numpy float64 power iteration (weighted bincount as scatter-add), same damping, iterations and threshold"}


def check(spec: dict, ref: dict, answer) -> tuple[bool, str, float | None]:
    """(matches, how, max relative difference for ranks)."""
    if spec["workload"] != "T3":
        ok = int(answer) == ref["answer"]
        return ok, ("equal to the exact reference" if ok else f"{int(answer)} != exact {ref['answer']}"), None
    v = np.asarray(answer, dtype=np.float64)
    rel = float(np.max(np.abs(v - ref["ranks"]) / ref["ranks"]))
    limit = max(PR_CHECK[spec["dtype"]], spec["tolerance"] * spec["nodes_count"] if spec["tolerance"] > 0 else 0)
    ok = rel <= limit
    return ok, (f"every rank within {limit:g} (relative) of the reference; max {rel:.2e}" if ok
                else f"a rank differs by {rel:.2e} (relative) from the reference, more than {limit:g}"), rel


# ---- the tensor programs on torch --------------------------------------------------------------

def _budget(spec: dict, torch, device) -> int:
    if spec.get("bincount_memory"):
        return int(spec["bincount_memory"])
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 4
    import psutil

    return psutil.virtual_memory().available // 4


def torch_variants(spec: dict, inp: dict, ref: dict, torch, device) -> tuple[list[dict], dict | None]:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    w = spec["workload"]
    plan = None
    if w in ("T1", "T2"):
        arrays = [inp["keys"]] if w == "T1" else [inp["r"], inp["s"]]
        lo = min(int(a.min()) for a in arrays if len(a))
        hi = max(int(a.max()) for a in arrays if len(a))
        unique = w == "T2" and ref.get("unique_keys", False)
        counters = 2 if (w == "T2" and not unique) else 1
        plan = rename.plan(lo, hi, sum(len(a) for a in arrays), spec["rename"], _budget(spec, torch, device),
                           counters=counters, what=w)
    out = []
    for name in ("eager", "compiled"):
        if name not in spec["variants"]:
            continue
        t0 = _clock(sync)
        if w == "T3":
            tensors = [torch.from_numpy(inp["src"]).to(device), torch.from_numpy(inp["dst"]).to(device)]
        else:
            tensors = [torch.from_numpy(a).to(device) for a in ([inp["keys"]] if w == "T1" else [inp["r"], inp["s"]])]
        h2d = _clock(sync) - t0
        rec = {"name": name, "engine": f"torch {torch.__version__}" + (" + torch.compile (inductor)" if name == "compiled" else ""),
               "device": str(device)}
        if w == "T3":
            rec.update(_run_pagerank(spec, tensors, inp["nodes"], torch, device, name, sync))
        else:
            rec.update(_run_cardinality(spec, w, tensors, plan, ref, torch, name, sync))
        if device.type == "cuda":
            rec["transfer_s"] = h2d  # inputs host -> device (pageable numpy memory); the result back is a scalar
        ok, how, rel = check(spec, ref, rec.pop("result"))
        rec.update({"checked": ok, "check": how})
        if rel is not None:
            rec["max_rel_diff"] = rel
        out.append(rec)
        del tensors
    return out, plan.to_json() if plan else None


def _run_cardinality(spec, w, tensors, plan, ref, torch, name, sync) -> dict:
    if w == "T1":
        core = ops.distinct_count
        algo = "count_nonzero(bincount(keys))"
    elif ref.get("unique_keys"):
        core = ops.join_count_unique
        algo = "unique keys: count(bincount(cat(R, S)) == 2)"
    else:
        core = ops.join_count
        algo = "non-unique keys: sum(bincount(R)[:l] * bincount(S)[:l])"
    kernel = torch.compile(core, dynamic=False) if name == "compiled" else core

    def program():
        if plan.method == "offset":
            ins = [t - plan.offset for t in tensors]
            bins = plan.bins
        elif plan.method == "dense":
            ins, bins = ops.rename_dense(*tensors)
        else:
            ins, bins = tensors, plan.bins
        return kernel(*ins, bins)

    rec = {"algorithm": algo + ("" if plan.method == "none" else f", after renaming ({plan.method})")}
    warmup = spec["warmup"]
    if name == "compiled":
        t0 = _clock(sync)
        program()
        rec["compile_s"] = _clock(sync) - t0  # the first call compiles (and runs once)
        warmup = max(0, warmup - 1)
    times, res = _timed(program, spec["runs"], warmup, sync)
    rec.update({"times_s": times, "result": int(res)})
    return rec


def _run_pagerank(spec, tensors, n, torch, device, name, sync) -> dict:
    dtype = getattr(torch, spec["dtype"])
    src, dst = tensors
    inv_out, dangling = ops.pagerank_prerequisites(src, n, dtype)
    step = torch.compile(ops.pagerank_step, dynamic=False) if name == "compiled" else ops.pagerank_step
    rec = {"algorithm": "scatter_add over the edge tensors (src, dst), per iteration"}

    def program():
        return ops.pagerank(step, src, dst, inv_out, dangling, n, spec["damping"], spec["iterations"], spec["tolerance"], sync)

    warmup = spec["warmup"]
    if name == "compiled":
        t0 = _clock(sync)
        program()
        rec["compile_s"] = _clock(sync) - t0
        warmup = max(0, warmup - 1)
    times, (v, it, delta) = _timed(program, spec["runs"], warmup, sync)
    rec.update({"times_s": times, "iterations": it, "last_l1_change": None if delta != delta else delta,
                "result": v.double().cpu().numpy()})
    return rec


# ---- in-process baselines ----------------------------------------------------------------------

def sql_variant(spec: dict, inp: dict, ref: dict) -> dict:
    import duckdb
    import pyarrow as pa

    con = duckdb.connect()
    try:
        con.execute(f"SET threads = {int(spec['threads'])}")
        if spec["workload"] == "T1":
            con.register("src_keys", pa.table({"k": inp["keys"]}))
            con.execute("CREATE TABLE t AS SELECT k FROM src_keys")
            sql = "SELECT count(DISTINCT k) FROM t"
        else:
            con.register("src_r", pa.table({"k": inp["r"]}))
            con.register("src_s", pa.table({"k": inp["s"]}))
            con.execute("CREATE TABLE r AS SELECT k FROM src_r")
            con.execute("CREATE TABLE s AS SELECT k FROM src_s")
            sql = "SELECT count(*) FROM r JOIN s USING (k)"
        times, res = _timed(lambda: con.execute(sql).fetchone()[0], spec["runs"], spec["warmup"])
        ok, how, _ = check(spec, ref, res)
        return {"name": SQL_VARIANT, "engine": f"duckdb {duckdb.__version__}", "device": "cpu", "algorithm": sql,
                "times_s": times, "checked": ok, "check": how, "note": "data loaded into DuckDB tables before timing"}
    finally:
        con.close()


def scipy_variant(spec: dict, inp: dict, ref: dict) -> dict:
    import scipy
    import scipy.sparse as sp

    n, src, dst, d = inp["nodes"], inp["src"], inp["dst"], spec["damping"]
    dt = np.dtype(spec["dtype"])
    out = np.bincount(src, minlength=n).astype(dt)
    inv = np.divide(1.0, out, out=np.zeros(n, dtype=dt), where=out > 0)
    m = sp.csr_matrix((inv[src], (dst, src)), shape=(n, n), dtype=dt)  # duplicates summed; built before timing
    dangling = out == 0

    def program():
        v = np.full(n, 1.0 / n, dtype=dt)
        it = 0
        for it in range(1, spec["iterations"] + 1):
            nv = (1 - d) / n + d * (m @ v + v[dangling].sum() / n)
            delta = float(np.abs(nv - v).sum())
            v = nv
            if spec["tolerance"] > 0 and delta < spec["tolerance"]:
                break
        return v, it

    times, (v, it) = _timed(program, spec["runs"], spec["warmup"])
    ok, how, rel = check(spec, ref, v)
    return {"name": "scipy", "engine": f"scipy {scipy.__version__}", "device": "cpu",
            "algorithm": "CSR sparse matrix-vector product per iteration (matrix built before timing)",
            "times_s": times, "iterations": it, "checked": ok, "check": how, "max_rel_diff": rel}


def gpu_library_variant(spec: dict, inp: dict, ref: dict) -> dict:
    """cuDF (T1, T2) or cugraph (T3) on the GPU, where they are installed."""
    name = "cugraph" if spec["workload"] == "T3" else "cudf"
    try:
        import cudf  # noqa: F401
        if name == "cugraph":
            import cugraph
    except ImportError as e:
        return {"name": name, "skipped": f"not installed ({e}); pip install {name}-cu12 where a GPU is present"}
    import cudf

    if spec["workload"] == "T1":
        col = cudf.Series(inp["keys"])
        times, res = _timed(lambda: int(col.nunique()), spec["runs"], spec["warmup"])
        algo = "cudf.Series.nunique"
    elif spec["workload"] == "T2":
        r, s = cudf.DataFrame({"k": inp["r"]}), cudf.DataFrame({"k": inp["s"]})
        times, res = _timed(lambda: len(r.merge(s, on="k")), spec["runs"], spec["warmup"])
        algo = "cudf.DataFrame.merge (materialized), its length"
    else:
        g = cugraph.Graph(directed=True)
        g.from_cudf_edgelist(cudf.DataFrame({"src": inp["src"], "dst": inp["dst"]}), source="src", destination="dst")
        times, pr = _timed(lambda: cugraph.pagerank(g, alpha=spec["damping"], max_iter=spec["iterations"],
                                                    tol=spec["tolerance"] or 1e-12), spec["runs"], spec["warmup"])
        pr = pr.to_pandas().sort_values("vertex")
        res = np.zeros(inp["nodes"])
        res[pr["vertex"].to_numpy()] = pr["pagerank"].to_numpy()
        algo = "cugraph.pagerank (graph built before timing)"
    ok, how, rel = check(spec, ref, res)
    out = {"name": name, "engine": f"{name} {sys.modules[name].__version__}", "device": "cuda", "algorithm": algo,
           "times_s": times, "checked": ok, "check": how}
    if rel is not None:
        out["max_rel_diff"] = rel
    return out


# ---- the run --------------------------------------------------------------------------------------

def dump(spec: dict, inp: dict) -> dict[str, str]:
    d = spec.get("dump_dir")
    if not d:
        return {}
    names = {"T1": ("keys",), "T2": ("r", "s")}.get(spec["workload"], ())
    out = {}
    for k in names:
        path = os.path.join(d, f"{k}.i64")
        inp[k].astype("<i8", copy=False).tofile(path)
        out[k] = path
    return out


def run(spec: dict) -> dict:
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError as e:
        raise WorkerError(f"the tensor runtime is not installed ({e}); run `tilewise extras install tensor`") from None
    torch.set_num_threads(int(spec["threads"]))
    device = torch.device(spec["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkerError("--device cuda: torch sees no CUDA device here (no driver, or a CPU-only torch build)")
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    inp = make_inputs(spec)
    gen_s = time.perf_counter() - t0
    if spec["workload"] == "T3":
        spec = dict(spec, nodes_count=inp["nodes"])
    t0 = time.perf_counter()
    ref = reference(spec, inp)
    ref_s = time.perf_counter() - t0
    files = dump(spec, inp)
    variants, plan = torch_variants(spec, inp, ref, torch, device)
    if SQL_VARIANT in spec["variants"]:
        variants.append(sql_variant(spec, inp, ref))
    if "scipy" in spec["variants"]:
        variants.append(scipy_variant(spec, inp, ref))
    if any(v in spec["variants"] for v in ("cudf", "cugraph")):
        variants.append(gpu_library_variant(spec, inp, ref))
    for v in variants:
        if v.get("times_s"):
            v["median_s"] = statistics.median(v["times_s"])
    doc = {"workload": spec["workload"], "device": str(device), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "import_s": import_s, "gen_s": gen_s, "reference_s": ref_s,
           "reference": {k: v for k, v in ref.items() if k != "ranks"}, "rename": plan, "files": files,
           "variants": variants, "pinned_cpus": spec.get("pin") or None,
           "omp_places": os.environ.get("OMP_PLACES")}
    if spec["workload"] == "T3":
        doc.update({"nodes": inp["nodes"], "edges": int(len(inp["src"]))})
    if device.type == "cuda":
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)  # what CUDA itself runs on
        doc["gpu"] = {"name": torch.cuda.get_device_name(device), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "count": torch.cuda.device_count(), "cuda_uuid": str(uuid) if uuid is not None else None}
    doc["max_rss_bytes"] = _vmhwm()
    return doc


def _vmhwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv: list[str]) -> int:
    try:
        with open(argv[1]) as f:
            spec = json.load(f)
        doc = run(spec)
    except (WorkerError, TilewiseError) as e:  # rename refusals are UsageErrors
        print(json.dumps({"error": str(e), "usage": isinstance(e, UsageError)}))
        return 0
    except MemoryError:
        print(json.dumps({"error": "out of memory while running the workload", "usage": True}))
        return 0
    print(json.dumps(doc, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
