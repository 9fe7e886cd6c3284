"""Benchmark data sets: what an engine is handed to load (a Dataset), and the generators behind it.

A Dataset names one generated, validated set of the 8 TPC-H-schema tables as Parquet: which
benchmark produced it (``tpch``; ``jcch`` for the skewed variant), its scale factor, its directory
and, for generators that take one, its seed. Engines receive a Dataset and read ``tables``; they
never import the benchmark harness or the generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def table_paths(d: str | Path) -> dict[str, Path]:
    """table -> <d>/<table>.parquet, in TABLES order."""
    d = Path(d)
    return {t: d / f"{t}.parquet" for t in TABLES}


@dataclass(frozen=True)
class Dataset:
    benchmark: str  # "tpch" | "jcch"
    sf: float
    dir: Path
    seed: int | None = None

    @property
    def tables(self) -> dict[str, Path]:
        return table_paths(self.dir)

    @property
    def label(self) -> str:
        seed = f", seed {self.seed}" if self.seed is not None else ""
        name = {"tpch": "TPC-H", "jcch": "JCC-H"}.get(self.benchmark, self.benchmark.upper())
        return f"{name} SF {self.sf:g}{seed}"

    def parquet_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.tables.values() if p.exists())

    def to_json(self) -> dict:
        return {"benchmark": self.benchmark, "sf": self.sf, "dir": str(self.dir), "seed": self.seed}

    @classmethod
    def at(cls, d: str | Path, *, benchmark: str = "tpch", sf: float = 0.0, seed: int | None = None) -> Dataset:
        """A Dataset for an existing directory of Parquet tables (tests, user-supplied data)."""
        return cls(benchmark, float(sf), Path(d), seed)


BENCHMARKS = ("tpch", "jcch")


def dataset_for(benchmark: str, sf, data_dir: str | Path | None = None, *, seed: int | None = None, log=None,
                progress=None) -> Dataset:
    """The data set of a benchmark, generated and cached first if needed: TPC-H (tpchgen-cli) or
    JCC-H for a seed (default 0). progress(task, done, total) reports a generation."""
    from tilewise.errors import UsageError

    if benchmark == "tpch":
        if seed is not None:
            raise UsageError("a data seed applies to JCC-H only", "drop --seed/--data-seed for TPC-H")
        from tilewise.data import tpch

        return tpch.dataset(sf, data_dir, log=log, progress=progress)
    if benchmark == "jcch":
        from tilewise.data import jcch

        return jcch.dataset(sf, data_dir, seed=jcch.DEFAULT_SEED if seed is None else seed, log=log, progress=progress)
    raise UsageError(f"unknown benchmark {benchmark!r}", "use tpch or jcch")
