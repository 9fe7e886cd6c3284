"""Spark's runtime: a standalone master, one bound worker per plan instance, and a driver for queries.

Each worker is started bound to its instance (CPUs, memory policy, allocator) and offers exactly
the instance's cores and its memory knob's size; the executor it forks inherits the binding. The
driver (driver.py, its own process) asks for one executor per worker holding all of that worker's
cores (spark.executor.cores unset), sizes spark.sql.shuffle.partitions and spark.default.parallelism
to the total core count, registers the data set's Parquet files as temporary views and runs queries
as Spark SQL, partitioned across the workers (instance=-1 in every QueryResult).

A benchmark's runtime starts its driver with the cluster and keeps it for the run. A detached
cluster (`tilewise up`) has no driver of tilewise's: a driver holds its executors -- all the
cluster's cores -- for as long as it lives, and users submit their own applications; `tilewise
query` starts a driver for its query and stops it after (close()).

Every process started here (master, workers, the executors the workers fork, the driver) carries
``TILEWISE_CLUSTER_TOKEN=<token>`` in its environment (executors inherit the worker's environment).
Stopping (procgroup.ProcessCluster.stop, through procs.stop) reaches every member's tree and every
live process carrying the token, so nothing is orphaned even when a worker crashed and left its
executor behind, or when the process that started the cluster is long gone. Everything binds to the
cluster's host (loopback by default) with free ports; the UIs are off.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from tilewise import nic, procs, verification
from tilewise.binding import Binding
from tilewise.data import sources_of
from tilewise.data.sources import TableSource, arrow_type
from tilewise.engines import sqltypes
from tilewise.engines.contract import QueryResult
from tilewise.engines.procgroup import START_TIMEOUT_S, Member, ProcessCluster, free_port, log_tail
from tilewise.engines.spark import SPEC
from tilewise.engines.spark.home import SparkError, spark_home
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
DRIVER_MEMORY = "2g"

_MASTER_URL_RE = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED_RE = re.compile(r"Successfully registered with master (spark://\S+)")

TYPES = sqltypes.TypeNames({
    "int64": "BIGINT", "int32": "INT", "int16": "SMALLINT", "int8": "TINYINT", "double": "DOUBLE", "float": "FLOAT",
    "bool": "BOOLEAN", "date32[day]": "DATE", "string": "STRING", "large_string": "STRING", "string_view": "STRING",
}, "DECIMAL")


def find_tables(dataset) -> dict[str, str]:
    """table -> Parquet path of the data set (a file, or a directory of files)."""
    out = {}
    for t, p in dataset.tables.items():
        p = Path(p)
        for cand in (p, p.with_suffix("")):
            if cand.exists():
                out[t] = str(cand.resolve())
                break
        else:
            raise UsageError(f"no Parquet data for table {t} in {Path(dataset.dir)}",
                             "generate it with tilewise bench tpch --sf X (or tpchgen-cli --format parquet)")
    return out


def spark_schema(path: str) -> str | None:
    """The Parquet file's schema as a Spark DDL string (skips Spark's schema-inference jobs);
    None when a type has no plain mapping (Spark then infers it)."""
    p = Path(path)
    try:
        if p.is_dir():
            files = sorted(p.rglob("*.parquet"))
            if not files:
                return None
            p = files[0]
        cols = sqltypes.parquet_schema(p, TYPES)
    except Exception:
        return None
    if any(t is None for _, t in cols):
        return None
    return ", ".join(f"`{c}` {t}" for c, t in cols)


def table_config(src: TableSource) -> dict:
    """What the driver registers for a table source: its files, format and (text) columns as DDL."""
    if src.format == "parquet":
        return {"format": "parquet", "files": list(src.files), "schema": spark_schema(src.files[0])}
    ddl = ", ".join(f"`{c}` {sqltypes.sql_type(arrow_type(t), TYPES)}" for c, t in src.column_types())
    return {"format": src.format, "files": list(src.files), "schema": ddl, "delimiter": src.delimiter,
            "header": src.header, "trailing": src.trailing}


def _listening(pid: int) -> list[int]:
    import psutil

    try:
        return [c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def executors_of(pid: int) -> list[int]:
    """Executor JVMs forked by a worker (its descendants running CoarseGrainedExecutorBackend)."""
    return [k for k in sorted(procs.descendants([pid], procs.scan()))
            if any(EXECUTOR_CLASS in a for a in procs.cmdline(k))]


class SparkCluster(ProcessCluster):
    """Start/inspect/stop a master and bound workers, and drive a driver for queries."""

    spec = SPEC
    error_cls = SparkError

    def __init__(self, *args, master_url: str | None = None, conf: dict | None = None,
                 driver_memory: str = DRIVER_MEMORY, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if master_url:
            self.endpoint = master_url
        self.extra_conf = dict(conf or {})
        self.driver_memory = driver_memory
        self.driver: Member | None = None
        self.driver_info: dict = {}
        self._conn: Connection | None = None
        self._query_lock = threading.Lock()  # one driver channel: concurrent streams take turns

    @property
    def master_url(self) -> str | None:
        return self.endpoint

    @master_url.setter
    def master_url(self, url: str | None) -> None:
        self.endpoint = url

    @classmethod
    def join_address(cls, text: str) -> str:
        """HOST:PORT (or spark://HOST:PORT) -> the master URL workers register with."""
        m = re.fullmatch(r"(?:spark://)?([^:/]+):(\d+)", text or "")
        if not m:
            raise UsageError(f"{text!r} is not a Spark master address", "use spark://HOST:PORT or HOST:PORT")
        return f"spark://{m.group(1)}:{m.group(2)}"

    # -- environment --
    def env(self) -> dict:
        home = spark_home()
        env = super().env()
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
        })
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _spawn(self, role, instance, argv, b, **kwargs) -> Member:
        (self.root / "local").mkdir(parents=True, exist_ok=True)
        return super()._spawn(role, instance, argv, b, **kwargs)

    # -- start --
    def start(self, plan, *, dataset=None, allocator: str = "system", memory_mb=None, coordinator_mb=None,
              join=None, log=None) -> None:
        """Master (placed by the plan) and workers, started in parallel (workers retry until the master
        listens); a benchmark's runtime also starts its driver meanwhile. Waits until all are ready."""
        spark_home()
        try:
            tables = self._tables(dataset) if dataset is not None else None
            memory_mb = self._begin(plan, dataset, memory_mb, join)
            if not join:
                self.placement = nic.place_coordinator(plan, *nic.detect(self.host))
                inst = self.placement.coordinator
                self.start_master(wait=False, binding=Binding.from_instance(inst, allocator) if inst else None)
                if log:
                    log(f"master starting at {self.master_url}")
                nic_node = self.placement.nic_node
            else:
                self.master_url = self.join_address(join)
                nic_node = nic.detect(self.master_url.split("//", 1)[1].split(":")[0])[1]
            by_id = {i.id: i for i in plan.instances}
            for inst in (by_id[k] for k in nic.nic_local_first(plan, nic_node)):
                m = self.start_worker(inst, memory_mb[inst.id], allocator=allocator)
                if log:
                    log(f"worker {inst.id} started: pid {m.pid}, {m.binding.describe()}, {m.memory_mb} MiB")
            if not self.detach and not join:
                self._start_driver(tables or {}, "driver")
            if not join:
                self.wait_master()
            self.wait_workers()
            if self._conn is not None:
                self._wait_driver()
        except BaseException:
            if not self.detach:
                self.stop()
            raise

    def _tables(self, dataset) -> dict:
        if dataset.sources or dataset.in_place:
            return {t: table_config(s) for t, s in dataset.table_sources().items()}
        return {t: {"path": p, "schema": spark_schema(p)} for t, p in find_tables(dataset).items()}

    def start_master(self, timeout: float = START_TIMEOUT_S, *, wait: bool = True,
                     binding: Binding | None = None) -> str:
        """Start the master on a free port; wait=False returns at once (check with wait_master)."""
        home = spark_home()
        port = free_port(self.host)
        argv = [str(home / "bin" / "spark-class"), MASTER_CLASS, "--host", self.host, "--port", str(port),
                "--webui-port", "0"]
        self.master_url = f"spark://{self.host}:{port}"
        self._spawn("master", None, argv, binding or Binding(None))
        if wait:
            self.wait_master(timeout)
        return self.master_url

    def wait_master(self, timeout: float = START_TIMEOUT_S) -> None:
        m = self.master()
        url = self.wait_log(m, _MASTER_URL_RE, timeout, "start")
        if url != self.master_url:  # Spark moved to another port (ours was taken meanwhile)
            raise SparkError(f"spark master started at {url}, not at the chosen {self.master_url} (port taken)",
                             "run the command again")

    def start_worker(self, inst: Instance, memory_mb: int, *, allocator: str = "system",
                     master_url: str | None = None) -> Member:
        home = spark_home()
        url = master_url or self.master_url
        if not url:
            raise SparkError("no master to join: start the master first")
        wdir = self.root / "work" / f"worker-{inst.id}"
        wdir.mkdir(parents=True, exist_ok=True)
        b = Binding.from_instance(inst, allocator)
        argv = [str(home / "bin" / "spark-class"), WORKER_CLASS, url, "--cores", str(len(inst.cpus)),
                "--memory", f"{memory_mb}m", "--work-dir", str(wdir), "--host", self.host, "--webui-port", "0"]
        m = self._spawn("worker", inst.id, argv, b, cores=len(inst.cpus), memory_mb=memory_mb)
        self._verify_started(m)
        return m

    def wait_workers(self, timeout: float = START_TIMEOUT_S) -> None:
        for m in self.workers():
            self.wait_log(m, _REGISTERED_RE, timeout, "register with the master")

    # -- the driver --
    def _driver_conf(self) -> dict:
        workers = self.workers()
        cores = sum(m.cores for m in workers)
        memory = min((m.memory_mb for m in workers), default=1024)
        conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.driver.memory": self.driver_memory,
            "spark.executor.memory": f"{memory}m",
            "spark.cores.max": str(cores),
            "spark.sql.shuffle.partitions": str(cores),
            "spark.default.parallelism": str(cores),
            "spark.sql.session.timeZone": "UTC",
            # inside the run's working directory, which restore removes: never a spark-warehouse
            # folder in the user's current directory
            "spark.sql.warehouse.dir": str(self.root / "warehouse"),
        }
        conf.update(self.extra_conf)
        return conf

    def _start_driver(self, tables: dict, log_name: str) -> None:
        """Start the driver process (it connects to the master and registers the tables as views)."""
        parent, child = socket.socketpair()
        try:
            argv = [sys.executable, "-m", "tilewise.engines.spark.driver", str(child.fileno())]
            # the driver lives as long as this process at most, even for a detached cluster
            self.driver = self._spawn("driver", None, argv, Binding(None), pass_fds=(child.fileno(),),
                                      log_name=log_name, die_with_parent=True)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        policy = self.plan.policy if self.plan is not None else "cluster"
        self._conn.send(("init", {"master": self.master_url, "conf": self._driver_conf(), "tables": tables,
                                  "executors": len(self.workers()), "app": f"tilewise-{policy}"}))

    def _wait_driver(self) -> None:
        kind, *rest = self._wait_reply(timeout=START_TIMEOUT_S + 60, what="start the Spark driver")
        if kind != "ready":
            raise SparkError(f"spark driver failed to start: {rest[0]}", f"log: {self.driver.log}")
        self.driver_info = rest[0]

    def _wait_reply(self, timeout: float | None, what: str, conn: Connection | None = None):
        conn = conn or self._conn
        driver = self.driver
        if conn is None or driver is None:
            raise TilewiseError("the Spark engine was stopped")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if conn.poll(0.25):
                    return conn.recv()
            except (EOFError, OSError):
                ok, why = driver.alive()
                raise SparkError(f"spark driver (pid {driver.pid}) {why or 'closed its channel'} "
                                 f"while trying to {what}: {log_tail(driver.log)}")
            bad = self.dead()
            if bad:
                m, why = bad[0]
                raise SparkError(f"spark {m.label} (pid {m.pid}) {why} while trying to {what}; "
                                 "the cluster is unhealthy, results would not be valid", f"log: {m.log}")
            if deadline is not None and time.monotonic() > deadline:
                raise SparkError(f"spark did not {what} within {timeout:.0f} s", f"driver log: {driver.log}")

    # -- queries --
    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        self._check_whole_cluster(instance)
        if self._stopped:
            raise TilewiseError("the Spark engine was stopped")
        with self._query_lock:
            if self._conn is None:  # a detached cluster: a driver for this process's queries
                self._start_driver(self._data_tables(), f"query-driver-{os.getpid()}")
                self._wait_driver()
            conn = self._conn
            try:
                conn.send(("sql", sql))
            except OSError as e:
                raise TilewiseError(f"the Spark driver is gone ({e})") from None
            reply = self._wait_reply(timeout_s, "run a query", conn)
        if reply[0] == "error":
            raise TilewiseError(f"spark query failed: {reply[1]}")
        _, cols, rows, elapsed = reply
        return QueryResult(list(cols), list(rows), float(elapsed), -1)

    def _data_tables(self) -> dict:
        """The recorded data set's tables (tilewise up --sf) for a query driver: each table's current
        source (a switched table's new copy) where they are recorded."""
        if self.data.get("sources"):
            return {t: table_config(s) for t, s in sources_of(self.data).items()}
        return {t: {"path": p, "schema": spark_schema(p)} for t, p in (self.data.get("tables") or {}).items()}

    def _ask_driver(self, msg: tuple, what: str, timeout_s: float | None = 300.0):
        with self._query_lock:
            conn = self._conn
            if conn is None:
                return None
            try:
                conn.send(msg)
            except OSError as e:
                raise TilewiseError(f"the Spark driver is gone ({e})") from None
            reply = self._wait_reply(timeout_s, what, conn)
        if reply[0] == "error":
            raise TilewiseError(f"spark could not {what}: {reply[1]}")
        return reply

    def switch_table(self, table: str, source: dict) -> None:
        """Register the table again over its new copy in this process's driver; later drivers (a
        detached cluster's `tilewise query`) read the recorded source."""
        if self.data.get("sources") is not None:
            self.data["sources"][table] = source
        self._ask_driver(("view", table, table_config(TableSource.from_json(source, table))), f"switch table {table}")

    def scan_stats(self) -> dict[int, dict] | None:
        """Per instance: the tasks its executor ran and the input bytes they read, cumulative (the
        driver's status store; executors matched to workers by the port they listen on)."""
        reply = self._ask_driver(("stats",), "report its executors", 60.0)
        if reply is None:
            return None
        by_port = {}
        for m in self.workers():
            for epid in executors_of(m.pid):
                for port in _listening(epid):
                    by_port[port] = m.instance
        out: dict[int, dict] = {}
        for e in reply[1]:
            try:
                inst = by_port.get(int(str(e["host_port"]).rsplit(":", 1)[1]))
            except (ValueError, IndexError):
                inst = None
            if inst is None:
                continue
            d = out.setdefault(inst, {"tasks": 0, "input_bytes": 0})
            d["tasks"] += e["tasks"]
            d["input_bytes"] += e["input_bytes"]
        return out

    def close(self) -> None:
        """Stop this process's driver (the cluster keeps running)."""
        conn, self._conn = self._conn, None
        driver, self.driver = self.driver, None
        if conn is not None:
            try:
                conn.send(("stop",))
            except OSError:
                pass
            if driver is not None and driver.proc is not None:  # a moment to stop its SparkContext cleanly
                try:
                    driver.proc.wait(timeout=5)
                except Exception:  # noqa: BLE001 - stopped below in any case
                    pass
            try:
                conn.close()
            except OSError:
                pass
        if driver is not None:
            procs.stop([driver.tree()])
            self.members = [m for m in self.members if m is not driver]

    # -- inspection --
    def master(self) -> Member | None:
        return self.member("master")

    def instance_extra(self, d: dict) -> dict:
        return {"executors": d["executors"], "memory_mb": d["memory_mb"], "master_url": self.master_url}

    def status_fields(self) -> dict:
        return {"master_url": self.master_url}

    def member_status(self, m: Member) -> dict:
        """pid, binding read back from /proc, health, executors (verified too)."""
        d = super().member_status(m)
        if not d["alive"]:
            return d
        if m.role == "worker":
            registered = False
            try:
                with open(m.log, errors="replace") as f:
                    registered = bool(_REGISTERED_RE.search(f.read()))
            except OSError:
                pass
            if not registered:
                self._unhealthy(d, "not registered with the master")
            for epid in executors_of(m.pid):
                ev = verification.verify(epid, m.binding, allocator_wait_s=0.0)
                d["executors"].append({"pid": epid, "binding_verified": ev.verdict, "verification": ev.state,
                                       "problems": ev.problems})
                if ev.verdict is False:
                    d["binding_verified"] = False
                elif ev.verdict is None and d["binding_verified"]:
                    d["binding_verified"] = None
        return d

    def connect_hints(self, state) -> list[str]:
        url = self.master_url
        if state.joined:
            return [f"workers joined {url}; submit jobs to that master as usual"]
        cores = sum(len(i["cpus"]) for i in state.plan.get("instances", []))
        port = url.rsplit(":", 1)[1]
        lines = [
            f"master: {url} (UI off)",
            f"connect: pyspark --master {url} --conf spark.sql.shuffle.partitions={cores}",
            f"   or:   SparkSession.builder.master('{url}').config('spark.driver.host', '127.0.0.1').getOrCreate()",
            "each worker runs one executor with all of its cores (leave spark.executor.cores unset); "
            "executors inherit the worker's binding",
            f"query: tilewise query --name {state.name} \"SELECT ...\" (starts a driver for the query: "
            "expect 10-30 s)",
            f"workers on other hosts: tilewise join --engine spark --coordinator <this host>:{port} --policy P "
            "(start this master with --host <routable address> for that)",
        ]
        if state.data.get("sources"):
            lines.append(f"{state.data.get('label', 'data')}: read in place from their files (the state file records "
                         "each table's current copy); tilewise query sees them as tables")
        elif state.data:
            lines.append(f"{state.data.get('label', 'data')}: spark.read.parquet('{state.data['dir']}/lineitem.parquet') "
                         "(and the 7 others); tilewise query sees them as tables")
        return lines
