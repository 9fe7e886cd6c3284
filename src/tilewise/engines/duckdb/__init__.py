"""DuckDB: one bound server process per plan instance, each holding its own copy of the data set
(replicas: a query runs on one instance; engines/replicas.py routes it to the least busy one).

The runtime (runtime.DuckDBServers) serves `bench tpch`, `bench overhead`, `bench elastic` and
`up/status/query/down`; each server is server.py behind engines/serve.py. A data set with a layout or
raw tables (Parquet files, CSV, TBL, JSON) is read in place: a view per table over its files, which
cracking replaces when a table's new copy is ready (capabilities.reads, switch). DuckDB writes its
tables, so the TPC-H refresh functions run on every replica. Its memory knob is DuckDB's
memory_limit per server (default: 80 % of its node's memory, split between the instances there).
Where DuckDB's SQL differs from a benchmark's text, dialect.py rewrites it (documented per query).
"""

from __future__ import annotations

import importlib.util

from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines.duckdb.dialect import dialect
from tilewise.engines.memory import MemoryKnob


def missing() -> str | None:
    return None if importlib.util.find_spec("duckdb") else "the Python package duckdb is not installed (pip install duckdb)"


def version() -> str:
    import duckdb

    return duckdb.__version__


SPEC = EngineSpec(
    name="duckdb",
    title="DuckDB",
    summary="one DuckDB server per instance, each with its own copy of the data (replicas)",
    runtime="tilewise.engines.duckdb.runtime:DuckDBServers",
    capabilities=Capabilities(replicas=True, refresh=True, join=False,
                              memory=MemoryKnob("DuckDB's memory_limit", minimum_mb=256, fraction=0.8, cap_mb=1 << 30),
                              reads=("parquet", "csv", "tbl", "json"), switch=True,
                              integer_division="//"),  # its / divides integers as floating point
    missing=missing,
    version=version,
    dialect=dialect,  # dialect.py: its rewrites of benchmark queries (TPC-DS)
    endpoint_label="sockets in",
)
