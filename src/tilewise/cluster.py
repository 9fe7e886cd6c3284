"""Long-running clusters (`tilewise up/status/down`): start, record, inspect, stop.

A cluster is recorded in a versioned JSON state file, ``<state dir>/<name>.json``, written
atomically (temp file, fsync, rename) BEFORE any process starts and again after each one, so a
crash or Ctrl-C in the middle of `up` can always be cleaned up by `down`: every process carries the
cluster's token in its environment and `down` kills whatever still carries it.

State dir: $TILEWISE_CLUSTER_DIR, else $XDG_RUNTIME_DIR/tilewise/clusters, else
~/.cache/tilewise/clusters. Logs and Spark work dirs live in ``<state dir>/<name>/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.fsutil import atomic_write_json
from tilewise import __version__
from tilewise.engines import spark_cluster as sc
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan

FORMAT = "tilewise-cluster/1"
ENGINES_UP = ("spark",)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def state_dir() -> Path:
    if os.environ.get("TILEWISE_CLUSTER_DIR"):
        return Path(os.environ["TILEWISE_CLUSTER_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "tilewise" / "clusters"
    return Path(os.path.expanduser("~")) / ".cache" / "tilewise" / "clusters"


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
    master_url: str | None = None
    joined: bool = False  # workers joined a master started elsewhere
    data: dict = field(default_factory=dict)  # {"sf":..., "dir":..., "tables": {...}} when --sf was given
    members: list[dict] = field(default_factory=list)
    version: str = __version__

    def to_json(self) -> dict:
        return {"format": FORMAT, "name": self.name, "engine": self.engine, "token": self.token, "state": self.state,
                "created": self.created, "root": self.root, "plan": self.plan, "host": self.host,
                "master_url": self.master_url, "joined": self.joined, "data": self.data,
                "members": self.members, "tilewise_version": self.version}

    @classmethod
    def from_json(cls, d: dict, path: Path) -> ClusterState:
        if d.get("format") != FORMAT:
            raise TilewiseError(f"{path} has unknown format {d.get('format')!r} (this tilewise reads {FORMAT})",
                                "stop that cluster with the tilewise version that started it")
        try:
            return cls(d["name"], d["engine"], d["token"], d["state"], float(d["created"]), d["root"], d["plan"],
                       d.get("host", "127.0.0.1"), d.get("master_url"), bool(d.get("joined")), d.get("data") or {},
                       list(d.get("members") or []), d.get("tilewise_version", "?"))
        except (KeyError, TypeError, ValueError) as e:
            raise TilewiseError(f"{path} is damaged ({e})", "remove it after checking no process is left") from None

    def cluster(self) -> sc.SparkCluster:
        members = [sc.Member.from_json(m) for m in self.members]
        return sc.SparkCluster(Path(self.root), self.token, host=self.host, detach=True, members=members,
                               master_url=self.master_url)


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
    return any(m.alive()[0] for m in st.cluster().members) or bool(sc.tagged_processes(st.token))


def detect_host(master_url: str) -> str:
    """The local address that reaches the master (what remote workers must advertise)."""
    m = re.fullmatch(r"spark://([^:/]+):(\d+)", master_url)
    if not m:
        raise UsageError(f"--join {master_url!r} is not a Spark master URL", "use spark://HOST:PORT")
    host, port = m.group(1), int(m.group(2))
    if host in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise UsageError(f"cannot reach {host}:{port} to join its master: {e.strerror or e}",
                         "check the address, or pass --host ADDR") from None


def up(plan: Plan, *, engine: str, name: str, allocator: str, worker_memory_mb: dict[int, int],
       join: str | None = None, host: str | None = None, data: dict | None = None, log=None) -> ClusterState:
    """Start a detached, bound cluster and record it. On any failure or interrupt: stop all, remove."""
    if engine not in ENGINES_UP:
        raise UsageError(f"`tilewise up` supports {', '.join(ENGINES_UP)}, not {engine!r}",
                         "duckdb is embedded (no server to keep running): run your program bound with "
                         "`tilewise exec --policy P --instance I -- CMD`, or benchmark it with `tilewise bench tpch --engine duckdb`")
    sc.spark_home()
    if join:
        h = host or detect_host(join)
    else:
        h = host or "127.0.0.1"
    with locked(name):
        old = load(name)
        if old is not None:
            if is_alive(old):
                raise UsageError(f"cluster {name!r} is already running (master {old.master_url})",
                                 f"stop it with `tilewise down --name {name}` or pick another --name")
            if log:
                log(f"cluster {name!r} was recorded but is no longer running: cleaning up its state")
            old.cluster().stop()
            remove(old)
        root = state_dir() / name
        shutil.rmtree(root, ignore_errors=True)
        st = ClusterState(name, engine, sc.new_token(), "starting", time.time(), str(root), plan.to_json(), h,
                          master_url=join, joined=bool(join), data=data or {})
        save(st)  # recorded before anything starts: `down` can always clean up
        cl = sc.SparkCluster(root, st.token, host=h, detach=True, master_url=join)

        def record(c: sc.SparkCluster) -> None:
            st.members = [m.to_json() for m in c.members]
            st.master_url = c.master_url
            save(st)

        cl.on_change = record
        try:
            if not join:
                cl.start_master(wait=False)
                if log:
                    log(f"master starting at {cl.master_url}")
            for inst in plan.instances:
                m = cl.start_worker(inst, worker_memory_mb[inst.id], allocator=allocator)
                if log:
                    log(f"worker {inst.id} started: pid {m.pid}, {m.binding.describe()}, {m.memory_mb} MiB")
            if not join:
                cl.wait_master()
            cl.wait_workers()
            st.state = "running"
            record(cl)
            return st
        except BaseException:
            try:
                cl.stop()
            finally:
                remove(st)
            raise


def status(st: ClusterState) -> dict:
    cl = st.cluster()
    members = [cl.member_status(m) for m in cl.members]
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
    return {"name": st.name, "engine": st.engine, "state": st.state, "master_url": st.master_url,
            "joined": st.joined, "policy": st.plan.get("policy"), "created": st.created, "healthy": healthy,
            "problems": problems, "members": members, "data": st.data, "state_file": str(state_path(st.name))}


def down(st: ClusterState) -> dict:
    with locked(st.name):
        cl = st.cluster()
        pids = [m.pid for m in cl.members if m.alive()[0]]
        swept = cl.stop()
        remove(st)
    return {"name": st.name, "stopped_pids": sorted(set(pids) | set(swept)), "left": []}
