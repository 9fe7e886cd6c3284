"""Benchmark data sets: what an engine is handed to load (a Dataset), and the cache behind them.

A Dataset names one generated, validated set of Parquet tables: which benchmark produced it (its
registry name, e.g. ``tpch``), its scale factor, its directory, its tables and, for generators
that take one, its seed. Engines receive a Dataset and read ``tables``; they never import the
benchmark harness or the generators. The generators live in the benchmarks' own packages
(tilewise.benchmarks.<name>); tilewise.data.store is the cache they build into.

A Dataset may also carry a layout (tilewise.data.layouts): per table a ``TableSource`` (K Parquet
files, or raw CSV/TBL/JSON with its columns), and ``in_place``: the engines read the files where
they are, per query, instead of loading them (what makes a layout matter, and what cracking
switches from one copy to the next). ``table_sources()`` is every engine's view of the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tilewise.data.sources import TableSource

@dataclass(frozen=True)
class ForeignKey:
    table: str
    columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    # False: the benchmark's data do not always satisfy it (JCC-H's refresh sets): engines may index
    # its columns but declare no constraint
    holds: bool = True


@dataclass(frozen=True)
class Keys:
    """A schema's primary and foreign keys, as its benchmark defines them: what an engine that
    builds indexes or declares constraints (PostgreSQL) may build on, and nothing else."""

    primary: tuple[tuple[str, tuple[str, ...]], ...]  # (table, its key columns), in load order
    foreign: tuple[ForeignKey, ...] = ()

    def to_json(self) -> dict:
        return {"primary": {t: list(c) for t, c in self.primary},
                "foreign": [[f.table, list(f.columns), f.parent, list(f.parent_columns), f.holds]
                            for f in self.foreign]}


def fk(table: str, columns: str, parent: str, parent_columns: str) -> ForeignKey:
    """ForeignKey("lineitem", ("l_orderkey",), ...) from comma-separated column lists."""
    return ForeignKey(table, tuple(columns.split(",")), parent, tuple(parent_columns.split(",")))


def table_paths(d: str | Path, names: tuple[str, ...]) -> dict[str, Path]:
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
    table_names: tuple[str, ...] = ()  # its tables, in the benchmark's order (its spec says which)
    keys: Keys | None = None  # the benchmark's primary and foreign keys (None: it defines none)
    sources: tuple[TableSource, ...] = ()  # a layout's or raw tables' files; () = <dir>/<table>.parquet
    in_place: bool = False  # engines read the files per query (views over them) instead of loading them
    layout: str = ""  # the layout's name ("csv", "parquet-8"); "" = the generator's Parquet

    @property
    def tables(self) -> dict[str, Path]:
        """table -> the path naming it: its file, or the directory holding its files."""
        if self.sources:
            return {s.table: s.path for s in self.sources}
        return table_paths(self.dir, self.table_names)

    def table_sources(self) -> dict[str, TableSource]:
        """table -> where its rows are (what an engine reads): the layout's, or the one Parquet file."""
        if self.sources:
            return {s.table: s for s in self.sources}
        return {t: TableSource(t, "parquet", (str(p),)) for t, p in self.tables.items()}

    @property
    def label(self) -> str:
        seed = f", seed {self.seed}" if self.seed is not None else ""
        layout = f", layout {self.layout}" if self.layout else ""
        sf = f" SF {self.sf:g}" if self.sf else ""  # data of no benchmark has no scale factor
        return f"{self.title or self.benchmark.upper()}{sf}{seed}{layout}"

    def parquet_bytes(self) -> int:
        """Bytes of the tables' files on disk (their Parquet, or the layout's files whatever their format)."""
        if self.sources:
            return sum(s.bytes for s in self.sources)
        return sum(p.stat().st_size for p in self.tables.values() if p.exists())

    def with_sources(self, sources, *, layout: str, in_place: bool = True, dir: str | Path | None = None) -> Dataset:
        """The same data set laid out differently: the engines read these sources (in place by default);
        dir: where this layout's files live (engines keep their own metadata beside them)."""
        srcs = tuple(sources.values()) if isinstance(sources, dict) else tuple(sources)
        return replace(self, sources=srcs, layout=layout, in_place=in_place,
                       table_names=tuple(s.table for s in srcs), dir=Path(dir) if dir is not None else self.dir)

    def to_json(self) -> dict:
        d = {"benchmark": self.benchmark, "sf": self.sf, "dir": str(self.dir), "seed": self.seed}
        if self.layout:
            d["layout"] = self.layout
        if self.in_place:
            d["in_place"] = True
        return d

    @classmethod
    def at(cls, d: str | Path, *, benchmark: str = "data", sf: float = 0.0, seed: int | None = None,
           title: str = "", table_names: tuple[str, ...] | None = None) -> Dataset:
        """A Dataset for an existing directory of Parquet tables (tests, user-supplied data): the
        tables named, else every <table>.parquet in it; benchmark: whose data it is ("data": no
        benchmark's)."""
        if table_names is None:
            table_names = tuple(sorted(p.stem for p in Path(d).glob("*.parquet")))
        return cls(benchmark, float(sf), Path(d), seed, title, tuple(table_names))


# ---- a data set as a running deployment records it (the state file of `tilewise up`) ----------------

def record_of(dataset: Dataset | None) -> dict:
    """What a deployment's state records about the data set it serves: its tables' paths and, for a
    data set with a layout or raw tables, each table's source (what a later driver reads; cracking
    rewrites a table's source when it switches it)."""
    if dataset is None:
        return {}
    doc = {"label": dataset.label, **dataset.to_json(), "tables": {k: str(v) for k, v in dataset.tables.items()}}
    if dataset.sources or dataset.in_place:
        doc["sources"] = {t: s.to_json() for t, s in dataset.table_sources().items()}
    return doc


def sources_of(record: dict) -> dict[str, TableSource]:
    """table -> TableSource of a recorded data set (record_of): its sources, or its Parquet files."""
    if record.get("sources"):
        return {t: TableSource.from_json(s, t) for t, s in record["sources"].items()}
    return {t: TableSource.from_json(p, t) for t, p in (record.get("tables") or {}).items()}
