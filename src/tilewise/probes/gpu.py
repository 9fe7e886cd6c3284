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
import sys
from dataclasses import dataclass
from pathlib import Path

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
        from tilewise import cpulist

        return {"gpu": self.gpu_index, "uuid": self.gpu_uuid, "gpu_node": self.gpu_node, "node": self.node,
                "cpus": cpulist.format(self.cpus), "local": self.local}


def cases(topo, gpus, nodes: tuple[int, ...] | None = None) -> list[Case]:
    """Every GPU x every NUMA node with memory (or the nodes asked for). CPUs: the node's own; a
    CPU-less node (CXL, HBM) is driven from the GPU's local CPUs, or the first node with CPUs."""
    from tilewise.errors import UsageError

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


# ---- the results kind probe.gpu ---------------------------------------------------------------------

def metrics(doc: dict) -> list[dict]:
    from tilewise.results import model

    out = []
    for c in doc.get("cases", []):
        for key, v in (c.get("gbs") or {}).items():
            out.append(model.metric(f"gpu{c['gpu']}/node{c['node']}/{key}", v.get("reps", []), unit="GB/s",
                                    better="higher", gpu=c["gpu"], node=c["node"], local=c["local"], copy=key))
    return out


def render(doc: dict, out) -> None:
    from rich.table import Table

    out.print(f"[bold]probe gpu[/bold]: {doc.get('size_bytes', 0) / 2**20:.0f} MiB per copy, {doc.get('reps')} copies per figure, "
              "median GB/s (best)")
    t = Table()
    for col in ("GPU", "node", "", "H2D pinned", "H2D pageable", "D2H pinned", "D2H pageable", "pages on node"):
        t.add_column(col)
    for c in doc.get("cases", []):
        if "gbs" not in c:
            t.add_row(str(c["gpu"]), str(c["node"]), "local" if c["local"] else "", c.get("error", "-"), "", "", "", "")
            continue
        cells = [f"{c['gbs'][f'{d}_{m}']['median']:.1f} ({c['gbs'][f'{d}_{m}']['best']:.1f})" for d in DIRECTIONS for m in MEMORY]
        t.add_row(str(c["gpu"]), str(c["node"]), "local" if c["local"] else "", *cells,
                  ", ".join(f"{k} {v:.0%}" for k, v in (c.get("pages_on_node") or {}).items()))
    out.print(t)
    for s in doc.get("summary", []):
        f = s["figures"]
        if f["h2d_pinned"]["remote_to_local"] is not None:
            out.print(f"  GPU {s['gpu']}: pinned H2D from the slowest remote node is {f['h2d_pinned']['remote_to_local']:.2f}x "
                      f"of the local node's; D2H {f['d2h_pinned']['remote_to_local']:.2f}x", markup=False)
        if s["pinned_to_pageable"].get("h2d") is not None:
            out.print(f"  GPU {s['gpu']}: pinned / pageable on the local node: H2D {s['pinned_to_pageable']['h2d']:.2f}x, "
                      f"D2H {s['pinned_to_pageable']['d2h']:.2f}x", markup=False)


def csv_files(doc: dict) -> dict[str, str]:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["gpu", "uuid", "gpu_node", "node", "local", "copy", "median_gbs", "best_gbs", "reps_gbs"])
    for c in doc.get("cases", []):
        for key, v in (c.get("gbs") or {}).items():
            w.writerow([c["gpu"], c.get("uuid"), c.get("gpu_node"), c["node"], c["local"], key, v["median"], v["best"],
                        " ".join(f"{x:.3f}" for x in v["reps"])])
    return {"gpu.csv": buf.getvalue()}


def plots(doc: dict, out_dir: Path) -> list[Path]:
    done = [c for c in doc.get("cases", []) if "gbs" in c]
    if not done:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [f"{d}_{m}" for d in DIRECTIONS for m in MEMORY]
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(done)), 3.5))
    width = 0.8 / len(keys)
    for i, k in enumerate(keys):
        ax.bar([j + i * width for j in range(len(done))], [c["gbs"][k]["median"] for c in done], width, label=k)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(done))])
    ax.set_xticklabels([f"GPU {c['gpu']}\nnode {c['node']}{' (local)' if c['local'] else ''}" for c in done])
    ax.set_ylabel("GB/s (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "gpu.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


# ---- running (the parent) ---------------------------------------------------------------------------

def run(topo, gpus, size: int, reps: int, nodes: tuple[int, ...] | None = None, timeout: float = 300,
        on_case=None) -> list[dict]:
    from tilewise.tensor.run import worker_env
    from tilewise.tune.knobs import Config
    from tilewise.tune.workloads import _run_bound

    results = []
    for c in cases(topo, gpus, nodes):
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="tilewise-gpu-") as f:
            json.dump({"size": size, "reps": reps, "node": c.node}, f)
            f.flush()
            cfg = Config(mem="membind", mem_nodes=(c.node,))
            out, _, v = _run_bound([sys.executable, "-m", "tilewise.probes.gpu", f.name], cfg, f"probe gpu (node {c.node})",
                                   timeout, "use a smaller --size", capture=True, cpus=c.cpus,
                                   env=worker_env(None, c.gpu_uuid))
        r = json.loads((out or b"{}").decode().strip().splitlines()[-1] or "{}")
        rec = c.to_json() | {"verification": v.to_json()}
        if "error" in r:
            rec["error"] = r["error"]
        else:
            rec.update(r)
        results.append(rec)
        if on_case:
            on_case(results)
    return results


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
        out = {"error": f"the tensor runtime is not installed ({e}); pip install 'tilewise[tensor]'"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
