"""Trino engine: a coordinator plus one bound worker per plan instance, over the data set's Parquet.

The cluster (engines/trino_cluster.py) starts the JVMs bound and verified; the data set is served by
the Hive connector through hard links, no copy (engines/trino_hive.py), with statistics gathered
once per data set. Queries go to the coordinator through the `trino` Python client; Trino's
workers cooperate on every query, so every QueryResult has instance=-1 (the whole cluster).
Concurrent streams are concurrent clients of the one coordinator.

Answers keep Trino's types: decimals stay Decimal (avg(decimal) and decimal division stay
decimal at Trino's scale), dates are datetime.date; bench/validate.py compares them with the
reference at the reference's scale.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from tilewise.binding import ensure_runnable
from tilewise.data import Dataset
from tilewise.engines import procgroup
from tilewise.engines import trino_install as ti
from tilewise.engines.base import Engine, InstanceStatus, QueryResult, instance_statuses
from tilewise.engines.trino_cluster import TrinoCluster, TrinoError, coordinator_memory_mb
from tilewise.engines.trino_hive import CATALOG, Warehouse
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan


def engine_version() -> str:
    return f"trino {ti.version()}"


class TrinoEngine(Engine):
    name = "trino"

    def __init__(self, *, worker_memory: str | None = None, coordinator_memory: str | None = None,
                 memory_fraction: float = procgroup.MEMORY_FRACTION, work_dir: str | Path | None = None,
                 query_timeout_s: float | None = None, keep_logs: bool = False) -> None:
        self.worker_memory_mb = procgroup.parse_size_mb(worker_memory) if worker_memory else None
        self.coordinator_mb = procgroup.parse_size_mb(coordinator_memory, "--coordinator-memory") \
            if coordinator_memory else None
        self.memory_fraction = memory_fraction
        self.work_dir = Path(work_dir) if work_dir else None
        self.query_timeout_s = query_timeout_s
        self.keep_logs = keep_logs
        self.cluster: TrinoCluster | None = None
        self.plan: Plan | None = None
        self.schema: str | None = None
        self.prepare_info: dict = {}
        self._root: Path | None = None
        self.start_s: float | None = None

    def start(self, plan: Plan, *, dataset: Dataset, allocator: str = "system") -> None:
        if self.cluster is not None:
            raise TilewiseError("this Trino engine is already started; stop() it first")
        ensure_runnable(plan)
        TrinoCluster.check_installed()
        missing = [str(p) for p in dataset.tables.values() if not p.exists()]
        if missing:
            raise TilewiseError(f"{dataset.label} data missing in {dataset.dir}: {', '.join(missing)}")
        from tilewise import topology

        mem = {n.id: n.memory_bytes for n in topology.load(None).numa_nodes}
        if self.worker_memory_mb:
            per_worker = {i.id: self.worker_memory_mb for i in plan.instances}
        else:
            per_worker = procgroup.worker_memory_mb(plan, mem, fraction=self.memory_fraction)
        if self.work_dir:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        self._root = Path(tempfile.mkdtemp(prefix="tilewise-trino-", dir=self.work_dir))
        self.plan = plan
        wh = Warehouse(dataset, fallback_dir=self._root)
        from tilewise.engines import trino_hive

        self.cluster = TrinoCluster(self._root, procgroup.new_token())
        t0 = time.monotonic()
        try:
            self.cluster.start(plan, memory_mb=per_worker, allocator=allocator,
                               coordinator_mb=self.coordinator_mb or coordinator_memory_mb(per_worker),
                               catalog=trino_hive.catalog_properties(wh.metastore))
            self.start_s = time.monotonic() - t0
            self.prepare_info = wh.prepare(lambda sql: self.cluster.query(sql), ti.version())
            self.schema = wh.schema
        except BaseException:
            self.stop()
            raise

    def run_query(self, sql: str, *, instance: int | None = None) -> QueryResult:
        if self.cluster is None:
            raise TilewiseError("the Trino engine is not started")
        if instance not in (None, -1):
            raise UsageError("Trino runs every query on the whole cluster", "leave the instance unset")
        cols, rows, elapsed = self.cluster.query(sql, catalog=CATALOG, schema=self.schema,
                                                 timeout_s=self.query_timeout_s)
        return QueryResult(cols, rows, elapsed, -1)

    def info(self, instance_id: int) -> dict:
        if self.cluster is None:
            return {}
        m = next((w for w in self.cluster.workers() if w.instance == instance_id), None)
        if m is None:
            return {}
        from tilewise.engines.trino_cluster import task_concurrency

        return {"threads": task_concurrency(m.cores), "heap_mb": m.memory_mb, "pid": m.pid,
                "node_id": m.extra.get("node_id")}

    def status(self) -> list[InstanceStatus]:
        if self.cluster is None or self.plan is None:
            return []
        coordinator = self.cluster.endpoint
        docs = {d["instance"]: d for d in self.cluster.statuses() if d["role"] == "worker"}
        return instance_statuses(self.plan, docs, lambda d: {"heap_mb": d["memory_mb"], "node_id": d["node_id"],
                                                             "coordinator": coordinator})

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of every JVM (MiB), keyed coordinator / worker-<i>."""
        import psutil

        out = {}
        for m in (self.cluster.members if self.cluster else []):
            try:
                out[m.role if m.instance is None else f"{m.role}-{m.instance}"] = \
                    round(psutil.Process(m.pid).memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        return out

    def stop(self) -> None:
        if self.cluster is not None:
            try:
                self.cluster.stop()
            finally:
                self.cluster = None
                if self._root is not None and not self.keep_logs:
                    shutil.rmtree(self._root, ignore_errors=True)
                self._root = None


__all__ = ["TrinoEngine", "TrinoError", "engine_version"]
