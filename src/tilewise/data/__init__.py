"""Benchmark data sets: what an engine is handed to load (a Dataset), and the cache behind them.

A Dataset names one generated, validated set of Parquet tables: which benchmark produced it (its
registry name, e.g. ``tpch``), its scale factor, its directory, its tables and, for generators
that take one, its seed. Engines receive a Dataset and read ``tables``; they never import the
benchmark harness or the generators. The generators live in the benchmarks' own packages
(tilewise.benchmarks.<name>); tilewise.data.store is the cache they build into.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The TPC-H schema's tables (TPC-H and JCC-H): a Dataset's tables unless its benchmark names others.
TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def table_paths(d: str | Path, names: tuple[str, ...] = TABLES) -> dict[str, Path]:
    """table -> <d>/<table>.parquet, in the order of names."""
    d = Path(d)
    return {t: d / f"{t}.parquet" for t in names}


@dataclass(frozen=True)
class Dataset:
    benchmark: str  # the benchmark's registry name, e.g. "tpch"
    sf: float
    dir: Path
    seed: int | None = None
    title: str = ""  # what messages call the benchmark, e.g. "TPC-H" ("": its name upper-cased)
    table_names: tuple[str, ...] = TABLES

    @property
    def tables(self) -> dict[str, Path]:
        return table_paths(self.dir, self.table_names)

    @property
    def label(self) -> str:
        seed = f", seed {self.seed}" if self.seed is not None else ""
        return f"{self.title or self.benchmark.upper()} SF {self.sf:g}{seed}"

    def parquet_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.tables.values() if p.exists())

    def to_json(self) -> dict:
        return {"benchmark": self.benchmark, "sf": self.sf, "dir": str(self.dir), "seed": self.seed}

    @classmethod
    def at(cls, d: str | Path, *, benchmark: str = "tpch", sf: float = 0.0, seed: int | None = None,
           title: str = "", table_names: tuple[str, ...] = TABLES) -> Dataset:
        """A Dataset for an existing directory of Parquet tables (tests, user-supplied data)."""
        return cls(benchmark, float(sf), Path(d), seed, title, tuple(table_names))
