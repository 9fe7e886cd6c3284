"""Long-running clusters (`tilewise up/status/down`): start, record, inspect, stop.

A cluster of any engine (its runtime, found through the engine registry and driven only through
the contract of engines.contract.Runtime) is recorded in a versioned JSON state file, ``<state dir>/<name>.json``, written atomically (temp
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
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import __version__, allocators, changes, dirs, engines, procs, signals, topology
from tilewise.binding import ensure_runnable
from tilewise.data import record_of, sources_of
from tilewise.engines.contract import CLUSTER_VAR, EngineSpec, Runtime, new_token
from tilewise.errors import TilewiseError, UsageError
from tilewise import fsutil
from tilewise.fsutil import atomic_write_json
from tilewise.plan import Plan

FORMAT = "tilewise-cluster/2"
OLD_FORMATS = ("tilewise-cluster/1",)  # upgraded on load (Spark only; master_url became endpoint)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def backend(engine: str) -> type[Runtime]:
    """The runtime class of a registered engine (what starts, inspects, queries and stops it)."""
    return engines.get(engine).runtime_class()


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
    # what the runtime's record() says (Runtime.restore reads it back):
    endpoint: str | None = None  # spark://H:P master, http://H:P coordinator, the DuckDB socket directory
    joined: bool = False  # workers joined a master/coordinator started elsewhere
    data: dict = field(default_factory=dict)  # the data set served ({"label", "dir", "sf", "schema", ...})
    members: list[dict] = field(default_factory=list)  # the engine's own record of its processes
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

    def record(self) -> dict:
        return {"endpoint": self.endpoint, "joined": self.joined, "data": self.data, "members": self.members,
                "placement": self.placement}

    def take(self, record: dict) -> None:
        """Keep what a runtime's record() says (its data set record only when it has one)."""
        self.endpoint, self.joined, self.members = record["endpoint"], record["joined"], record["members"]
        self.placement, self.data = record["placement"], record["data"] or self.data

    def cluster(self) -> Runtime:
        """The engine's runtime, rebuilt from this record (detached: it drives, it does not own)."""
        return backend(self.engine).restore(Path(self.root), self.token, host=self.host, record=self.record())


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
        fsutil.remove_run_dir(root)  # a failed start's logs stay where its error names them


@contextlib.contextmanager
def locked(name: str):
    """One up/down at a time per cluster name. The lock file goes with the state it guards: when no
    cluster of that name is recorded afterwards (`down`, a refused or failed `up`), it is removed."""
    d = state_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot use the cluster state directory {d}: {e.strerror}",
                         "set TILEWISE_CLUSTER_DIR to a writable directory") from None
    # a background helper (cracking) holds it for milliseconds at a time
    with _held(name, 3.0, UsageError(f"another tilewise up/down is working on cluster {name!r}", "wait for it")):
        yield


def _held(name: str, timeout_s: float, busy: Exception):
    """The cluster's lock, held for the block; its file removed after it when no cluster of that
    name is recorded then (fsutil.locked_file: a waiter finds the file gone and opens the path again)."""
    path = state_dir() / f".{check_name(name)}.lock"
    return fsutil.locked_file(
        path, timeout_s=timeout_s, busy=busy, remove_after=lambda: not state_path(name).exists(),
        cannot=lambda e: UsageError(f"cannot use the cluster state directory {path.parent}: {e.strerror}",
                                    "set TILEWISE_CLUSTER_DIR to a writable directory"))


def update(name: str, token: str, change, timeout_s: float = 60.0) -> bool:
    """Change the recorded state of a running cluster (change(state) edits it in place) and save it,
    waiting for the cluster's lock (an `up` or `down` in progress). False when no cluster of that
    name is recorded, or another one is now (its token differs): nothing is written then, so a
    background helper of a cluster that was stopped never brings its record back."""
    if not state_path(name).exists():
        return False  # nothing recorded: no lock file is made for it either
    with _held(name, timeout_s, TilewiseError(f"cluster {name!r} stayed locked for {timeout_s:.0f} s")):
        st = load(name)
        if st is None or st.token != token:
            return False
        change(st)
        save(st)
        return True


# ---- the lifecycle ------------------------------------------------------------------------------

def is_alive(st: ClusterState) -> bool:
    return st.cluster().alive()


def unrecorded(name: str) -> list[int]:
    """Pids of processes started by `up --name name` that still run while no state file records
    them (it was deleted): every one carries the deployment's directory in CLUSTER_VAR."""
    root = str(state_dir() / check_name(name))
    return sorted(procs.carrying(CLUSTER_VAR, [root], procs.scan())[root])


def down_unrecorded(name: str) -> dict:
    """`down` of a deployment whose state file is gone: stop what carries its name, remove its directory."""
    root = state_dir() / check_name(name)
    with locked(name):
        rep = procs.stop([procs.Tree(None, str(root), CLUSTER_VAR)])
        if not rep.ok:
            raise TilewiseError(f"could not stop processes of cluster {name!r}: {rep.summary()}",
                                "kill them by pid (are you the same user?)")
        if root.is_dir():
            shutil.rmtree(root, ignore_errors=True)
    return {"name": name, "engine": None, "stopped_pids": sorted(p["pid"] for p in rep.stopped), "left": [],
            "state_file": "missing: found by the processes' own record of their cluster"}


def check_address(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (or scheme://HOST:PORT), the port in 1..65535: checked before
    anything starts (a worker told an impossible port would fail only when it registers)."""
    m = re.fullmatch(r"(?:[a-z]+://)?([^:/]+):(\d+)/?", address or "")
    if not m:
        raise UsageError(f"{address!r} is not HOST:PORT", "use e.g. 10.0.0.1:8080 (or spark://HOST:PORT)")
    port = int(m.group(2))
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port} of {address!r} is out of range", "a TCP port is 1..65535")
    return m.group(1), port


def detect_host(address: str) -> str:
    """The local address that reaches HOST:PORT (or URL) -- what joining workers must advertise."""
    host, port = check_address(address)
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise UsageError(f"cannot reach {host}:{port}: {e.strerror or e}",
                         "check the address, or pass --host ADDR") from None


# ---- the use case: `tilewise up` and `tilewise join` ------------------------------------------------

@dataclass
class Config:
    engine: str
    plan: Callable[[object], Plan]  # the plan of the command's policy options, for the loaded topology
    topology_src: str | None = None
    name: str = "default"
    allocator: str = "system"
    worker_memory: str | None = None  # --worker-memory, e.g. "8g" (default: from each node's memory)
    coordinator_memory: str | None = None
    host: str | None = None
    # the data set to serve, made (generated if needed) once everything else is checked: (log) -> Dataset
    dataset: Callable[[Callable[[str], None] | None], object] | None = None
    join: str | None = None  # the coordinator on another host (`tilewise join`): start only workers
    # what starts beside the deployment once it answers (cracking: layout.crack.start): (state, log);
    # when it fails, the deployment is stopped too
    background: Callable[[ClusterState, Callable[[str], None] | None], None] | None = None
    exchange: str | None = None  # --exchange: the transport between cooperating tiles (the spec's choices)


class Reporter:
    def message(self, text: str) -> None: ...  # progress lines


def start(cfg: Config, reporter: Reporter | None = None) -> dict:
    """Start the cluster (or join its workers to cfg.join); returns its status document with the
    start-up time and how to connect. Everything is checked before the first process starts."""
    check_name(cfg.name)
    allocators.get(cfg.allocator)
    spec = engines.get(cfg.engine)
    spec.check_allocator(cfg.allocator)
    if cfg.join and not spec.capabilities.join:
        raise UsageError(f"{spec.name} workers cannot join a cluster on another host",
                         f"use {' or '.join(s.name for s in engines.specs(lambda s: s.capabilities.join))}")
    cls = spec.runtime_class()
    join = cls.join_address(cfg.join) if cfg.join else None  # the engine's own syntax first, then the port
    if join:
        check_address(join)
    per_mb = _worker_mb(spec, cfg.worker_memory)
    coord_mb = _coordinator_mb(spec, cfg.coordinator_memory)
    exchange = spec.check_exchange(cfg.exchange)
    spec.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = spec.missing()
    if why:
        raise TilewiseError(f"{spec.title} cannot run here: {why}")
    t = topology.load(cfg.topology_src)
    p = cfg.plan(t)
    ensure_runnable(p)
    if per_mb:
        memory = {i.id: per_mb for i in p.instances}
    else:
        memory = cls.default_memory_mb(p, {n.id: n.memory_bytes for n in t.numa_nodes})
    log = reporter.message if reporter is not None else None
    dataset = cfg.dataset(log) if cfg.dataset is not None else None
    t0 = time.monotonic()
    st = up(p, engine=spec.name, name=cfg.name, allocator=cfg.allocator, worker_memory_mb=memory, join=join,
            host=cfg.host, dataset=dataset, log=log, coordinator_mb=coord_mb, exchange=exchange)
    try:  # all or nothing: until the caller has its status to say, a Ctrl-C or a failure stops it all
        if cfg.background is not None:
            cfg.background(st, log)  # what fails beside the deployment takes it down too
            st = load(cfg.name) or st
        doc = status(st)
        doc["startup_s"] = round(time.monotonic() - t0, 2)
        doc["connect"] = st.cluster().connect_hints(st)
    except BaseException:
        with signals.deferred():  # a second Ctrl-C cannot abort the clean-up half way
            down(st)
        raise
    return doc


def _worker_mb(spec: EngineSpec, text: str | None) -> int | None:
    """--worker-memory for the engine's memory knob, checked against its minimum (None: not given)."""
    if not text:
        return None
    knob = spec.capabilities.memory
    if knob is None:
        raise UsageError(f"--worker-memory sizes an engine's workers; {spec.name} has no memory setting",
                         "drop --worker-memory")
    return knob.parse(text, "--worker-memory")


def _coordinator_mb(spec: EngineSpec, text: str | None) -> int | None:
    if not text:
        return None
    knob = spec.capabilities.coordinator_memory
    if knob is None:
        owners = [s.title for s in engines.specs(lambda s: s.capabilities.coordinator_memory is not None)]
        raise UsageError(f"--coordinator-memory sizes the {' / '.join(owners)} coordinator", f"drop it for {spec.name}")
    return knob.parse(text, "--coordinator-memory")


def up(plan: Plan, *, engine: str, name: str, allocator: str, worker_memory_mb: dict[int, int] | None = None,
       join: str | None = None, host: str | None = None, dataset=None, log=None,
       coordinator_mb: int | None = None, exchange: str | None = None) -> ClusterState:
    """Start a detached, bound cluster (or, with join, only workers for a coordinator elsewhere) and
    record it. On any failure or interrupt: stop all, remove."""
    spec = engines.get(engine)
    engine = spec.name
    if join and not spec.capabilities.join:
        raise UsageError(f"{engine} workers cannot join a cluster on another host",
                         f"join works for {', '.join(s.name for s in engines.specs(lambda s: s.capabilities.join))}")
    spec.check_env()  # a bad TILEWISE_* value: usage (exit 2)
    why = spec.missing()
    if why:
        raise TilewiseError(f"{spec.title} cannot run here: {why}")
    cls = spec.runtime_class()
    h = host or (detect_host(join) if join else "127.0.0.1")
    with locked(name):
        old = load(name)
        if old is None and (left := unrecorded(name)):
            raise UsageError(f"cluster {name!r} has lost its state file, but {len(left)} of its processes still run "
                             f"(pids {', '.join(map(str, left[:8]))}): starting a second set beside them is refused",
                             f"stop them with `tilewise down --name {name}`")
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
        st = ClusterState(name, engine, new_token(), "starting", time.time(), str(root), plan.to_json(), h,
                          endpoint=None, joined=bool(join), data=record_of(dataset))
        save(st)  # recorded before anything starts: `down` can always clean up
        cl = cls(root, st.token, host=h, detach=True)
        cl.exchange = exchange
        # every process is journaled in a change session before it starts: if `up` itself is killed
        # half way, `tilewise restore` stops what it had started; on success the session is committed
        # (the cluster stays on purpose; `down` stops it from the state file)
        cl.journal = changes.Session(f"up {name}")

        def record(c: Runtime) -> None:
            st.take(c.record())
            save(st)

        cl.on_change = record
        try:
            cl.start(plan, dataset=dataset, allocator=allocator, memory_mb=worker_memory_mb, coordinator_mb=coordinator_mb,
                     join=join, log=log)
            st.state = "running"
            record(cl)
            cl.journal.commit()
            return st
        except BaseException:
            try:
                cl.stop()
            finally:
                remove(st)
                cl.journal.close()  # what cl.stop() reached is already stopped: this checks and releases
            raise


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
    data = dict(st.data)
    problems += data_problems(data)
    healthy = healthy and not problems
    doc = {"name": st.name, "engine": st.engine, "state": st.state, "endpoint": st.endpoint, "master_url": None,
           "joined": st.joined, "policy": st.plan.get("policy"), "created": st.created, "healthy": healthy,
           "problems": problems, "members": members, "data": data, "placement": st.placement,
           "state_file": str(state_path(st.name))}
    doc.update(cl.status_fields())  # the engine's own: Spark's master_url
    return doc


def data_problems(data: dict) -> list[str]:
    """What is wrong with the data a deployment serves, as its record says: files that are gone (a
    deleted data directory), and background work (cracking) recorded as running whose process is
    dead (its record in `data` is then marked so)."""
    out = []
    gone = [f for s in sources_of(data).values() for f in s.files if not os.path.exists(f)]
    if gone:
        out.append(f"{len(gone)} data file(s) are gone, e.g. {gone[0]}: queries on them fail")
    ck = data.get("crack")
    if isinstance(ck, dict) and ck.get("state") in ("starting", "running") and ck.get("pid"):
        if ck.get("start") is not None and not procs.ProcId(int(ck["pid"]), int(ck["start"])).alive():
            data["crack"] = dict(ck, state="dead")
            out.append(f"cracking (pid {ck['pid']}) died before it finished; its tables stay as they were "
                       f"(log: {ck.get('log') or '-'})")
    return out


def down(st: ClusterState) -> dict:
    with locked(st.name):
        stopped = st.cluster().stop()
        remove(st)
    return {"name": st.name, "engine": st.engine, "stopped_pids": sorted(set(stopped)), "left": []}


QUERY_GRACE_S = 2.0  # beyond --timeout, for the engine's own cancellation to come back


def query(st: ClusterState, sql: str, *, instance: int | None = None, timeout_s: float | None = None):
    """Run one SQL statement on a running cluster: (columns, rows, elapsed_s, instance). A replica
    engine runs it on a healthy instance unless one is named (a stopped or dead one is skipped);
    timeout_s bounds the whole call, whatever the engine does with it."""
    cl = st.cluster()
    if instance is None and engines.get(st.engine).capabilities.replicas:
        up = sorted(m["instance"] for m in cl.statuses() if m["role"] == "worker" and m["healthy"])
        if not up:
            raise TilewiseError(f"no instance of cluster {st.name!r} is healthy", f"see tilewise status --name {st.name}")
        instance = up[0]
    if timeout_s is None:
        try:
            r = cl.run_query(sql, instance=instance)
        finally:
            cl.close()
        return r.columns, r.rows, r.elapsed_s, r.instance
    done: dict = {}

    def run() -> None:
        try:
            done["result"] = cl.run_query(sql, instance=instance, timeout_s=timeout_s)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            done["error"] = e

    worker = threading.Thread(target=run, name="tilewise-query", daemon=True)
    worker.start()
    worker.join(timeout_s + QUERY_GRACE_S)
    if worker.is_alive():  # the engine did not come back (a stopped server): the call ends anyway
        raise TilewiseError(f"the query did not finish within {timeout_s:g} s (--timeout): "
                            f"{'instance ' + str(instance) if instance is not None else 'the cluster'} did not answer",
                            f"see tilewise status --name {st.name}")
    cl.close()
    if "error" in done:
        raise done["error"]
    r = done["result"]
    return r.columns, r.rows, r.elapsed_s, r.instance
