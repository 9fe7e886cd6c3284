"""`bench <benchmark> --layout NAME`: the benchmark's tables in a layout, read in place by the engine.

NAME is a layout name (tilewise.data.layouts): ``csv``/``tbl`` (the benchmark's tables as its
generator writes them as text, tilewise.benchmarks.spec.Data.raw), ``parquet`` (its own Parquet set,
read in place instead of loaded), or a Parquet layout (``parquet-8``, ``parquet-8-rg64k``,
``parquet-8-sorted-l_shipdate``, ``parquet-8+sorted-l_shipdate``). A Parquet layout is read from the
layout store (``--layout-dir``, default ``<the set's directory>/layouts``) where `data layout
--apply` recorded it, else made there from the benchmark's Parquet set (once; cached, checked).

Answers are still checked against the references computed on the benchmark's own Parquet set, so a
layout that changed a row fails validation. The refresh functions write tables, and tables read in
place are files: they do not run on a layout (the results say why).

A two-copy layout registers the sorted copy under its own name (data.predicates.sorted_name) and
each query that filters on the sort column is sent to it (data.predicates.route).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tilewise.data import Dataset, predicates, raw
from tilewise.data import layouts as L
from tilewise.errors import UsageError


def check(spec, name: str) -> None:
    """--layout's name, checked before any data is generated (prepare() makes the layout)."""
    if name in raw.WRITABLE or name == "parquet":
        return
    if L.parse(name).raw:
        raise UsageError(f"--layout {name}: {spec.title}'s tables come as Parquet or as "
                         f"{' or '.join(raw.WRITABLE)} text", "use parquet, csv, tbl or a parquet-K layout")


def files_per_table(name: str) -> int | None:
    """K for a parquet-K layout (each table as K files); None for the tables as they are."""
    if name in raw.WRITABLE or name == "parquet":
        return None
    lspec = L.parse(name)
    return None if lspec.raw else lspec.files


def prepare(spec, dataset: Dataset, name: str, *, data_dir=None, layout_dir=None, seed=None,
            log=None) -> tuple[Dataset, Callable[[str], str] | None, dict]:
    """(the data set the engine reads, a per-query SQL router or None, what results record)."""
    if name in raw.WRITABLE:
        ds = spec.data.raw(dataset.sf, name, data_dir, seed=seed, log=log)
        return ds, None, _info(name, ds.table_sources(), None, Path(ds.dir))
    if name == "parquet":
        ds = dataset.with_sources(dataset.table_sources(), layout="parquet")
        return ds, None, _info(name, ds.table_sources(), None, Path(dataset.dir))
    check(spec, name)
    lspec = L.parse(name)
    root = Path(layout_dir) if layout_dir else Path(dataset.dir) / "layouts"
    srcs = dataset.table_sources()
    applied = root / lspec.name / L.SET_MANIFEST
    if applied.is_file():
        made = L.load_set(applied)
        if log:
            log(f"layout {name}: the set recorded in {applied}")
    else:
        made = L.Store(root).realize(srcs, lspec, L.Hooks(log=log))
    sources = dict(made.sources())
    route = None
    if lspec.copies == 2:
        table = L.sort_table(lspec, srcs)
        alt = predicates.sorted_name(table, lspec.sort)
        sources[alt] = replace(made.alternates()[table], table=alt)
        columns = {t: set(s.names) for t, s in srcs.items()}

        def route(sql: str) -> str:
            return predicates.route(sql, table, lspec.sort, columns)
    d = root / lspec.name
    d.mkdir(parents=True, exist_ok=True)
    ds = dataset.with_sources(sources, layout=lspec.name, dir=d)
    return ds, route, _info(name, sources, made, d)


def _info(name: str, sources: dict, made, d: Path) -> dict:
    out = {"name": name, "dir": str(d), "tables": {}}
    for t, s in sources.items():
        groups = s.extra.get("row_groups")
        out["tables"][t] = {"format": s.format, "files": len(s.files), "row_groups": sum(groups) if groups else None,
                            "bytes": s.bytes, "sort": s.sort}
    if made is not None:
        out["made"] = made.cost()
    return out
