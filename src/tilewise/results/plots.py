"""The plots of the reporting module (matplotlib, Agg): every figure is drawn from a results
document and written atomically (fsutil.save_figure)."""

from __future__ import annotations

from pathlib import Path

from tilewise import fsutil


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    return fsutil.save_figure(fig, path, bbox_inches="tight")


def bar_chart(path: Path, categories: list[str], series: dict[str, list[float | None]], *,
              ylabel: str, title: str, reference_line: float | None = 1.0) -> Path:
    """Grouped bars: one group per category, one bar per series (None -> no bar)."""
    plt = _plt()
    n = max(1, len(series))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(categories) * max(1, n) ** 0.5 + 2), 3.6))
    try:
        for k, (label, vals) in enumerate(series.items()):
            pts = [(i + (k - (n - 1) / 2) * width, v) for i, v in enumerate(vals) if v is not None]
            ax.bar([x for x, _ in pts], [v for _, v in pts], width=width, label=label)
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels(categories, rotation=0 if len(categories) <= 8 else 60, fontsize=8)
        if reference_line is not None:
            ax.axhline(reference_line, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if n > 1:
            ax.legend(fontsize=8)
        return save(fig, path)
    finally:
        plt.close(fig)


def heatmap(path: Path, cpus, matrix, title: str, unit: str) -> Path:
    """CPU x CPU heatmap, unmeasured pairs blank."""
    import numpy as np

    plt = _plt()
    n = len(cpus)
    m = np.full((n, n), np.nan)
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            if v is not None and i != j:
                m[i, j] = v
    size = min(12, 3 + n * 0.12)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(np.ma.masked_invalid(m), cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=unit)
    ax.set_title(title)
    ax.set_xlabel("CPU (second of the pair)")
    ax.set_ylabel("CPU (first of the pair; memory on its node)")
    step = max(1, n // 16)
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [str(cpus[k]) for k in ticks])
    ax.set_yticks(ticks, [str(cpus[k]) for k in ticks])
    if n <= 8:
        for i in range(n):
            for j in range(n):
                if not np.isnan(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.1f}", ha="center", va="center", color="w", fontsize=8)
    return save(fig, path)


def stream(doc: dict, path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, k in zip(axes, ("copy", "triad")):
        for pol in dict.fromkeys(c["policy"] for c in doc["cases"]):
            cs = sorted((c for c in doc["cases"] if c["policy"] == pol), key=lambda c: c["size_bytes"])
            n = cs[0]["instances"]
            ax.plot([c["size_bytes"] / 1e6 for c in cs], [c["kernels"][k]["best_gbs"] for c in cs],
                    marker="o", label=f"{pol} ({n} process{'es' if n > 1 else ''})")
        ax.set_xscale("log")
        ax.set_xlabel("array size (MB, one array over all processes)")
        ax.set_ylabel("aggregate GB/s (best repetition, median of runs)")
        ax.set_title(f"STREAM {k}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def elastic(doc: dict, path: Path) -> Path:
    plt = _plt()
    cases = doc["cases"]
    workloads = list(dict.fromkeys(c["workload"] for c in cases))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    for row, w in zip(axes, workloads):
        cs = [c for c in cases if c["workload"] == w]
        names = [c["config"] for c in cs]
        row[0].bar(names, [c["throughput_qps"] or 0 for c in cs], color="tab:blue")
        row[0].set_ylabel("queries / s")
        ax2 = row[0].twinx()
        ax2.plot(names, [c["cpu_s_per_query"] or 0 for c in cs], "o-", color="tab:red")
        ax2.set_ylabel("CPU s / query", color="tab:red")
        row[0].set_title(f"{w}: throughput (bars), CPU per query (line)", fontsize=9)
        for c in cs:
            tl = c["timeline"]
            row[1].step([x[0] for x in tl], [x[1] for x in tl], where="post", label=c["config"])
        row[1].set_xlabel("time since clients started (s)")
        row[1].set_ylabel("allocated cores")
        row[1].set_title(f"{w}: cores over time", fontsize=9)
        row[1].legend(fontsize=7)
    p = doc.get("params", {})
    fig.suptitle(f"elastic allocator, {p.get('clients')} clients, SF {p.get('sf')}", fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def tune(doc: dict, path: Path) -> Path | None:
    """Runtime per allocator x memory policy (bars: median, whiskers: min-max), like Fig. 6 of
    paper 003; one panel per placement/OS state. None when nothing was measured."""
    cases = [c for c in doc["cases"] if c["median_s"] is not None]
    if not cases:
        return None
    plt = _plt()
    panels: dict[str, list[dict]] = {}
    for c in cases:
        cfg = c["config"]
        os_part = ",".join(x for x in (f"thp={cfg['thp']}" if cfg["thp"] else "",
                                       f"autonuma={cfg['autonuma']}" if cfg["autonuma"] else "") if x)
        panels.setdefault(f"placement {cfg['placement']}" + (f", {os_part}" if os_part else ""), []).append(c)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), squeeze=False)
    target = doc.get("target") or (doc.get("params") or {}).get("target") or {}
    title = target.get("workload") or " ".join(target.get("command", []))[:60] or "command"
    for ax, (name, cs) in zip(axes[:, 0], panels.items()):
        allocs = list(dict.fromkeys(c["config"]["allocator"] for c in cs))
        mems = list(dict.fromkeys(c["label"].split("/")[1] for c in cs))
        width = 0.8 / max(1, len(mems))
        for j, m in enumerate(mems):
            xs, ys, lo, hi = [], [], [], []
            for i, a in enumerate(allocs):
                hit = [c for c in cs if c["config"]["allocator"] == a and c["label"].split("/")[1] == m]
                if hit:
                    c = hit[0]
                    xs.append(i + (j - (len(mems) - 1) / 2) * width)
                    ys.append(c["median_s"])
                    lo.append(c["median_s"] - c["min_s"])
                    hi.append(c["max_s"] - c["median_s"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=m)
        ax.set_xticks(range(len(allocs)))
        ax.set_xticklabels(allocs)
        ax.set_ylabel("runtime (s), median")
        ax.set_title(f"{title}: {name}", fontsize=10)
        ax.legend(title="memory policy", fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def ratios(path: Path, rows: list[dict], labels: list[str]) -> Path:
    """`tilewise report`: per metric, each later run's ratio to the first with its 95 % interval."""
    plt = _plt()
    k = len(labels) - 1
    n = len(rows)
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * n * max(1, k) + 1.2)))
    height = 0.8 / max(1, k)
    for j in range(k):
        ys, xs, lo, hi = [], [], [], []
        for i, r in enumerate(rows):
            v = r["vs_first"][j]
            if v is None:
                continue
            ys.append(i + (j - (k - 1) / 2) * height)
            xs.append(v["ratio"])
            ci = v.get("ci95") or [v["ratio"], v["ratio"]]
            lo.append(max(0.0, v["ratio"] - ci[0]))
            hi.append(max(0.0, ci[1] - v["ratio"]))
        ax.barh(ys, xs, height=height, xerr=[lo, hi], capsize=2, label=f"{labels[j + 1]} / {labels[0]}")
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"{r['name']} ({'higher' if r['better'] == 'higher' else 'lower'} is better)" for r in rows],
                       fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the first run (geometric means), 95 % CI")
    ax.set_title("tilewise report: run comparison", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, path)
