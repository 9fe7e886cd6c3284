"""Result documents (versioned JSON with the environment), CSV matrices and PNG plots."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from tilewise.environment import capture
from tilewise.fsutil import atomic_write, atomic_write_json, ensure_writable_dir, save_figure
from tilewise.errors import UsageError

FORMAT = "tilewise.probe/1"


def environment(t) -> dict:
    return capture(t)


def load(path: str | os.PathLike) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read probe result {path}: {e}") from None
    if doc.get("format") != FORMAT:
        raise UsageError(f"{path} is not a {FORMAT} document (format {doc.get('format')!r})")
    return doc


class OutDir:
    """An output folder checked before the first measurement; files are written atomically."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        if self.path is not None:
            ensure_writable_dir(self.path)
        self.written: list[str] = []

    def file(self, name: str) -> Path | None:
        return None if self.path is None else self.path / name

    def _done(self, p: Path) -> None:
        if str(p) not in self.written:
            self.written.append(str(p))

    def write_json(self, name: str, doc: dict) -> None:
        if (p := self.file(name)) is not None:
            self._done(atomic_write_json(p, doc))

    def write_matrix_csv(self, name: str, cpus, matrix, fmt: str = "{:.3f}") -> None:
        """First row and column are CPU numbers; empty cells are pairs that were not measured."""
        rows = [[a] + ["" if v is None else fmt.format(v) for v in row] for a, row in zip(cpus, matrix)]
        self.write_rows_csv(name, ["cpu"] + list(cpus), rows)

    def write_rows_csv(self, name: str, header, rows) -> None:
        if (p := self.file(name)) is None:
            return
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(header)
        w.writerows(rows)
        self._done(atomic_write(p, buf.getvalue()))

    def plot(self, name: str, draw) -> None:
        if (p := self.file(name)) is None:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self._done(save_figure(draw(plt), p, bbox_inches="tight"))


def heatmap(cpus, matrix, title: str, unit: str):
    """A drawing function for OutDir.plot: CPU x CPU heatmap, unmeasured pairs blank."""
    def draw(plt):
        import numpy as np

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
        return fig
    return draw
