"""ClickHouse through chdb (in-process ClickHouse from PyPI): one bound server process per plan
instance, each holding its own copy of the data set in ClickHouse's Memory engine (replicas: a
query runs on one instance; engines/replicas.py routes it to the least busy one).

The runtime (runtime.ClickHouseServers) serves `bench tpch`, `bench tpcds` and `up/status/query/down`;
each server is server.py behind engines/serve.py. Settings come before rewrites: max_threads = the
instance's cores, max_server_memory_usage = its memory knob, join_use_nulls = 1 (SQL's outer-join
NULLs), and the others server.py lists with why. ClickHouse writes its Memory tables (INSERT and
ALTER ... DELETE), so the TPC-H refresh functions run on every replica; it has no multi-statement
transactions, so each server applies a function with its queries held back and undoes a function
that fails halfway (server.py). Where ClickHouse's SQL still differs from a benchmark's text,
dialect.py rewrites it (documented per query). A data set with a layout or raw tables (Parquet, CSV,
TBL, JSON lines) is read in place: a view per table over its files (files.py: text converted
strictly to the source's column types), which cracking replaces when a table's new copy is ready
(capabilities.reads, switch); no refresh functions then (files are not written). chdb is an
optional extra (about 0.9 GB installed): `pip install 'tilewise[clickhouse]'`, which `make setup`
does. docs/clickhouse.md has the details.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version

from tilewise.engines.clickhouse.dialect import dialect
from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines.memory import MemoryKnob
from tilewise.parts import Part

PART = Part("clickhouse", extra="clickhouse", group="engines", size="about 0.9 GB installed: chdb and chdb-core",
            what="ClickHouse in-process (chdb): one bound server per instance")
INSTALL_HINT = f"run `{PART.install_command()}` ({PART.size})"


def missing() -> str | None:
    if importlib.util.find_spec("chdb") is None:
        return f"the Python package chdb (in-process ClickHouse) is not installed: {INSTALL_HINT}"
    try:
        dist_version("chdb-core")
    except PackageNotFoundError:
        return f"the Python package chdb-core (ClickHouse itself, which chdb needs) is not installed: {INSTALL_HINT}"
    return None


def version() -> str:
    """'chdb 4.4.0 (chdb-core 26.9.0)': from the packages' metadata, without loading ClickHouse
    (each server reports the ClickHouse version it runs: `info`)."""
    return f"chdb {dist_version('chdb')} (chdb-core {dist_version('chdb-core')})"


SPEC = EngineSpec(
    name="clickhouse",
    title="ClickHouse",
    summary="one ClickHouse (chdb) server per instance, each with its own copy of the data (replicas)",
    runtime="tilewise.engines.clickhouse.runtime:ClickHouseServers",
    capabilities=Capabilities(replicas=True, refresh=True, join=False,
                              memory=MemoryKnob("ClickHouse's max_server_memory_usage", minimum_mb=256,
                                                fraction=0.8, cap_mb=1 << 30),
                              # ClickHouse links jemalloc: chdb aborts (free(): invalid pointer) under any
                              # preloaded allocator (measured with jemalloc, tcmalloc, mimalloc, tbbmalloc)
                              linked_allocator="jemalloc",
                              reads=("parquet", "csv", "tbl", "json"), switch=True,
                              integer_division="DIV"),  # its / divides integers as floating point
    missing=missing,
    version=version,
    part=PART,
    install_help=PART.size,
    dialect=dialect,  # dialect.py: its rewrites of benchmark queries
    endpoint_label="sockets in",
)
