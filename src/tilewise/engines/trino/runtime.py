"""Trino's runtime: bound JVMs, one coordinator and one worker per plan instance.

Serves the benchmarks (the JVMs die with tilewise) and `tilewise up/join` (detached). With a data set
the Hive view of it is prepared after start (hive.py: hard links, statistics once per data set);
queries go to the coordinator through the `trino` Python client, the workers cooperate on every
query (instance -1). Answers keep Trino's types: decimals stay Decimal (avg(decimal) and decimal
division stay decimal at Trino's scale), dates are datetime.date; bench/validate.py compares them
with the reference at the reference's scale.
Each node gets its own etc/ and data/ under the cluster root and runs ``bin/launcher run``, which
execs the JVM in place (the pid we bind and record is the JVM's). Settings are derived per node:

- heap: the instance's share of its NUMA node's memory (engines.memory.worker_memory_mb) or --worker-memory;
  query.max-memory-per-node 40 % of it, memory.heap-headroom-per-node 25 %; query.max-memory the
  sum over the workers;
- cores: -XX:ParallelGCThreads = cores, -XX:ConcGCThreads = cores/4 (at least 1), task.concurrency
  the largest power of two <= cores, task.max-worker-threads 2 x cores; -XX:+UseG1GC always (a JVM
  pinned to one CPU otherwise picks SerialGC);
- traffic: node.internal-address and node.bind-ip = the cluster's host (loopback by default);
  node-scheduler.include-coordinator=false; every worker its own node.id and HTTP port;
- plugins: plugin.dir holds only the connectors used (hive, tpch), which shortens start-up.

The coordinator is placed by the plan (tilewise.nic.place_coordinator): it shares the CPUs and
memory policy of the instance local to the NIC carrying inter-host traffic (instance 0 on loopback).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from tilewise import nic
from tilewise.binding import Binding
from tilewise.engines.contract import QueryResult
from tilewise.engines.procgroup import ClusterError, Member, ProcessCluster, free_port
from tilewise.engines.trino import COORDINATOR_MIN_MB, SPEC, env
from tilewise.engines.trino import hive
from tilewise.engines.trino import install as ti
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write
from tilewise.plan import Plan

STARTED_RE = re.compile(r"======== SERVER STARTED ========")
PLUGINS = ("hive", "tpch")
ENVIRONMENT = "tilewise"
USER = "tilewise"
HEAP_QUERY_SHARE = 0.40
HEAP_HEADROOM_SHARE = 0.25
COORDINATOR_MAX_MB = 4096
NO_NODES_GRACE_S = 60.0  # a query refused with NO_NODES_AVAILABLE is retried this long (CI, load 3: right after ready)
READY_TIMEOUT_S = 300.0  # all nodes ACTIVE took 38-63 s on a quiet 2-core machine, over 3 min under heavy load


def ready_timeout_s() -> float:
    """How long start-up may take: TILEWISE_TRINO_START_TIMEOUT (seconds) or READY_TIMEOUT_S."""
    return env.START_TIMEOUT.value() or READY_TIMEOUT_S


class TrinoError(ClusterError):
    pass


# ---- settings: pure functions ----------------------------------------------------------------

def task_concurrency(cores: int) -> int:
    """The largest power of two <= cores (Trino requires a power of two), at least 1."""
    n = 1
    while n * 2 <= max(1, cores):
        n *= 2
    return n


def jvm_options(heap_mb: int, cores: int | None) -> list[str]:
    opts = ["-server", f"-Xmx{heap_mb}m", "-XX:+UseG1GC"]
    if cores:
        opts += [f"-XX:ParallelGCThreads={cores}", f"-XX:ConcGCThreads={max(1, cores // 4)}",
                 f"-XX:ActiveProcessorCount={cores}"]
    opts += [
        "-XX:+ExplicitGCInvokesConcurrent",
        "-XX:+ExitOnOutOfMemoryError",
        "-XX:-OmitStackTraceInFastThrow",
        "-XX:ReservedCodeCacheSize=256M",
        "-XX:PerMethodRecompilationCutoff=10000",
        "-XX:PerBytecodeRecompilationCutoff=10000",
        "-XX:+EnableDynamicAgentLoading",
        "-Djdk.attach.allowAttachSelf=true",
        "-Djdk.nio.maxCachedBufferSize=2000000",
        "-Dfile.encoding=UTF-8",
    ]
    return opts


def memory_settings(heap_mb: int) -> dict[str, str]:
    return {"query.max-memory-per-node": f"{int(heap_mb * HEAP_QUERY_SHARE)}MB",
            "memory.heap-headroom-per-node": f"{int(heap_mb * HEAP_HEADROOM_SHARE)}MB"}


def coordinator_memory_mb(worker_mb: dict[int, int]) -> int:
    """Half the smallest worker's heap, between 768 MiB and 4 GiB (it plans, it does not scan)."""
    base = min(worker_mb.values()) // 2 if worker_mb else COORDINATOR_MIN_MB
    return max(COORDINATOR_MIN_MB, min(COORDINATOR_MAX_MB, base))


def node_properties(node_id: str, data_dir: Path, host: str) -> dict[str, str]:
    return {"node.environment": ENVIRONMENT, "node.id": node_id, "node.data-dir": str(data_dir),
            "node.internal-address": host, "node.bind-ip": host}


def coordinator_config(port: int, host: str, heap_mb: int, cluster_query_mb: int, plugin_dir: Path) -> dict[str, str]:
    return {"coordinator": "true", "node-scheduler.include-coordinator": "false",
            "http-server.http.port": str(port), "discovery.uri": f"http://{host}:{port}",
            "query.max-memory": f"{max(cluster_query_mb, 64)}MB", **memory_settings(heap_mb),
            "plugin.dir": str(plugin_dir)}


def worker_config(port: int, discovery_uri: str, heap_mb: int, cores: int, plugin_dir: Path) -> dict[str, str]:
    return {"coordinator": "false", "http-server.http.port": str(port), "discovery.uri": discovery_uri,
            **memory_settings(heap_mb), "task.concurrency": str(task_concurrency(cores)),
            "task.max-worker-threads": str(2 * max(1, cores)), "plugin.dir": str(plugin_dir)}


def properties_text(props: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in props.items())


def coordinator_address(text: str) -> tuple[str, int]:
    """HOST:PORT or http://HOST:PORT -> (host, port)."""
    m = re.fullmatch(r"(?:https?://)?([^:/]+):(\d+)/?", text or "")
    if not m or not 0 < int(m.group(2)) < 65536:
        raise UsageError(f"{text!r} is not a Trino coordinator address", "use HOST:PORT or http://HOST:PORT")
    return m.group(1), int(m.group(2))


# ---- talking to the coordinator --------------------------------------------------------------

def connect(host: str, port: int, *, catalog: str | None = None, schema: str | None = None,
            timeout_s: float | None = None):
    import trino

    kwargs = {"request_timeout": timeout_s} if timeout_s else {}
    return trino.dbapi.connect(host=host, port=port, user=USER, catalog=catalog, schema=schema,
                               http_scheme="http", **kwargs)


def run_sql(host: str, port: int, sql: str, *, catalog: str | None = None, schema: str | None = None,
            timeout_s: float | None = None) -> tuple[list[str], list[tuple], float]:
    """(columns, rows, elapsed_s): elapsed is the coordinator's own time for the query when reported."""
    conn = connect(host, port, catalog=catalog, schema=schema, timeout_s=timeout_s)
    try:
        cur = conn.cursor()
        t0 = time.perf_counter()
        cur.execute(sql)
        rows = [tuple(r) for r in cur.fetchall()]
        wall = time.perf_counter() - t0
        cols = [d[0] for d in cur.description] if cur.description else []
        stats = getattr(cur, "stats", None) or {}
        elapsed = (stats.get("elapsedTimeMillis") or 0) / 1000.0
        return cols, rows, elapsed if 0 < elapsed <= wall else wall
    finally:
        conn.close()


def _transient(e: Exception) -> bool:
    text = str(e)
    return any(k in text for k in ("SERVER_STARTING_UP", "NO_NODES_AVAILABLE", "Connection refused",
                                   "RemoteDisconnected", "Connection aborted", "503"))


class TrinoCluster(ProcessCluster):
    """Start/inspect/stop a coordinator and bound workers, query the coordinator."""

    spec = SPEC
    error_cls = TrinoError
    STOP_ORDER = {"worker": 1, "coordinator": 2}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server = ti.server_dir()
        self.start_s: float | None = None  # the JVMs' start-up, apart from preparing the data set
        self.prepare_info: dict = {}

    @classmethod
    def check_installed(cls) -> None:
        why = ti.missing()
        if why:
            raise TrinoError(f"Trino cannot run here: {why}")

    @classmethod
    def join_address(cls, text: str) -> str:
        host, port = coordinator_address(text)
        return f"http://{host}:{port}"

    @property
    def coordinator(self) -> tuple[str, int]:
        if not self.endpoint:
            raise TrinoError("this Trino cluster has no coordinator address recorded")
        return coordinator_address(self.endpoint)

    # -- node directories --
    def _plugin_dir(self) -> Path:
        d = self.root / "plugins"
        d.mkdir(parents=True, exist_ok=True)
        for p in PLUGINS:
            link = d / p
            if not link.exists():
                link.symlink_to(self.server / "plugin" / p)
        return d

    def _write_node(self, name: str, node_id: str, config: dict, jvm: list[str], catalog: dict) -> Path:
        base = self.root / name
        etc, data = base / "etc", base / "data"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        atomic_write(etc / "node.properties", properties_text(node_properties(node_id, data, self.host)))
        atomic_write(etc / "config.properties", properties_text(config))
        atomic_write(etc / "jvm.config", "".join(o + "\n" for o in jvm))
        atomic_write(etc / "log.properties", "io.trino=INFO\n")
        atomic_write(etc / "catalog" / "hive.properties", properties_text(catalog))
        atomic_write(etc / "catalog" / "tpch.properties", properties_text({"connector.name": "tpch",
                                                                            "tpch.column-naming": "STANDARD"}))
        return base

    def _launch(self, role: str, instance: int | None, name: str, node_id: str, b: Binding, *, cores: int,
                heap_mb: int, config: dict, catalog: dict, port: int) -> Member:
        jvm = jvm_options(heap_mb, cores if b.cpus is not None else None)
        base = self._write_node(name, node_id, config, jvm, catalog)
        java = ti.java_home()
        argv = [str(self.server / "bin" / "launcher"), "run", f"--etc-dir={base / 'etc'}",
                f"--data-dir={base / 'data'}", f"--jvm-dir={java}"]
        env = self.env()
        env["JAVA_HOME"] = str(java)
        m = self._spawn(role, instance, argv, b, cores=cores, memory_mb=heap_mb, env=env, log_name=name,
                        extra={"node_id": node_id, "port": port})
        self._verify_started(m)
        return m

    # -- start --
    def start(self, plan: Plan, *, dataset=None, allocator: str = "system", memory_mb=None, coordinator_mb=None,
              join=None, log=None, placement=None) -> None:
        """Start (coordinator +) workers bound to their instances; wait until the coordinator sees every
        worker active and answers queries; then prepare the data set's schema (unless joined)."""
        self.check_installed()
        try:
            memory_mb = self._begin(plan, dataset, memory_mb, join)
            wh = hive.Warehouse(dataset, fallback_dir=self.root) if dataset is not None else None
            catalog = hive.catalog_properties(wh.metastore if wh else self.root / "metastore")
            t0 = time.monotonic()
            self._start_jvms(plan, memory_mb, allocator, join, log, coordinator_mb, placement, catalog)
            self.start_s = time.monotonic() - t0
            if wh is not None and not join:
                self.prepare_info = wh.prepare(lambda sql: self._sql(sql), ti.version(), log=log)
                self.data.update({"schema": wh.schema, "catalog": hive.CATALOG,
                                  "statistics_cached": self.prepare_info["cached"]})
            elif wh is not None:
                self.data.update({"schema": wh.schema, "catalog": hive.CATALOG})
        except BaseException:
            if not self.detach:
                self.stop()
            raise

    def _start_jvms(self, plan: Plan, memory_mb: dict[int, int], allocator: str, join: str | None, log,
                    coordinator_mb: int | None, placement, catalog: dict) -> None:
        plugin_dir = self._plugin_dir()
        tag = self.token[:8]
        if join:
            host, port = coordinator_address(join)
            self.endpoint = f"http://{host}:{port}"
        else:
            port = free_port(self.host)
            self.endpoint = f"http://{self.host}:{port}"
            self.placement = placement or nic.place_coordinator(plan, *nic.detect(self.host))
            inst = self.placement.coordinator
            b = (Binding.from_instance(inst, allocator) if inst is not None else Binding(None))
            heap = coordinator_mb or coordinator_memory_mb(memory_mb)
            cluster_mb = sum(int(memory_mb[i.id] * HEAP_QUERY_SHARE) for i in plan.instances)
            m = self._launch("coordinator", None, "coordinator", f"coordinator-{tag}", b,
                             cores=len(inst.cpus) if inst else 0, heap_mb=heap,
                             config=coordinator_config(port, self.host, heap, cluster_mb, plugin_dir),
                             catalog=catalog, port=port)
            if log:
                log(f"coordinator starting at {self.endpoint}: pid {m.pid}, {b.describe()}, heap {heap} MiB")
        discovery = self.endpoint
        nic_node = self.placement.nic_node if self.placement else nic.detect(self.coordinator[0])[1]
        by_id = {i.id: i for i in plan.instances}
        for inst in (by_id[k] for k in nic.nic_local_first(plan, nic_node)):
            wport = free_port(self.host)
            heap = memory_mb[inst.id]
            m = self._launch("worker", inst.id, f"worker-{inst.id}", f"worker-{inst.id}-{tag}",
                             Binding.from_instance(inst, allocator), cores=len(inst.cpus), heap_mb=heap,
                             config=worker_config(wport, discovery, heap, len(inst.cpus), plugin_dir),
                             catalog=catalog, port=wport)
            if log:
                log(f"worker {inst.id} started: pid {m.pid}, {m.binding.describe()}, heap {heap} MiB")
        self.wait_ready()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Every local JVM logged SERVER STARTED; the coordinator lists our workers as active and runs a query."""
        timeout = timeout or ready_timeout_s()
        deadline = time.monotonic() + timeout
        for m in self.members:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrinoError(f"the Trino cluster did not start within {timeout:.0f} s ({m.label} still starting)",
                                 "on a busy machine set TILEWISE_TRINO_START_TIMEOUT=600; logs: "
                                 f"{self.root / 'logs'}")
            self.wait_log(m, STARTED_RE, left, f"start within the cluster's {timeout:.0f} s")
        ours = {m.extra.get("node_id") for m in self.workers()}
        host, port = self.coordinator
        last = ""
        while True:
            self.check_alive("join the cluster")
            try:
                _, rows, _ = run_sql(host, port, "SELECT node_id FROM system.runtime.nodes WHERE state = 'active'",
                                     timeout_s=30)
                active = {r[0] for r in rows}
                if ours <= active:
                    run_sql(host, port, "SELECT 1", timeout_s=30)  # past SERVER_STARTING_UP
                    return
                last = f"{len(ours - active)} of {len(ours)} worker(s) not active yet"
            except Exception as e:  # noqa: BLE001 - the client raises many kinds while the server starts
                if not _transient(e):
                    last = str(e)[:300]
                else:
                    last = "the coordinator is still starting"
            if time.monotonic() > deadline:
                raise TrinoError(f"the Trino cluster was not ready within {timeout:.0f} s: {last}",
                                 f"logs: {self.root / 'logs'}")
            time.sleep(0.5)

    def active_nodes(self) -> dict[str, str] | None:
        """node_id -> state, as the coordinator sees them (None: the coordinator does not answer)."""
        try:
            host, port = self.coordinator
            _, rows, _ = run_sql(host, port, "SELECT node_id, state FROM system.runtime.nodes", timeout_s=10)
        except Exception:  # noqa: BLE001
            return None
        return {r[0]: r[1] for r in rows}

    def member_status(self, m: Member, nodes: dict | None = None) -> dict:
        d = super().member_status(m)
        d["node_id"] = m.extra.get("node_id")
        d["port"] = m.extra.get("port")
        if d["alive"] and m.role == "worker":
            if nodes is None:
                nodes = self.active_nodes()
            state = None if nodes is None else nodes.get(m.extra.get("node_id"))
            if nodes is None:
                self._unhealthy(d, f"the coordinator {self.endpoint} does not answer")
            elif state != "active":
                self._unhealthy(d, f"not active at the coordinator ({state or 'not listed'})")
        return d

    def statuses(self) -> list[dict]:
        nodes = self.active_nodes() if any(m.role == "worker" for m in self.members) else None
        return [self.member_status(m, nodes) for m in self.members]

    def _sql(self, sql: str, *, catalog: str | None = None, schema: str | None = None,
             timeout_s: float | None = None) -> tuple[list[str], list[tuple], float]:
        host, port = self.coordinator
        deadline = time.monotonic() + NO_NODES_GRACE_S
        while True:
            try:
                return run_sql(host, port, sql, catalog=catalog, schema=schema, timeout_s=timeout_s)
            except Exception as e:  # noqa: BLE001 - one error type for the CLI
                self.check_alive("run a query")
                # the scheduler's view of the workers lags system.runtime.nodes after a start; such a
                # query was never scheduled, so running it again runs it once
                if "NO_NODES_AVAILABLE" in str(e) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise TilewiseError(f"trino query failed: {_one_line(e)}") from None

    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        self._check_whole_cluster(instance)
        if self._stopped or not self.endpoint:
            raise TilewiseError("the Trino engine is not started")
        cols, rows, elapsed = self._sql(sql, catalog=self.data.get("catalog"), schema=self.data.get("schema"),
                                        timeout_s=timeout_s)
        return QueryResult(cols, rows, elapsed, -1)

    def scan_stats(self) -> dict[int, dict] | None:
        """Per instance, cumulative: the splits its worker's tasks ran and the raw input bytes they
        read (system.runtime.tasks; "tasks" counts splits here), by the worker's node id."""
        if self._stopped or not self.endpoint or self.joined:
            return None
        _, rows, _ = self._sql("SELECT node_id, sum(splits), sum(raw_input_bytes) FROM system.runtime.tasks "
                               "GROUP BY node_id")
        by_node = {m.extra.get("node_id"): m.instance for m in self.workers()}
        return {by_node[n]: {"tasks": int(sp or 0), "input_bytes": int(b or 0)} for n, sp, b in rows if n in by_node}

    def info(self, instance: int) -> dict:
        m = self.worker(instance)
        if m is None:
            return {}
        return {"threads": task_concurrency(m.cores), "heap_mb": m.memory_mb, "memory_mb": m.memory_mb, "pid": m.pid,
                "node_id": m.extra.get("node_id")}

    def instance_extra(self, d: dict) -> dict:
        return {"heap_mb": d["memory_mb"], "node_id": d["node_id"], "coordinator": self.endpoint}

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of every JVM (MiB), keyed coordinator / worker-<i>."""
        import psutil

        out = {}
        for m in self.members:
            try:
                out[m.role if m.instance is None else f"{m.role}-{m.instance}"] = \
                    round(psutil.Process(m.pid).memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        return out

    def connect_hints(self, state) -> list[str]:
        host, port = self.coordinator
        if state.joined:
            return [f"workers joined the coordinator {self.endpoint}; query it as usual"]
        schema = (state.data or {}).get("schema")
        lines = [f"coordinator: {self.endpoint} (UI and REST; user any name)",
                 f"query: tilewise query --name {state.name} \"SELECT ...\""
                 + (f"  (catalog hive, schema {schema})" if schema else ""),
                 f"   or: python -c \"import trino; c = trino.dbapi.connect(host='{host}', port={port}, user='me', "
                 f"catalog='{hive.CATALOG}'{', schema=' + repr(schema) if schema else ''}).cursor(); "
                 "c.execute('SELECT 1'); print(c.fetchall())\"",
                 f"workers on other hosts: tilewise join --engine trino --coordinator <this host>:{port} --policy P "
                 "(start this cluster with --host <routable address> for that; the data set must be at the same "
                 "path on every host)"]
        return lines



def _one_line(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e)
    name = getattr(e, "error_name", None)
    text = " ".join(str(msg).split())[:800]
    return f"{name}: {text}" if name else text
