"""Running a tensor workload (T1-T3): parameters, the bound worker, the native baseline, checks and
ratios, and the thesis's figures beside them.

The worker (tilewise.tensor.worker) runs bound by the same `Config` as W1-W4 (allocator, memory
policy, thread placement: the CPU order becomes OMP_PLACES for torch's OpenMP threads) and, on a
GPU, sees only its GPU (CUDA_VISIBLE_DEVICES=<UUID>). The native baselines (tw_t1_distinct,
tw_t2_joincount) run bound the same way on the very keys the worker generated (raw int64 files in
a private temporary folder, removed afterwards). Every answer is checked against an exact
reference; a wrong answer fails the run after its figures are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass

from tilewise import devices, dirs, native
from tilewise.errors import TilewiseError, UsageError
from tilewise.tensor import DESCRIPTIONS, SQL_VARIANT, WORKLOADS, data, rename
from tilewise.tune import knobs
from tilewise.tune.workloads import _run_bound

VARIANTS = {"T1": ("eager", "compiled", "native", SQL_VARIANT, "cudf"),
            "T2": ("eager", "compiled", "native", SQL_VARIANT, "cudf"),
            "T3": ("eager", "compiled", "scipy", "cugraph")}
GPU_ONLY = ("cudf", "cugraph")
DATASETS = {"T1": data.T1_DATASETS, "T2": data.T2_DATASETS, "T3": ("rmat",)}
DTYPES = ("float64", "float32")
DEFAULTS = {"T1": {"dataset": "unique", "records": 10_000_000},
            "T2": {"dataset": "unique", "records": 4_000_000, "ratio": 1},
            "T3": {"dataset": "rmat", "scale": 0.01, "iterations": 50, "tolerance": 0.0, "damping": 0.85,
                   "dtype": "float64"}}
# --paper-scale: LiveJournal itself for T3 (the thesis's input); for T1/T2 the thesis's text states
# no largest size, only that the join curves meet "from 10 million elements for each relation".
PAPER_SCALE = {"T1": {"records": 10_000_000}, "T2": {"records": 10_000_000}, "T3": {"scale": 1.0}}
NATIVE = {"T1": "tw_t1_distinct", "T2": "tw_t2_joincount"}

# The thesis's figures (004, sections 3.3.3 and 3.4.3), as the ratio variant time / tensor eager time
# where the text gives one (> 1: the variant is slower than the tensor program).
THESIS = {
    ("T1", "cpu", "native"): ((2.0, 4.0), "C++ distinct-hash 2-4x slower than PyTorch (1 thread, Xeon E5-2690 v4)"),
    ("T1", "cpu", SQL_VARIANT): ((2.0, 20.0), "SQL Server count(distinct) 2-20x slower (6 vCPUs); DuckDB stands in here"),
    ("T2", "cpu", "native"): (None, "hash joins counting only: npo faster for small inputs, gap closing with size; "
                                     "rpo 1.5-5x slower, the same from 10M rows per side (6 threads)"),
    ("T2", "cpu", "compiled"): ((1.0, 1.0), "TVM gave no gain for bincount"),
    ("T2", "cuda", "native"): (None, "on GPU: crystal 2-16x faster than PyTorch, the gap closing as inputs grow"),
    ("T3", "cpu", "scipy"): ((1.0, 1.0), "PyTorch on par with scipy and taco (LiveJournal, 50 iterations)"),
    ("T3", "cpu", "compiled"): ((1 / 1.45, 1 / 1.45), "TVM 45 % faster than PyTorch"),
    ("T3", "cuda", "cugraph"): ((2.3, 2.3), "PyTorch 2.3x faster than cugraph computing, 3x including transfer"),
    ("T3", "cuda", "compiled"): ((0.2, 0.2), "TVM 5x faster than PyTorch on GPU"),
}


@dataclass(frozen=True)
class Params:
    workload: str
    dataset: str | None = None
    records: int | None = None
    groups: int | None = None
    zipf_exponent: float | None = None
    ratio: int | None = None
    scale: float | None = None
    iterations: int | None = None
    tolerance: float | None = None
    damping: float | None = None
    dtype: str | None = None
    threads: int | None = None
    seed: int | None = None
    device: str = "cpu"
    rename: str = "auto"
    bincount_memory: int | None = None
    variants: tuple[str, ...] | None = None
    runs: int = 3
    warmup: int = 1

    def resolved(self) -> dict:
        """Every parameter with the workload's defaults filled in (what the worker gets)."""
        d = {k: v for k, v in asdict(self).items()}
        for k, v in DEFAULTS[self.workload].items():
            if d.get(k) is None:
                d[k] = v
        if self.workload != "T3":
            d["groups"] = d["groups"] or d["records"]
            d["zipf_exponent"] = 0.5 if d["zipf_exponent"] is None else d["zipf_exponent"]
            d["ratio"] = d["ratio"] or 1
        d["seed"] = 42 if d["seed"] is None else d["seed"]
        d["variants"] = list(self.variants or default_variants(self.workload, self.device))
        return d

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def default_variants(workload: str, device: str) -> tuple[str, ...]:
    return tuple(v for v in VARIANTS[workload] if v not in GPU_ONLY or device != "cpu")


def parse_variants(text: str, workload: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    bad = [x for x in items if x not in VARIANTS[workload]]
    if bad or not items:
        raise UsageError(f"--variants {text!r}: {workload} has no variant {', '.join(bad) or '(none given)'}",
                         f"choose from {', '.join(VARIANTS[workload])}")
    return items


def validate(p: Params) -> None:
    w = p.workload
    if w not in WORKLOADS:
        raise UsageError(f"unknown tensor workload {w!r}", f"choose one of {', '.join(WORKLOADS)}")
    if p.dataset is not None and p.dataset not in DATASETS[w]:
        raise UsageError(f"{w} datasets are {', '.join(DATASETS[w])}, not {p.dataset!r}")
    if w == "T3":
        given = [f for f, v in (("--records", p.records), ("--groups", p.groups), ("--ratio", p.ratio),
                                ("--zipf-exponent", p.zipf_exponent), ("--bincount-memory", p.bincount_memory)) if v is not None]
        if given or p.rename != "auto":
            given = given or ["--rename"]
            raise UsageError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to T3 (a graph: --scale, "
                             "--iterations, --tolerance, --damping, --dtype)")
    else:
        given = [f for f, v in (("--scale", p.scale), ("--iterations", p.iterations), ("--tolerance", p.tolerance),
                                ("--damping", p.damping), ("--dtype", p.dtype)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to T3 (PageRank), not {w}")
        if w == "T1" and p.ratio is not None:
            raise UsageError("--ratio applies to T2 (probe rows per build row), not T1")
        if p.dataset in ("unique",) and p.groups is not None:
            raise UsageError("--groups does not apply to the unique dataset (it has --records distinct keys)",
                             "use --dataset uniform or zipf")
    if p.rename not in rename.METHODS:
        raise UsageError(f"unknown --rename {p.rename!r}", f"choose one of {', '.join(rename.METHODS)}")
    if p.dtype is not None and p.dtype not in DTYPES:
        raise UsageError(f"--dtype {p.dtype!r}", f"choose {' or '.join(DTYPES)}")
    if p.scale is not None and not 0 < p.scale <= 64:
        raise UsageError(f"--scale {p.scale:g} is out of range", "give a factor in (0, 64]; 1 = LiveJournal's size")
    if p.damping is not None and not 0 < p.damping < 1:
        raise UsageError(f"--damping {p.damping:g} must be between 0 and 1 (exclusive)")
    if p.device != "cpu":
        head = p.device.split(":", 1)[0].lower()
        if head != "cuda":
            raise UsageError(f"--device {p.device!r}: not a device", "use cpu, cuda, cuda:N or cuda:GPU-<uuid>")
    gpu_only = [v for v in (p.variants or ()) if v in GPU_ONLY]
    if gpu_only and p.device == "cpu":
        raise UsageError(f"--variants {','.join(gpu_only)} run on a GPU", "add --device cuda, or leave them out")


def key_range(d: dict) -> tuple[int, int] | None:
    """The keys' range known from the parameters alone (None for sparse keys: the data say)."""
    if d["dataset"] == "unique":
        return 0, d["records"] * (d["ratio"] if d["workload"] == "T2" else 1) - 1
    if d["dataset"] == "uniform":
        return 0, (d["records"] if d["workload"] == "T2" else d["groups"]) - 1
    if d["dataset"] == "zipf":
        return 0, d["groups"] - 1
    return None


def precheck_rename(d: dict) -> None:
    """--rename none|offset that cannot fit: refused before any data is made (the worker checks the
    data's real range again, with the device's free memory for a GPU)."""
    rng = key_range(d)
    if rng is None or d["rename"] not in ("none", "offset") or d["device"] != "cpu":
        return
    import psutil

    budget = d["bincount_memory"] or psutil.virtual_memory().available // 4
    counters = 1 if (d["workload"] == "T1" or d["dataset"] == "unique") else 2
    rename.plan(rng[0], rng[1], d["records"], d["rename"], budget, counters=counters, what=d["workload"])


def estimate_bytes(d: dict) -> int:
    """Peak memory of the worker (data, reference, tensors, baselines), roughly: for the refusal
    before starting, not a measurement."""
    w = d["workload"]
    if w == "T1":
        return 8 * d["records"] * 7
    if w == "T2":
        return 8 * d["records"] * (1 + d["ratio"]) * 7
    nodes, edges = data.graph_size(d["scale"])
    return edges * 8 * 9 + nodes * 8 * 12


def check_memory(d: dict, available: int | None = None) -> None:
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    need = estimate_bytes(d)
    if need > 0.8 * available:
        knob = "--scale" if d["workload"] == "T3" else "--records"
        raise UsageError(f"{d['workload']} at this size needs about {rename.human(need)} of memory, and "
                         f"{rename.human(available)} is available", f"use a smaller {knob}")


# ---- results: ratios and the thesis's figures (pure) ------------------------------------------

def summarize(doc: dict, device: str) -> dict:
    """Ratios of every variant to the tensor program run eagerly, with the thesis's figure beside
    each, and whether every answer was checked."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    by = {v["name"]: v for v in doc["variants"] if v.get("median_s") is not None}
    base = by.get("eager")
    rows = []
    for v in doc["variants"]:
        row = {"name": v["name"], "engine": v.get("engine"), "device": v.get("device"), "median_s": v.get("median_s"),
               "checked": v.get("checked"), "skipped": v.get("skipped")}
        if base and v.get("median_s") is not None and base["median_s"] > 0:
            row["ratio_to_eager"] = v["median_s"] / base["median_s"]
            if base.get("transfer_s") is not None:
                with_t = v["median_s"] + (v.get("transfer_s") or 0.0)
                row["ratio_to_eager_with_transfer"] = with_t / (base["median_s"] + base["transfer_s"])
        fig = THESIS.get((doc["workload"], kind, v["name"]))
        if fig:
            row["thesis"] = {"ratio_to_eager": list(fig[0]) if fig[0] else None, "text": fig[1]}
        rows.append(row)
    ran = [v for v in doc["variants"] if not v.get("skipped")]
    checked = bool(ran) and all(v.get("checked") for v in ran)
    return {"rows": rows, "checked": checked}


def check_text(doc: dict) -> str:
    ref = doc.get("reference") or {}
    return ref.get("method", "")


# ---- running ------------------------------------------------------------------------------------

def preflight(p: Params) -> dict:
    """Every refusal that needs no data: bad parameters, too little memory, bincount too large."""
    validate(p)
    d = p.resolved()
    check_memory(d)
    precheck_rename(d)
    return d


def worker(spec_path: str, pin: list[int] | None, gpu_uuid: str | None) -> tuple[list[str], dict]:
    """The worker's argv and environment: torch's OpenMP threads on the placement's CPUs (in order),
    only its GPU visible."""
    argv, env = native.python_worker("tilewise.tensor.worker", spec_path)
    if pin:
        env["OMP_PLACES"] = ",".join("{%d}" % c for c in pin)
        env["OMP_PROC_BIND"] = "close"
    return argv, devices.cuda_env(env, gpu_uuid)


def native_argv(workload: str, files: dict[str, str], threads: int, pin: list[int] | None, runs: int, warmup: int) -> list[str]:
    a = [native.binary(NATIVE[workload])]
    a += ["--keys", files["keys"]] if workload == "T1" else ["--r", files["r"], "--s", files["s"]]
    a += ["--threads", str(threads), "--runs", str(runs), "--warmup", str(warmup)]
    if pin:
        a += ["--pin", ",".join(map(str, pin))]
    return a


def run(p: Params, cfg, topo, *, timeout: float = 600, cpus: tuple[int, ...] | None = None,
        gpu=None, on_message=None) -> dict:
    """One run of a tensor workload under cfg (bound to cpus when given, to gpu: a devices.PciDevice).
    Returns the worker's document plus the native baseline, the summary, the bindings read back."""
    d = preflight(p)
    allowed = set(cpus) if cpus else set(os.sched_getaffinity(0))
    threads = d["threads"] or len(allowed)
    d["threads"] = threads
    pin = knobs.thread_order(topo, cfg.placement, threads, allowed)
    d["pin"] = pin
    d["device"] = "cuda:0" if gpu is not None else "cpu"  # the worker sees only its GPU
    want_native = "native" in d["variants"]
    if want_native:
        native.binary(NATIVE[p.workload])  # not built: one line before anything runs
    tmp = tempfile.mkdtemp(prefix="tilewise-tensor-", dir=dirs.scratch_base())
    try:
        d["dump_dir"] = tmp if want_native else None
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(d, f)
        hint = "use a smaller size or a larger --timeout"
        argv, env = worker(spec_path, pin, gpu.uuid if gpu is not None else None)
        out, wall, v = _run_bound(argv, cfg, p.workload, timeout, hint, capture=True, cpus=cpus, env=env)
        doc = _last_json(out, p.workload)
        if "error" in doc:
            msg = doc["error"] if doc["error"].startswith(f"{p.workload}:") else f"{p.workload}: {doc['error']}"
            raise (UsageError if doc.get("usage") else TilewiseError)(msg)
        problems = [x for x in v.problems if not x.startswith("allocator")]
        if problems:
            raise TilewiseError(f"{p.workload}: binding not applied: " + "; ".join(problems))
        doc["verification"] = v.to_json()
        if gpu is not None:
            doc["verification"]["checks"]["gpu"] = gpu_check(doc.get("gpu") or {}, gpu.uuid)
        doc["wall_s"] = wall
        if want_native:
            if on_message:
                on_message(f"{p.workload}: native baseline {NATIVE[p.workload]}")
            at = sum(1 for x in doc["variants"] if x["name"] in ("eager", "compiled"))
            doc["variants"].insert(at, run_native(p.workload, doc, threads, pin, d, cfg, cpus, timeout))
        doc.pop("files", None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["params"] = {k: v for k, v in d.items() if k not in ("dump_dir", "pin")}
    doc["description"] = DESCRIPTIONS[p.workload]
    doc["summary"] = summarize(doc, doc["device"])
    doc["checked"] = doc["summary"]["checked"]
    doc["check"] = check_text(doc)
    if gpu is not None:
        doc["gpu"] = {**(doc.get("gpu") or {}), **gpu.to_json()}
    return doc


def gpu_check(seen: dict, uuid: str | None) -> dict:
    """The worker's own view (what CUDA listed and ran on) against the GPU it was given: one GPU
    visible, CUDA_VISIBLE_DEVICES its UUID, and CUDA's device UUID the same (where torch reports it)."""
    want = uuid or "(no UUID)"
    cuda = (seen.get("cuda_uuid") or "").lower().removeprefix("gpu-")
    if seen.get("count") != 1 or seen.get("visible") != uuid:
        return {"state": "mismatch", "want": want, "got": f"{seen.get('count')} GPU(s) visible, "
                f"CUDA_VISIBLE_DEVICES={seen.get('visible')}", "detail": None}
    if not cuda:
        return {"state": "not checkable", "want": want, "got": None, "detail": "torch reports no device UUID; "
                f"CUDA_VISIBLE_DEVICES={uuid} and one GPU visible"}
    same = uuid is not None and cuda == uuid.lower().removeprefix("gpu-")
    return {"state": "verified" if same else "mismatch", "want": want, "got": f"CUDA device {cuda}", "detail": None}


def run_native(workload: str, doc: dict, threads: int, pin, d: dict, cfg, cpus, timeout: float) -> dict:
    argv = native_argv(workload, doc["files"], threads, pin, d["runs"], d["warmup"])
    out, _, v = _run_bound(argv, cfg, NATIVE[workload], timeout, "use a smaller size or a larger --timeout",
                           capture=True, cpus=cpus)
    r = _last_json(out, NATIVE[workload])
    answer, want = int(r["answer"]), doc["reference"]["answer"]
    ok = answer == want
    return {"name": "native", "engine": f"C++ {r.get('baseline')} ({NATIVE[workload]})", "device": "cpu",
            "algorithm": {"T1": "concurrent open-addressing hash set, pre-allocated (not timed), count of new inserts",
                          "T2": "non-partitioned hash join: build counts per R key, probe S, sum (no materialization)"}[workload],
            "times_s": r["times_s"], "median_s": statistics.median(r["times_s"]), "threads": r.get("threads"),
            "checked": ok, "check": "equal to the exact reference" if ok else f"{answer} != exact {want}",
            "max_rss_bytes": r.get("max_rss_bytes"),
            "binding_verified": not [x for x in v.problems if not x.startswith("allocator")]}


def _last_json(out: bytes | None, what: str) -> dict:
    lines = [ln for ln in (out or b"").decode(errors="replace").splitlines() if ln.strip().startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise TilewiseError(f"{what} printed no JSON result") from None


def wrong_answers(doc: dict) -> list[str]:
    return [f"{v['name']}: {v.get('check')}" for v in doc["variants"] if not v.get("skipped") and not v.get("checked")]


