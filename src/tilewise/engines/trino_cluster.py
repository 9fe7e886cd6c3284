"""A Trino cluster made of bound JVMs: one coordinator, one worker per plan instance.

Used by the Trino engine (bench: the JVMs die with tilewise) and by `tilewise up/join` (detached).
Each node gets its own etc/ and data/ under the cluster root and runs ``bin/launcher run``, which
execs the JVM in place (the pid we bind and record is the JVM's). Settings are derived per node:

- heap: the instance's share of its NUMA node's memory (procgroup.worker_memory_mb) or --worker-memory;
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

import os
import re
import time
from pathlib import Path

from tilewise.binding import Binding
from tilewise.engines import trino_install as ti
from tilewise.engines.procgroup import (ClusterError, Member, ProcessCluster, free_port,
                                        worker_memory_mb)
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

STARTED_RE = re.compile(r"======== SERVER STARTED ========")
PLUGINS = ("hive", "tpch")
ENVIRONMENT = "tilewise"
USER = "tilewise"
HEAP_QUERY_SHARE = 0.40
HEAP_HEADROOM_SHARE = 0.25
COORDINATOR_MIN_MB = 768
COORDINATOR_MAX_MB = 4096
READY_TIMEOUT_S = 300.0  # all nodes ACTIVE took 38-63 s on a quiet 2-core machine, over 3 min under heavy load


def ready_timeout_s() -> float:
    """How long start-up may take: TILEWISE_TRINO_START_TIMEOUT (seconds) or READY_TIMEOUT_S."""
    text = os.environ.get("TILEWISE_TRINO_START_TIMEOUT")
    if not text:
        return READY_TIMEOUT_S
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise UsageError(f"TILEWISE_TRINO_START_TIMEOUT={text!r} is not a positive number of seconds", "e.g. 600")
    return v


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
    """Start/inspect/stop a coordinator and bound workers. `detach`: the JVMs outlive this Python."""

    engine = "trino"
    error_cls = TrinoError
    STOP_ORDER = {"worker": 1, "coordinator": 2}

    def __init__(self, root: Path, token: str, *, host: str = "127.0.0.1", detach: bool = False,
                 members: list[Member] | None = None, endpoint: str | None = None) -> None:
        super().__init__(root, token, host=host, detach=detach, members=members, endpoint=endpoint)
        self.server = ti.server_dir()
        self.placement = None

    @classmethod
    def check_installed(cls) -> None:
        why = ti.missing()
        if why:
            raise TrinoError(f"Trino cannot run here: {why}")

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
        from tilewise.fsutil import atomic_write

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

    # -- the cluster interface (tilewise up / join, and the engine) --
    def start(self, plan: Plan, *, memory_mb: dict[int, int], allocator: str = "system", join: str | None = None,
              dataset=None, log=None, coordinator_mb: int | None = None, placement=None,
              catalog: dict | None = None) -> None:
        """Start (coordinator +) workers bound to their instances; wait until the coordinator sees every
        worker active and answers queries. catalog: hive.properties (the data set's metastore)."""
        from tilewise import nic

        self.check_installed()
        plugin_dir = self._plugin_dir()
        catalog = catalog or _throwaway_catalog(self.root)
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

    def query(self, sql: str, *, catalog: str | None = None, schema: str | None = None,
              timeout_s: float | None = None) -> tuple[list[str], list[tuple], float]:
        host, port = self.coordinator
        try:
            return run_sql(host, port, sql, catalog=catalog, schema=schema, timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - one error type for the CLI
            self.check_alive("run a query")
            raise TilewiseError(f"trino query failed: {_one_line(e)}") from None

    def connect_hints(self, state) -> list[str]:
        host, port = self.coordinator
        if state.joined:
            return [f"workers joined the coordinator {self.endpoint}; query it as usual"]
        schema = (state.data or {}).get("schema")
        lines = [f"coordinator: {self.endpoint} (UI and REST; user any name)",
                 f"query: tilewise query --name {state.name} \"SELECT ...\""
                 + (f"  (catalog hive, schema {schema})" if schema else ""),
                 f"   or: python -c \"import trino; c = trino.dbapi.connect(host='{host}', port={port}, user='me', "
                 f"catalog='hive'{', schema=' + repr(schema) if schema else ''}).cursor(); "
                 "c.execute('SELECT 1'); print(c.fetchall())\"",
                 f"workers on other hosts: tilewise join --engine trino --coordinator <this host>:{port} --policy P "
                 "(start this cluster with --host <routable address> for that; the data set must be at the same "
                 "path on every host)"]
        return lines

    @classmethod
    def default_memory_mb(cls, plan: Plan, node_memory: dict[int, int]) -> dict[int, int]:
        return worker_memory_mb(plan, node_memory, min_mb=COORDINATOR_MIN_MB)


def _throwaway_catalog(root: Path) -> dict:
    from tilewise.engines import trino_hive

    return trino_hive.catalog_properties(root / "metastore")


def _one_line(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e)
    name = getattr(e, "error_name", None)
    text = " ".join(str(msg).split())[:800]
    return f"{name}: {text}" if name else text

