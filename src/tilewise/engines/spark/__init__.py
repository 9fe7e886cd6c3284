"""Spark SQL: a standalone master, one bound worker per plan instance (its executor inherits the
binding), and a driver process that runs the SQL; the workers cooperate on every query.

The runtime (runtime.SparkCluster) serves `bench tpch` (a driver for the whole run) and
`up/join/status/query/down` (the cluster stays free for users' own applications: `tilewise query`
starts a driver for its query and stops it after). Workers on other hosts join with `tilewise
join`. Spark does not write tilewise's tables: no refresh functions. Its memory knob is the worker
JVM's memory (--worker-memory; default half of its node's memory, at most 31 GiB). Where Spark's
SQL differs from a benchmark's text, dialect.py rewrites it (documented per query). It reads a layout
or raw tables in place (Parquet files, CSV, TBL, JSON as temporary views; a view is registered again
when cracking switches its table), and reports per executor, so per tile, the tasks it ran and the
bytes they read (scan_stats).
"""

from __future__ import annotations

from importlib.metadata import version as dist_version

from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines import splits
from tilewise.engines.memory import MemoryKnob
from tilewise.engines.spark.dialect import dialect
from tilewise.engines.spark.home import PART, install_step, spark_home
from tilewise.errors import TilewiseError


def missing() -> str | None:
    try:
        spark_home()
    except TilewiseError as e:
        return str(e)
    return None


def version() -> str:
    return f"pyspark {dist_version('pyspark')}"


SPEC = EngineSpec(
    name="spark",
    title="Spark",
    summary="a Spark standalone master + one bound worker per instance (they cooperate on every query)",
    runtime="tilewise.engines.spark.runtime:SparkCluster",
    capabilities=Capabilities(replicas=False, refresh=False, join=True, memory=MemoryKnob("worker JVM memory"),
                              reads=("parquet", "csv", "tbl", "json"), switch=True,
                              integer_division="div"),  # its / divides integers as floating point
    missing=missing,
    version=version,
    part=PART,
    install=install_step,
    install_help=PART.size,
    dialect=dialect,  # dialect.py: its rewrites of benchmark queries (TPC-DS)
    endpoint_label="master",
    # FilePartition: maxSplitBytes = min(maxPartitionBytes 128 MB, max(openCostInBytes 4 MB, bytes / cores)),
    # splits packed into partitions, a row group read by the split holding its midpoint
    scan_split=splits.ByteRanges(128 * splits.MB, 4 * splits.MB, per_core=True, pack=True, row_group_at="midpoint"),
)
