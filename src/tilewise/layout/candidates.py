"""The layouts worth measuring for a data set, a workload and a deployment plan (pure).

The rules, each from the thesis's findings (004, ch. 5) or from how the engines scan:

- **as is**: the raw files through the engine's reader (the baseline every figure is compared with);
- **parquet-1**: transcoding alone, one file per table;
- **parquet-K**: K a multiple of the plan's tiles (every tile gets the same number of files of each
  table) and the smallest such K that keeps the largest table's files under the size bound (the
  thesis: "Parquet files should always be less than 200 MB"), plus twice that K while its files stay
  above the lower bound (more files, more scan tasks, until they are too small to pay their open cost);
- **row groups**: when the largest table's files would hold fewer row groups of the writer's default
  size than a tile has threads, row groups small enough to give each of the tile's threads one;
- **sorted**: the largest table with a filtered column sorted on the column most statements filter
  on (found from the predicates, workload.sort_candidates), as one copy and as a second copy beside
  the original (each query reads the copy its predicates favour).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilewise.data.layouts import MIN_ROW_GROUP, LayoutSpec

WRITER_ROW_GROUP = 122880  # DuckDB's Parquet writer's default rows per row group
TEXT_TO_PARQUET = 0.35  # Parquet bytes per byte of CSV/TBL (TPC-H, tpchgen-cli: SF 1 CSV 1.1 GB, Parquet 0.36 GB)


@dataclass(frozen=True)
class Bounds:
    max_file_bytes: float = 200e6  # the thesis's bound
    min_file_bytes: float = 8e6  # below this a file's open and footer cost dominates its scan


@dataclass(frozen=True)
class Candidate:
    spec: LayoutSpec
    why: str

    @property
    def name(self) -> str:
        return self.spec.name


def parquet_bytes(source_format: str, nbytes: int) -> float:
    """A table's estimated Parquet size from its source's bytes."""
    return nbytes * (1.0 if source_format == "parquet" else TEXT_TO_PARQUET)


def files_for(largest_bytes: float, tiles: int, bounds: Bounds) -> int:
    """The smallest multiple of tiles whose files of the largest table stay under the size bound."""
    tiles = max(1, tiles)
    return tiles * max(1, math.ceil(largest_bytes / (bounds.max_file_bytes * tiles)))


def row_group_rows(rows_per_file: int | None, threads: int) -> int | None:
    """Rows per row group giving each of a tile's threads a row group of one file, when the writer's
    default gives fewer row groups than threads; None otherwise (or rows unknown)."""
    if not rows_per_file or threads < 2 or rows_per_file / WRITER_ROW_GROUP >= threads:
        return None
    want = rows_per_file // threads
    if want < MIN_ROW_GROUP:
        return None
    return 1 << int(math.log2(want))  # a power of two, at most rows/threads


def candidates(source_format: str, table_bytes: dict[str, int], *, tiles: int, threads: int,
               sort: dict | None = None, rows: dict[str, int | None] | None = None,
               bounds: Bounds = Bounds()) -> list[Candidate]:
    """The layouts to measure, in order: as is, parquet-1, parquet-K..., row groups, sorted, two copies."""
    out = [Candidate(LayoutSpec(format=source_format, files=0), "the data as it is, read by the engine's reader: "
                     "the baseline"),
           Candidate(LayoutSpec("parquet", 1), "transcoding alone: one Parquet file per table")]
    if not table_bytes:
        return out
    largest = max(table_bytes, key=lambda t: table_bytes[t])
    est = parquet_bytes(source_format, table_bytes[largest])
    k = files_for(est, tiles, bounds)
    ks = [k]
    if est / (2 * k) >= bounds.min_file_bytes:
        ks.append(2 * k)
    for kk in ks:
        if kk == 1:
            continue
        out.append(Candidate(LayoutSpec("parquet", kk),
                             f"{kk} files per table: a multiple of the plan's {tiles} tile(s), {largest}'s files about "
                             f"{est / kk / 1e6:.0f} MB (bound {bounds.max_file_bytes / 1e6:.0f} MB)"))
    per_file = (rows or {}).get(largest)
    rg = row_group_rows(per_file // k if per_file else None, threads)
    if rg:
        out.append(Candidate(LayoutSpec("parquet", k, rg),
                             f"row groups of {rg} rows: {largest}'s files hold about {per_file // k} rows, fewer "
                             f"than {threads} row groups of the writer's default {WRITER_ROW_GROUP} for a tile's "
                             f"{threads} threads"))
    if sort:
        col = sort["column"]
        out.append(Candidate(LayoutSpec("parquet", k, None, col, 1),
                             f"{sort['table']} sorted on {col}: {sort['reason']}"))
        out.append(Candidate(LayoutSpec("parquet", k, None, col, 2),
                             f"{sort['table']} twice, as is and sorted on {col}: queries filtering on {col} read the "
                             "sorted copy, the others the original"))
    seen, uniq = set(), []
    for c in out:
        if c.name not in seen:
            seen.add(c.name)
            uniq.append(c)
    return uniq
