"""Spark SQL engine: a standalone master, one bound worker per plan instance, a driver process.

Each worker is started bound to its instance (CPUs, memory policy, allocator) and offers exactly
the instance's cores and a share of its NUMA node's memory; the executor it forks inherits the
binding. The driver asks for one executor per worker holding all of that worker's cores
(spark.executor.cores unset), sizes spark.sql.shuffle.partitions and spark.default.parallelism to
the total core count, registers the TPC-H Parquet files as temporary views and runs queries as
Spark SQL, partitioned across the workers (instance=-1 in every QueryResult).

Everything binds to loopback with free ports; the UIs are off (master/worker UIs on a random
loopback port). stop() leaves no java process behind (procgroup.ProcessCluster.stop).
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from tilewise.binding import Binding, ensure_runnable
from tilewise.engines import spark_cluster as sc
from tilewise.engines.base import Engine, InstanceStatus, QueryResult, instance_statuses
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

from tilewise.data import TABLES, Dataset


def find_tables(data_dir: Path, names: tuple[str, ...] = TABLES) -> dict[str, str]:
    """table -> Parquet path (<dir>/<t>.parquet file or directory, or <dir>/<t>/), for the tables
    `names` (the data set's: TPC-H's eight unless its benchmark names others)."""
    out = {}
    for t in names:
        for cand in (data_dir / f"{t}.parquet", data_dir / t):
            if cand.exists():
                out[t] = str(cand.resolve())
                break
        else:
            raise UsageError(f"no Parquet data for table {t} in {data_dir}",
                             "generate it with tilewise bench tpch --sf X (or tpchgen-cli --format parquet)")
    return out


def engine_version() -> str:
    from importlib.metadata import version

    return f"pyspark {version('pyspark')}"


def spark_schema(path: str) -> str | None:
    """The Parquet file's schema as a Spark DDL string (skips Spark's schema-inference jobs);
    None when a type has no plain mapping (Spark then infers it)."""
    from tilewise.engines.sqltypes import parquet_schema

    p = Path(path)
    try:
        if p.is_dir():
            files = sorted(p.rglob("*.parquet"))
            if not files:
                return None
            p = files[0]
        cols = parquet_schema(p, "spark")
    except Exception:
        return None
    if any(t is None for _, t in cols):
        return None
    return ", ".join(f"`{c}` {t}" for c, t in cols)


class SparkEngine(Engine):
    name = "spark"

    def __init__(self, *, worker_memory: str | None = None, memory_fraction: float = sc.MEMORY_FRACTION,
                 driver_memory: str = "2g", conf: dict | None = None, work_dir: str | Path | None = None,
                 query_timeout_s: float | None = None, keep_logs: bool = False) -> None:
        self.worker_memory_mb = sc.parse_size_mb(worker_memory) if worker_memory else None
        self.memory_fraction = memory_fraction
        self.driver_memory = driver_memory
        self.extra_conf = dict(conf or {})
        self.work_dir = Path(work_dir) if work_dir else None
        self.query_timeout_s = query_timeout_s
        self.keep_logs = keep_logs
        self.cluster: sc.SparkCluster | None = None
        self.driver: sc.Member | None = None
        self._conn: Connection | None = None
        self._root: Path | None = None
        self._own_root = False
        self.plan: Plan | None = None
        self.driver_info: dict = {}
        self._query_lock = threading.Lock()  # one driver channel: concurrent streams take turns

    # ---- start ----------------------------------------------------------------------------
    def start(self, plan: Plan, *, dataset: Dataset, allocator: str = "system") -> None:
        if self.cluster is not None:
            raise TilewiseError("this Spark engine is already started; stop() it first")
        ensure_runnable(plan)
        sc.spark_home()
        tables = {t: {"path": p, "schema": spark_schema(p)} for t, p in find_tables(Path(dataset.dir), dataset.table_names).items()}
        from tilewise import topology

        live = topology.load(None)
        mem = {n.id: n.memory_bytes for n in live.numa_nodes}
        if self.worker_memory_mb:
            per_worker = {i.id: self.worker_memory_mb for i in plan.instances}
        else:
            per_worker = sc.worker_memory_mb(plan, mem, fraction=self.memory_fraction)
        self.plan = plan
        if self.work_dir:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            self._root = Path(tempfile.mkdtemp(prefix="spark-", dir=self.work_dir))
        else:
            self._root = Path(tempfile.mkdtemp(prefix="tilewise-spark-"))
        self._own_root = True
        self.cluster = sc.SparkCluster(self._root, sc.new_token())
        try:
            # JVMs start in parallel: master, workers (they retry until the master listens), driver
            self.cluster.start_master(wait=False)
            for inst in plan.instances:
                self.cluster.start_worker(inst, per_worker[inst.id], allocator=allocator)
            cores = sum(len(i.cpus) for i in plan.instances)
            conf = {
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.driver.host": self.cluster.host,
                "spark.driver.bindAddress": self.cluster.host,
                "spark.driver.memory": self.driver_memory,
                "spark.executor.memory": f"{min(per_worker.values())}m",
                "spark.cores.max": str(cores),
                "spark.sql.shuffle.partitions": str(cores),
                "spark.default.parallelism": str(cores),
                "spark.sql.session.timeZone": "UTC",
            }
            conf.update(self.extra_conf)
            self._start_driver({"master": self.cluster.master_url, "conf": conf, "tables": tables,
                                "executors": len(plan.instances), "app": f"tilewise-{plan.policy}"})
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _start_driver(self, cfg: dict) -> None:
        parent, child = socket.socketpair()
        try:
            argv = [sys.executable, "-m", "tilewise.engines.spark_driver", str(child.fileno())]
            self.driver = self.cluster._spawn("driver", None, argv, Binding(None), pass_fds=(child.fileno(),))
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._conn.send(("init", cfg))

    def _wait_ready(self) -> None:
        self.cluster.wait_master()
        self.cluster.wait_workers()
        kind, *rest = self._wait_reply(timeout=sc.START_TIMEOUT_S + 60, what="start the Spark driver")
        if kind != "ready":
            raise sc.SparkError(f"spark driver failed to start: {rest[0]}", f"log: {self.driver.log}")
        self.driver_info = rest[0]

    def _wait_reply(self, timeout: float | None, what: str, conn: Connection | None = None):
        conn = conn or self._conn
        cluster, driver = self.cluster, self.driver
        if conn is None or cluster is None or driver is None:
            raise TilewiseError("the Spark engine was stopped")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if conn.poll(0.25):
                    return conn.recv()
            except (EOFError, OSError):
                ok, why = driver.alive()
                raise sc.SparkError(f"spark driver (pid {driver.pid}) {why or 'closed its channel'} "
                                    f"while trying to {what}: {sc.log_tail(driver.log)}")
            bad = cluster.dead()
            if bad:
                m, why = bad[0]
                name = m.role if m.instance is None else f"{m.role} {m.instance}"
                raise sc.SparkError(f"spark {name} (pid {m.pid}) {why} while trying to {what}; "
                                    "the cluster is unhealthy, results would not be valid",
                                    f"log: {m.log}")
            if deadline is not None and time.monotonic() > deadline:
                raise sc.SparkError(f"spark did not {what} within {timeout:.0f} s", f"driver log: {driver.log}")

    # ---- queries --------------------------------------------------------------------------
    def run_query(self, sql: str, *, instance: int | None = None) -> QueryResult:
        if self._conn is None:
            raise TilewiseError("the Spark engine is not started")
        if instance not in (None, -1):
            raise UsageError("Spark runs every query on the whole cluster", "leave the instance unset")
        with self._query_lock:
            conn = self._conn
            if conn is None:
                raise TilewiseError("the Spark engine was stopped")
            try:
                conn.send(("sql", sql))
            except OSError as e:
                raise TilewiseError(f"the Spark driver is gone ({e})") from None
            reply = self._wait_reply(self.query_timeout_s, "run a query", conn)
        if reply[0] == "error":
            raise TilewiseError(f"spark query failed: {reply[1]}")
        _, cols, rows, elapsed = reply
        return QueryResult(list(cols), list(rows), float(elapsed), -1)

    def info(self, instance_id: int) -> dict:
        """What the harness records per instance: the worker's cores (= its executor's task slots)."""
        if self.cluster is None:
            return {}
        m = next((w for w in self.cluster.workers() if w.instance == instance_id), None)
        return {"threads": m.cores, "memory_mb": m.memory_mb, "pid": m.pid} if m else {}

    # ---- status ---------------------------------------------------------------------------
    def status(self) -> list[InstanceStatus]:
        if self.cluster is None or self.plan is None:
            return []
        url = self.cluster.master_url
        docs = {d["instance"]: d for d in self.cluster.statuses() if d["role"] == "worker"}
        return instance_statuses(self.plan, docs, lambda d: {"executors": d["executors"], "memory_mb": d["memory_mb"],
                                                             "master_url": url})

    # ---- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            # give the driver a moment to stop its SparkContext cleanly
            if self.driver is not None and self.driver.proc is not None:
                try:
                    self.driver.proc.wait(timeout=5)
                except Exception:
                    pass
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None
        if self.cluster is not None:
            try:
                self.cluster.stop()
            finally:
                self.cluster = None
                self.driver = None
                if self._root is not None and self._own_root and not self.keep_logs:
                    shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
