"""The results kind `probe.gpu` (`tilewise probe gpu`): its table, CSV and plot. The metrics (one
per GPU, node and copy: the timed copies in GB/s) are written by the producer (tilewise.probes.gpu)."""

from __future__ import annotations

from pathlib import Path

from tilewise.results import plots as P
from tilewise.results.document import metric
from tilewise.results.kinds import Kind
from tilewise.results.tables import csv_text

DIRECTIONS = ("h2d", "d2h")  # as tilewise.probes.gpu writes them: "<direction>_<memory>"
MEMORY = ("pinned", "pageable")
FILES = ("gpu.csv", "gpu.png")


def metrics(doc: dict) -> list[dict]:
    """One metric per (GPU, node, copy): its timed copies in GB/s (the producer stores them)."""
    out = []
    for c in doc.get("cases", []):
        for key, v in (c.get("gbs") or {}).items():
            out.append(metric(f"gpu{c['gpu']}/node{c['node']}/{key}", v.get("reps", []), unit="GB/s",
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
    rows = [[c["gpu"], c.get("uuid"), c.get("gpu_node"), c["node"], c["local"], key, v["median"], v["best"],
             " ".join(f"{x:.3f}" for x in v["reps"])]
            for c in doc.get("cases", []) for key, v in (c.get("gbs") or {}).items()]
    return {"gpu.csv": csv_text(["gpu", "uuid", "gpu_node", "node", "local", "copy", "median_gbs", "best_gbs",
                                 "reps_gbs"], rows)}


def plots(doc: dict, out_dir: Path) -> list[Path]:
    done = [c for c in doc.get("cases", []) if "gbs" in c]
    if not done:
        return []

    plt = P.pyplot()

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
    return [P.save(fig, Path(out_dir) / "gpu.png", dpi=110)]


KIND = Kind.plain("probe.gpu", render, csv_files, plots, FILES)
