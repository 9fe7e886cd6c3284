"""Long-running clusters (`tilewise up/status/down`): start, record, inspect, stop.

A cluster of any engine (spark, trino, duckdb: cluster.BACKENDS, each a procgroup.ProcessCluster)
is recorded in a versioned JSON state file, ``<state dir>/<name>.json``, written atomically (temp
file, fsync, rename) BEFORE any process starts and again after each one, so a crash or Ctrl-C in
the middle of `up` can always be cleaned up by `down`: every process carries the cluster's token in
its environment and `down` stops whatever still carries it. While `up` runs, each started process
is also journaled in a change session (tilewise.changes), so `tilewise restore` undoes an `up`
that was killed half way.

State dir: $TILEWISE_CLUSTER_DIR, else $XDG_RUNTIME_DIR/tilewise/clusters, else
~/.cache/tilewise/clusters. Logs and Spark work dirs live in ``<state dir>/<name>/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.fsutil import atomic_write_json
from tilewise import __version__, changes, dirs
from tilewise.engines import procgroup
from tilewise.engines.procgroup import ProcessCluster
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

FORMAT = "tilewise-cluster/2"
OLD_FORMATS = ("tilewise-cluster/1",)  # upgraded on load (Spark only; master_url became endpoint)
# engine -> the ProcessCluster subclass that starts, inspects and stops its processes
BACKENDS = {
    "spark": "tilewise.engines.spark_cluster:SparkCluster",
    "trino": "tilewise.engines.trino_cluster:TrinoCluster",
    "duckdb": "tilewise.engines.duckdb_server:DuckDBServers",
}
ENGINES_UP = tuple(BACKENDS)
JOINABLE = ("spark", "trino")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def backend(engine: str) -> type[ProcessCluster]:
    target = BACKENDS.get((engine or "").lower())
    if target is None:
        raise UsageError(f"unknown engine {engine!r}", f"choose one of {', '.join(BACKENDS)}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def state_dir() -> Path:
    return dirs.cluster_dir()


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name or ""):
        raise UsageError(f"bad cluster name {name!r}", "use letters, digits, '.', '_' or '-' (up to 64)")
    return name


@dataclass
class ClusterState:
    name: str
    engine: str
    token: str
    state: str  # starting | running
    created: float
    root: str
    plan: dict
    host: str = "127.0.0.1"
    endpoint: str | None = None  # spark://H:P master, http://H:P coordinator, the DuckDB socket directory
    joined: bool = False  # workers joined a master/coordinator started elsewhere
    data: dict = field(default_factory=dict)  # the data set served ({"label", "dir", "sf", "schema", ...})
    members: list[dict] = field(default_factory=list)
    placement: dict = field(default_factory=dict)  # where the coordinator went and why (tilewise.nic)
    version: str = __version__

    @property
    def master_url(self) -> str | None:  # the name Spark users know
        return self.endpoint

    def to_json(self) -> dict:
        return {"format": FORMAT, "name": self.name, "engine": self.engine, "token": self.token, "state": self.state,
                "created": self.created, "root": self.root, "plan": self.plan, "host": self.host,
                "endpoint": self.endpoint, "joined": self.joined, "data": self.data, "members": self.members,
                "placement": self.placement, "tilewise_version": self.version}

    @classmethod
    def from_json(cls, d: dict, path: Path) -> ClusterState:
        fmt = d.get("format")
        if fmt in OLD_FORMATS:
            d = dict(d, endpoint=d.get("master_url"))
        elif fmt != FORMAT:
            raise TilewiseError(f"{path} has unknown format {fmt!r} (this tilewise reads {FORMAT})",
                                "stop that cluster with the tilewise version that started it")
        try:
            return cls(d["name"], d["engine"], d["token"], d["state"], float(d["created"]), d["root"], d["plan"],
                       d.get("host", "127.0.0.1"), d.get("endpoint"), bool(d.get("joined")), d.get("data") or {},
                       list(d.get("members") or []), d.get("placement") or {}, d.get("tilewise_version", "?"))
        except (KeyError, TypeError, ValueError) as e:
            raise TilewiseError(f"{path} is damaged ({e})", "remove it after checking no process is left") from None

    def cluster(self) -> ProcessCluster:
        members = [procgroup.Member.from_json(m) for m in self.members]
        return backend(self.engine)(Path(self.root), self.token, host=self.host, detach=True, members=members,
                                    endpoint=self.endpoint)


def state_path(name: str) -> Path:
    return state_dir() / f"{check_name(name)}.json"


def save(st: ClusterState) -> None:
    atomic_write_json(state_path(st.name), st.to_json())


def load(name: str) -> ClusterState | None:
    path = state_path(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TilewiseError(f"cannot read {path}: {e.strerror}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise TilewiseError(f"{path} is not valid JSON ({e.msg})", "remove it after checking no process is left") from None
    return ClusterState.from_json(d, path)


def names() -> list[str]:
    d = state_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if not p.name.startswith("."))


def remove(st: ClusterState) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(st.name).unlink()
    root = Path(st.root)
    if root.is_dir() and root.parent == state_dir():  # only what we created
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def locked(name: str):
    """One up/down at a time per cluster name."""
    d = state_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fh = open(d / f".{check_name(name)}.lock", "w")
    except OSError as e:
        raise UsageError(f"cannot use the cluster state directory {d}: {e.strerror}",
                         "set TILEWISE_CLUSTER_DIR to a writable directory") from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another tilewise up/down is working on cluster {name!r}", "wait for it") from None
        yield


# ---- the lifecycle ------------------------------------------------------------------------------

def is_alive(st: ClusterState) -> bool:
    return any(m.alive()[0] for m in st.cluster().members) or bool(procgroup.tagged_processes(st.token))


def detect_host(address: str) -> str:
    """The local address that reaches HOST:PORT (or URL) -- what joining workers must advertise."""
    m = re.fullmatch(r"(?:[a-z]+://)?([^:/]+):(\d+)/?", address or "")
    if not m:
        raise UsageError(f"{address!r} is not HOST:PORT", "use e.g. 10.0.0.1:8080 (or spark://HOST:PORT)")
    host, port = m.group(1), int(m.group(2))
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise UsageError(f"cannot reach {host}:{port}: {e.strerror or e}",
                         "check the address, or pass --host ADDR") from None


def up(plan: Plan, *, engine: str, name: str, allocator: str, worker_memory_mb: dict[int, int],
       join: str | None = None, host: str | None = None, dataset=None, log=None, placement=None,
       coordinator_mb: int | None = None) -> ClusterState:
    """Start a detached, bound cluster (or, with join, only workers for a coordinator elsewhere) and
    record it. On any failure or interrupt: stop all, remove."""
    engine = (engine or "").lower()
    cls = backend(engine)
    if join and engine not in JOINABLE:
        raise UsageError(f"{engine} workers cannot join a cluster on another host",
                         f"join works for {', '.join(JOINABLE)}")
    cls.check_installed()
    h = host or (detect_host(join) if join else "127.0.0.1")
    with locked(name):
        old = load(name)
        if old is not None:
            if is_alive(old):
                raise UsageError(f"cluster {name!r} is already running ({old.engine}, {old.endpoint})",
                                 f"stop it with `tilewise down --name {name}` or pick another --name")
            if log:
                log(f"cluster {name!r} was recorded but is no longer running: cleaning up its state")
            old.cluster().stop()
            remove(old)
        root = state_dir() / name
        shutil.rmtree(root, ignore_errors=True)
        data = _data_doc(engine, dataset)
        st = ClusterState(name, engine, procgroup.new_token(), "starting", time.time(), str(root), plan.to_json(), h,
                          endpoint=None, joined=bool(join), data=data)
        save(st)  # recorded before anything starts: `down` can always clean up
        cl = cls(root, st.token, host=h, detach=True)
        # every started process is also journaled in a change session: if `up` itself is killed half
        # way, `tilewise restore` stops what it had started; on success the session is committed
        # (the cluster stays on purpose; `down` stops it from the state file)
        sess = changes.Session(f"up {name}")
        journaled: set[int] = set()

        def record(c: ProcessCluster) -> None:
            for m in c.members:
                if m.start is not None and m.pid not in journaled:
                    sess.record(changes.StartedProcess(m.pid, m.start, m.token, name=f"{engine} {m.label}"),
                                "state", "stopped", "running")
                    journaled.add(m.pid)
            st.members = [m.to_json() for m in c.members]
            st.endpoint = c.endpoint
            pl = getattr(c, "placement", None)
            st.placement = pl.to_json() if pl is not None else {}
            save(st)

        cl.on_change = record
        try:
            kwargs = {}
            if engine == "trino":
                kwargs = _trino_kwargs(st, cl, dataset, placement, coordinator_mb)
            cl.start(plan, memory_mb=worker_memory_mb, allocator=allocator, join=join,
                     dataset=dataset, log=log, **kwargs)
            if engine == "trino" and dataset is not None and not join:
                from tilewise.engines import trino_hive, trino_install

                info = trino_hive.Warehouse(dataset, fallback_dir=root).prepare(
                    lambda sql: cl.query(sql), trino_install.version(), log=log)
                st.data["statistics_cached"] = info["cached"]
            st.state = "running"
            record(cl)
            sess.commit()
            return st
        except BaseException:
            try:
                cl.stop()
            finally:
                remove(st)
                sess.close()  # what cl.stop() reached is already stopped: this checks and releases
            raise


def _data_doc(engine: str, dataset) -> dict:
    if dataset is None:
        return {}
    doc = {"label": dataset.label, **dataset.to_json(), "tables": {k: str(v) for k, v in dataset.tables.items()}}
    if engine == "trino":
        from tilewise.engines import trino_hive

        doc["schema"] = trino_hive.schema_name(dataset)
        doc["catalog"] = trino_hive.CATALOG
    return doc


def _trino_kwargs(st: ClusterState, cl, dataset, placement, coordinator_mb) -> dict:
    from tilewise.engines import trino_hive

    kw: dict = {"placement": placement, "coordinator_mb": coordinator_mb}
    if dataset is not None:
        wh = trino_hive.Warehouse(dataset, fallback_dir=Path(st.root))
        kw["catalog"] = trino_hive.catalog_properties(wh.metastore)
    return kw


def status(st: ClusterState) -> dict:
    cl = st.cluster()
    members = cl.statuses()
    workers = [m for m in members if m["role"] == "worker"]
    expected = len(st.plan.get("instances", []))
    healthy = all(m["healthy"] and m["binding_verified"] is not False for m in members) \
        and len(workers) == expected and st.state == "running"
    problems = []
    if st.state != "running":
        problems.append(f"the cluster never finished starting (state {st.state}); run `tilewise down --name {st.name}`")
    if len(workers) != expected:
        problems.append(f"{len(workers)} of {expected} workers were started")
    for m in members:
        if not m["healthy"] or m["binding_verified"] is False:
            who = m["role"] if m["instance"] is None else f"{m['role']} {m['instance']}"
            problems.append(f"{who} (pid {m['pid']}): {m['detail'] or 'binding does not match the plan'}")
    return {"name": st.name, "engine": st.engine, "state": st.state, "endpoint": st.endpoint,
            "master_url": st.endpoint if st.engine == "spark" else None,
            "joined": st.joined, "policy": st.plan.get("policy"), "created": st.created, "healthy": healthy,
            "problems": problems, "members": members, "data": st.data, "placement": st.placement,
            "state_file": str(state_path(st.name))}


def down(st: ClusterState) -> dict:
    with locked(st.name):
        cl = st.cluster()
        pids = [m.pid for m in cl.members if m.alive()[0]]
        swept = cl.stop()
        remove(st)
    return {"name": st.name, "engine": st.engine, "stopped_pids": sorted(set(pids) | set(swept)), "left": []}


def query(st: ClusterState, sql: str, *, instance: int | None = None, timeout_s: float | None = None):
    """Run one SQL statement on a running cluster: (columns, rows, elapsed_s, instance)."""
    cl = st.cluster()
    if st.engine == "duckdb":
        r = cl.query(sql, instance=instance, timeout_s=timeout_s)
        return r.columns, r.rows, r.elapsed_s, r.instance
    if st.engine == "trino":
        if instance is not None:
            raise UsageError("Trino runs every query on the whole cluster", "drop --instance")
        if st.joined:
            raise UsageError("this cluster only holds workers that joined a coordinator elsewhere",
                             "query the coordinator's cluster (on the host that ran `tilewise up`)")
        cols, rows, elapsed = cl.query(sql, catalog=st.data.get("catalog"), schema=st.data.get("schema"),
                                       timeout_s=timeout_s)
        return cols, rows, elapsed, -1
    raise UsageError(f"`tilewise query` does not drive {st.engine} clusters",
                     "submit Spark jobs with pyspark (tilewise up prints how)")
