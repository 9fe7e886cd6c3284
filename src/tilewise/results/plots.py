"""What the kinds' plots are made of (matplotlib, Agg): grouped bars with their 95 % confidence
intervals as error bars (as pyperf and hyperfine users expect), CPU x CPU heatmaps, and the run
comparison of `tilewise report`. Every figure is written atomically (fsutil.save_figure)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tilewise import fsutil


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, **savefig) -> Path:
    """Write the figure atomically (and free it)."""
    return fsutil.save_figure(fig, Path(path), **({"bbox_inches": "tight"} | savefig))


def bar_chart(path: Path, categories: list[str], series: dict[str, list[float | None]], *,
              ylabel: str, title: str, reference_line: float | None = 1.0,
              intervals: dict[str, list[Sequence[float] | None]] | None = None) -> Path:
    """Grouped bars: one group per category, one bar per series (None -> no bar). `intervals`
    gives a series' 95 % confidence intervals [low, high] per category, drawn as error bars
    exactly where they lie (None -> no whisker: one run has no interval)."""
    plt = pyplot()
    n = max(1, len(series))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(categories) * max(1, n) ** 0.5 + 2), 3.6))
    for k, (label, vals) in enumerate(series.items()):
        pts = [(i + (k - (n - 1) / 2) * width, v) for i, v in enumerate(vals) if v is not None]
        bars = ax.bar([x for x, _ in pts], [v for _, v in pts], width=width, label=label)
        cis = (intervals or {}).get(label)
        if cis:
            whiskers(ax, [i + (k - (n - 1) / 2) * width for i in range(len(vals))], cis,
                     color=darker(bars.patches[0].get_facecolor()) if bars.patches else "black")
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, rotation=0 if len(categories) <= 8 else 60, fontsize=8)
    if reference_line is not None:
        ax.axhline(reference_line, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if n > 1:  # beside the axes: never over a bar or a whisker
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return save(fig, path)


def whiskers(ax, xs: Sequence[float], intervals: Sequence[Sequence[float] | None], *, color="black",
             horizontal: bool = False) -> None:
    """Error bars spanning exactly [low, high] at each x (None: none there)."""
    pts = [(x, ci) for x, ci in zip(xs, intervals) if ci]
    if not pts:
        return
    mid = [(ci[0] + ci[1]) / 2 for _, ci in pts]
    half = [(ci[1] - ci[0]) / 2 for _, ci in pts]
    at = [x for x, _ in pts]
    if horizontal:
        ax.errorbar(mid, at, xerr=half, fmt="none", ecolor=color, elinewidth=1, capsize=3, zorder=3)
    else:
        ax.errorbar(at, mid, yerr=half, fmt="none", ecolor=color, elinewidth=1, capsize=3, zorder=3)


def darker(rgba) -> tuple:
    r, g, b, *_ = rgba
    return (r * 0.45, g * 0.45, b * 0.45)


def heatmap(path: Path, cpus, matrix, title: str, unit: str) -> Path:
    """CPU x CPU heatmap, unmeasured pairs blank."""
    import numpy as np

    plt = pyplot()
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


def ratios(path: Path, names: list[str], series: dict[str, list[tuple[float, Sequence[float] | None] | None]]) -> Path:
    """`tilewise report`: per metric (one row each), each later run's ratio to the first (one
    series each: (ratio, its 95 % interval) or None) as horizontal bars with error bars."""
    plt = pyplot()
    k = max(1, len(series))
    n = len(names)
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * n * k + 1.2)))
    height = 0.8 / k
    for j, (label, vals) in enumerate(series.items()):
        at = [(i + (j - (k - 1) / 2) * height, v) for i, v in enumerate(vals) if v is not None]
        bars = ax.barh([y for y, _ in at], [v[0] for _, v in at], height=height, label=label)
        whiskers(ax, [y for y, _ in at], [v[1] for _, v in at], horizontal=True,
                 color=darker(bars.patches[0].get_facecolor()) if bars.patches else "black")
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(n))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the first run (geometric means), 95 % CI")
    ax.set_title("tilewise report: run comparison", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, path)
