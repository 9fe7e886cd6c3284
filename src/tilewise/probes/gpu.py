"""`tilewise probe gpu`: host-to-device and device-to-host bandwidth of a GPU from host memory on
each NUMA node, pinned and pageable (the figures that make GPU placement matter, thesis 004 ch. 3).

For every (GPU, node with memory) one process is started bound by tilewise.launch: its CPUs are
the node's (the GPU's local CPUs for a CPU-less node) and its memory policy is membind to the node,
so the host buffers it allocates (page-locked with cudaHostAlloc through torch's pin_memory, and
ordinary pageable memory) land on that node; it checks where their pages are (move_pages) and
reports. It sees only its GPU (CUDA_VISIBLE_DEVICES=<UUID>). Copies are timed with CUDA events,
a warm-up copy first, the median and best of `reps`.

Run as `python -m tilewise.probes.gpu SPEC.json` it is that process.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from tilewise import cpulist, devices, native, topology
from tilewise.binding import Binding
from tilewise.environment import system_check
from tilewise.errors import TilewiseError, UsageError
from tilewise.launch import Supervisor
from tilewise.results import model

DIRECTIONS = ("h2d", "d2h")
MEMORY = ("pinned", "pageable")


@dataclass(frozen=True)
class Case:
    gpu_index: int
    gpu_uuid: str
    gpu_node: int | None
    node: int
    cpus: tuple[int, ...]
    local: bool

    def to_json(self) -> dict:
        return {"gpu": self.gpu_index, "uuid": self.gpu_uuid, "gpu_node": self.gpu_node, "node": self.node,
                "cpus": cpulist.format(self.cpus), "local": self.local}


def cases(topo, gpus, nodes: tuple[int, ...] | None = None) -> list[Case]:
    """Every GPU x every NUMA node with memory (or the nodes asked for). CPUs: the node's own; a
    CPU-less node (CXL, HBM) is driven from the GPU's local CPUs, or the first node with CPUs."""
    mem_nodes = [n for n in topo.numa_nodes if n.memory_bytes > 0 or n.cpus]
    if nodes is not None:
        known = {n.id for n in topo.numa_nodes}
        bad = [x for x in nodes if x not in known]
        if bad:
            raise UsageError(f"--nodes: node(s) {', '.join(map(str, bad))} do not exist here",
                             f"nodes: {', '.join(str(n.id) for n in topo.numa_nodes)}")
        mem_nodes = [n for n in topo.numa_nodes if n.id in nodes]
    out = []
    for g in gpus:
        fallback = tuple(g.local_cpus) or next((tuple(n.cpus) for n in topo.numa_nodes if n.cpus), ())
        for n in mem_nodes:
            out.append(Case(g.index, g.uuid, g.numa_node, n.id, tuple(n.cpus) or fallback, g.numa_node == n.id))
    return out


def summarize(case_results: list[dict]) -> list[dict]:
    """Per GPU: the local node's figures, the best remote node's, and remote/local ratios."""
    out = []
    for gpu in sorted({c["gpu"] for c in case_results}):
        rows = [c for c in case_results if c["gpu"] == gpu and "gbs" in c]
        local = [c for c in rows if c["local"]]
        remote = [c for c in rows if not c["local"]]
        s = {"gpu": gpu, "local_node": local[0]["node"] if local else None, "figures": {}}
        for d in DIRECTIONS:
            for m in MEMORY:
                key = f"{d}_{m}"
                lv = local[0]["gbs"][key]["median"] if local else None
                rv = [c["gbs"][key]["median"] for c in remote]
                s["figures"][key] = {"local_gbs": lv, "remote_min_gbs": min(rv) if rv else None,
                                     "remote_to_local": (min(rv) / lv) if (rv and lv) else None}
        s["pinned_to_pageable"] = {d: (local[0]["gbs"][f"{d}_pinned"]["median"] / local[0]["gbs"][f"{d}_pageable"]["median"])
                                   if local and local[0]["gbs"][f"{d}_pageable"]["median"] else None for d in DIRECTIONS}
        out.append(s)
    return out


# ---- running (the parent) ---------------------------------------------------------------------------

def run_cases(topo, gpus, size: int, reps: int, nodes: tuple[int, ...] | None = None, timeout: float = 300,
              on_case=None) -> list[dict]:
    """Every case in its own bound process (verified from /proc before it measures); results in
    case order, given to on_case after each."""
    results = []
    for c in cases(topo, gpus, nodes):
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="tilewise-gpu-") as f, \
                tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
            json.dump({"size": size, "reps": reps, "node": c.node}, f)
            f.flush()
            argv, env = native.python_worker("tilewise.probes.gpu", f.name)
            with Supervisor() as sup:
                s = sup.start(f"probe gpu {c.gpu_index} node {c.node}", argv, Binding(c.cpus, "membind", (c.node,)),
                              env=devices.cuda_env(env, c.gpu_uuid), stdout=so, stderr=se, stdin=subprocess.DEVNULL)
                try:
                    rc = s.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise TilewiseError(f"probe gpu: GPU {c.gpu_index} from node {c.node} took longer than {timeout:g} s",
                                        "use a smaller --size or fewer --reps") from None
            so.seek(0)
            se.seek(0)
            lines = so.read().decode(errors="replace").strip().splitlines()
            if rc != 0 or not lines:
                tail = se.read().decode(errors="replace").strip().splitlines()[-1:]
                raise TilewiseError(f"probe gpu: the process for GPU {c.gpu_index}, node {c.node} failed (status {rc})"
                                    + (f": {tail[0]}" if tail else ""))
        r = json.loads(lines[-1])
        rec = c.to_json() | {"verification": s.verification.to_json() if s.verification else None}
        rec.update(r)
        results.append(rec)
        if on_case:
            on_case(results)
    return results


@dataclass
class Config:
    device: str = "cuda"  # cuda[:N|:UUID], or all: every GPU CUDA can use
    size: int = 256 * 2**20  # bytes moved per copy
    reps: int = 20  # timed copies per figure (a warm-up first)
    nodes: str | None = None  # --nodes: host memory on these NUMA nodes (default: all with memory)
    timeout: float = 300  # seconds per (GPU, node)


def run(cfg: Config, reporter=None, *, writer: Callable[[dict], None] | None = None) -> dict:
    """Every GPU from every node; returns the probe.gpu results document with its summary and
    metrics (given to `writer` after each case and when interrupted)."""
    write = writer or (lambda doc: None)
    found = devices.discover()
    if cfg.device.strip().lower() == "all":
        if not found.cuda:
            devices.resolve_cuda("cuda", found)  # the one-line refusal, with what is here
        gpus = list(found.cuda)
    else:
        gpus = [devices.resolve_cuda(cfg.device, found)]
    t = topology.load(None)
    nodes = tuple(cpulist.parse(cfg.nodes, what="--nodes")) if cfg.nodes else None
    doc = model.new("probe.gpu", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"device": cfg.device, "size": cfg.size, "reps": cfg.reps, "nodes": list(nodes) if nodes else None})
    doc.update({"probe": "gpu", "unit": "GB/s", "size_bytes": cfg.size, "reps": cfg.reps,
                "gpus": [g.to_json() for g in gpus], "driver": found.driver, "cases": []})
    try:
        def on_case(cases):
            doc["cases"] = cases
            write(doc)

        run_cases(t, gpus, cfg.size, cfg.reps, nodes, cfg.timeout, on_case=on_case)
        doc["summary"] = summarize(doc["cases"])
        model.finish(doc, complete=all("gbs" in c for c in doc["cases"]))
    except BaseException as e:
        model.stopped(doc, e)
        write(doc)
        raise
    return doc


# ---- the bound process (needs torch with CUDA and a GPU) ---------------------------------------------

def _pages_on_node(ptr: int, nbytes: int, node: int) -> float | None:
    """Share of the buffer's pages on `node` (move_pages with no target only reports)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    first = ptr - ptr % page
    count = (ptr + nbytes - first + page - 1) // page
    step = max(1, count // 256)  # a sample of the pages
    addrs = [first + i * page for i in range(0, count, step)]
    arr = (ctypes.c_void_p * len(addrs))(*addrs)
    status = (ctypes.c_int * len(addrs))()
    if libc.syscall(279, 0, ctypes.c_ulong(len(addrs)), arr, None, status, 0) != 0:  # SYS_move_pages (x86-64)
        return None
    return sum(1 for s in status if s == node) / len(addrs)


def measure(spec: dict) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"error": "torch sees no CUDA device (no driver, or a CPU-only torch)"}
    dev = torch.device("cuda:0")
    n = spec["size"]
    dbuf = torch.empty(n, dtype=torch.uint8, device=dev)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(1)  # touched here, so the pages are on the bound node
    pageable = torch.ones(n, dtype=torch.uint8)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gbs = {}
    for mem, host in (("pinned", pinned), ("pageable", pageable)):
        for d in DIRECTIONS:
            rates = []
            for i in range(spec["reps"] + 1):
                start.record()
                if d == "h2d":
                    dbuf.copy_(host, non_blocking=(mem == "pinned"))
                else:
                    host.copy_(dbuf, non_blocking=(mem == "pinned"))
                end.record()
                end.synchronize()
                if i:  # the first copy is a warm-up
                    rates.append(n / (start.elapsed_time(end) * 1e6))
            gbs[f"{d}_{mem}"] = {"median": statistics.median(rates), "best": max(rates), "reps": rates}
    pages = {"pinned": _pages_on_node(pinned.data_ptr(), n, spec["node"]),
             "pageable": _pages_on_node(pageable.data_ptr(), n, spec["node"])}
    return {"gbs": gbs, "pages_on_node": {k: v for k, v in pages.items() if v is not None},
            "gpu_name": torch.cuda.get_device_name(dev), "torch": torch.__version__}


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        out = measure(spec)
    except ImportError as e:
        out = {"error": f"the tensor runtime is not installed ({e}); run `tilewise extras install tensor`"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
