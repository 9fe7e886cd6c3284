"""A group of bound server processes that make up one engine cluster (Spark, Trino, DuckDB servers).

The common part of every cluster engine, used both by the engines (bench: the processes die with
tilewise) and by `tilewise up/join` (detached: they outlive the command and are recorded in a state
file, see tilewise.cluster):

- every process is started through the process edge (launch.spawn: bound before exec, own session)
  and recorded as a Member (role, instance, pid + start time, binding, log);
- every process carries ``TILEWISE_CLUSTER_TOKEN=<token>`` in its environment (inherited by what it
  forks: Spark executors, JVM helpers); stopping goes through procs.stop: each member's tree (by
  pid + start time, its group, descendants and spawn token) plus every process carrying the cluster
  token, checked, so nothing is orphaned even when the process that started the cluster is gone;
- the small interface tilewise.cluster drives for every engine: ``start(plan, ...)``,
  ``member_status(m)``, ``stop()``, ``endpoint``, ``connect_hints(state)``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist, launch, procs, verification
from tilewise.binding import Binding
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan
from tilewise.procs import ProcId

TOKEN_VAR = "TILEWISE_CLUSTER_TOKEN"
# worker memory: this share of the memory of the instance's NUMA node(s) (split between the
# instances on the same node), capped below 32 GiB (compressed oops), at least 512 MiB
MEMORY_FRACTION = 0.5
MEMORY_CAP_MB = 31 * 1024
MEMORY_MIN_MB = 512
START_TIMEOUT_S = 90.0


class ClusterError(TilewiseError):
    pass


def new_token() -> str:
    return uuid.uuid4().hex


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_size_mb(text: str, what: str = "--worker-memory", minimum_mb: int = MEMORY_MIN_MB) -> int:
    """'4g', '512m', '2GB', '1.5G' -> MiB (a bare number is MiB, as Spark reads it)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        raise UsageError(f"{what}: cannot read size {text!r}", "use e.g. 4g or 512m")
    val = float(m.group(1)) * {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2)]
    mb = int(val)
    if mb < minimum_mb:
        raise UsageError(f"{what}: {text} is below the {minimum_mb} MiB a worker needs", "use e.g. 2g")
    return mb


def worker_memory_mb(plan: Plan, node_memory: dict[int, int], *, fraction: float = MEMORY_FRACTION,
                     cap_mb: int = MEMORY_CAP_MB, min_mb: int = MEMORY_MIN_MB) -> dict[int, int]:
    """Memory per worker (MiB): `fraction` of its NUMA nodes' memory, split between the instances
    sharing a node, capped at cap_mb. node_memory: node id -> bytes (0 = unknown: 4 GiB assumed)."""
    if not 0 < fraction <= 1:
        raise UsageError(f"memory fraction must be in (0, 1], got {fraction}")
    users: dict[int, int] = {}
    for inst in plan.instances:
        for n in inst_nodes(inst):
            users[n] = users.get(n, 0) + 1
    out = {}
    for inst in plan.instances:
        total = 0.0
        for n in inst_nodes(inst):
            mem = node_memory.get(n) or 4 * 1024 ** 3
            total += mem / users[n]
        mb = int(total * fraction / (1024 * 1024))
        out[inst.id] = max(min_mb, min(cap_mb, mb))
    return out


def inst_nodes(inst: Instance) -> tuple[int, ...]:
    """The NUMA nodes whose memory an instance uses."""
    if inst.mem_policy in ("membind", "interleave", "preferred") and inst.mem_nodes:
        return tuple(inst.mem_nodes)
    return tuple(inst.numa_nodes) or (0,)


# ---- processes -------------------------------------------------------------------------------

@dataclass
class Member:
    """One process of the cluster, as recorded (also in the state file)."""

    role: str  # master | worker | driver | coordinator | server
    instance: int | None
    pid: int
    create_time: float
    binding: Binding
    log: str
    cores: int = 0
    memory_mb: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    extra: dict = field(default_factory=dict)  # engine specifics: ports, node ids, socket paths
    start: int | None = None  # /proc/PID/stat start time (clock ticks): with pid, names the process
    token: str | None = None  # the spawn token its descendants carry (procs.SPAWN_VAR)

    def to_json(self) -> dict:
        d = {"role": self.role, "instance": self.instance, "pid": self.pid, "create_time": self.create_time,
             "start": self.start, "token": self.token,
             "binding": self.binding.to_json(), "log": self.log, "cores": self.cores, "memory_mb": self.memory_mb}
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Member:
        b = d["binding"]
        binding = Binding(tuple(b["cpus"]) if b.get("cpus") is not None else None, b.get("mem_policy", "first-touch"),
                          tuple(b.get("mem_nodes", ())), b.get("allocator", "system"))
        return cls(d["role"], d.get("instance"), int(d["pid"]), float(d["create_time"]), binding, d.get("log", ""),
                   int(d.get("cores", 0)), int(d.get("memory_mb", 0)), extra=dict(d.get("extra") or {}),
                   start=_start_of(d), token=d.get("token"))

    def tree(self) -> procs.Tree:
        """What stopping this member must reach: its group, its descendants, its token's carriers."""
        leader = ProcId(self.pid, self.start) if self.start is not None else None
        return procs.Tree(leader, self.token, popen=self.proc)

    @property
    def label(self) -> str:
        return self.role if self.instance is None else f"{self.role} {self.instance}"

    def alive(self) -> tuple[bool, str]:
        """(alive, why not). Uses the Popen when we own it (reaps it), else pid + start time."""
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                return False, f"exited with {rc_text(rc)}"
        if self.start is None:  # an old record (no start time) whose process was gone when loaded
            return False, "exited (its pid now belongs to another process)" if procs.stat(self.pid) else "exited"
        st = procs.stat(self.pid)
        if st is None:
            return False, "exited"
        if st.start != self.start:
            return False, "exited (its pid now belongs to another process)"
        return (False, "exited (zombie)") if st.state in "ZX" else (True, "")


def rc_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def create_time(pid: int) -> float:
    """Wall-clock start time (seconds since the epoch), still written to state files for older
    readers; tilewise itself names a process by pid + start time (procs.ProcId)."""
    ident = procs.ProcId.of(pid)
    return (ident.wall_clock() if ident else None) or 0.0


def _start_of(d: dict) -> int | None:
    """A member record's start time; records from before start times were kept have only
    create_time, upgraded here (None: that process is gone)."""
    ident = procs.ProcId.recorded(int(d["pid"]), d.get("start"), d.get("create_time"))
    return ident.start if ident else None


def log_tail(path: str, n: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f.readlines()[-200:] if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not ln.lstrip().startswith("at ")]  # no Java stack frames
    # prefer error lines
    errs = [ln for ln in lines if "ERROR" in ln or "Exception" in ln or "Error" in ln]
    pick = (errs or lines)[-n:]
    return " | ".join(pick)[-600:]


def tagged_processes(token: str, var: str = TOKEN_VAR) -> list:
    """Live (non-zombie) processes whose environment has var=token (by default: the cluster token)."""
    import psutil

    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(var) == token and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


class ProcessCluster:
    """Start/inspect/stop the bound processes of one cluster. `detach`: processes outlive this Python.

    Subclasses (one per engine) implement start(), and may extend env(), member_status() and
    connect_hints(); STOP_ORDER says which roles are stopped first."""

    engine = "engine"
    STOP_ORDER: dict[str, int] = {"driver": 0, "worker": 1, "server": 1, "coordinator": 2, "master": 2}
    error_cls: type[TilewiseError] = ClusterError

    def __init__(self, root: Path, token: str, *, host: str = "127.0.0.1", detach: bool = False,
                 members: list[Member] | None = None, endpoint: str | None = None) -> None:
        self.root = Path(root)
        self.token = token
        self.host = host
        self.detach = detach
        self.members: list[Member] = list(members or [])
        self.endpoint = endpoint
        self.on_change = None  # callback after each member starts (the state file is rewritten)

    # -- the interface tilewise.cluster drives --
    @classmethod
    def check_installed(cls) -> None:
        """Raise a TilewiseError saying what to install when the engine cannot run here."""

    @classmethod
    def default_memory_mb(cls, plan: Plan, node_memory: dict[int, int]) -> dict[int, int]:
        return worker_memory_mb(plan, node_memory)

    def start(self, plan: Plan, *, memory_mb: dict[int, int], allocator: str = "system", join: str | None = None,
              dataset=None, log=None) -> None:
        raise NotImplementedError

    def connect_hints(self, state) -> list[str]:
        return []

    # -- processes --
    def env(self) -> dict:
        env = dict(os.environ)
        env[TOKEN_VAR] = self.token
        return env

    def _spawn(self, role: str, instance: int | None, argv: list[str], b: Binding, *, cores=0, memory_mb=0,
               env: dict | None = None, extra: dict | None = None, log_name: str | None = None,
               **popen_kwargs) -> Member:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        name = log_name or (role if instance is None else f"{role}-{instance}")
        log = self.root / "logs" / f"{name}.log"
        with open(log, "ab") as fh:
            proc = launch.spawn(argv, b, env=env or self.env(), die_with_parent=not self.detach,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, **popen_kwargs)
        m = Member(role, instance, proc.pid, create_time(proc.pid), b, str(log), cores, memory_mb, proc,
                   dict(extra or {}), start=proc.ident.start, token=proc.token)
        self.members.append(m)
        if self.on_change:
            self.on_change(self)
        return m

    def _verify_started(self, m: Member) -> None:
        v = verification.verify(m.pid, m.binding)
        if not v.ok:
            raise launch.LaunchError(f"{self.engine} {m.label}: binding not applied: " + "; ".join(v.problems))

    def wait_log(self, m: Member, pattern: re.Pattern, timeout: float, what: str) -> str:
        """Wait until the member's log matches pattern (returns group 1, or the match); fail at once
        when it or any other member dies, or after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(m.log, errors="replace") as f:
                    hit = pattern.search(f.read())
                if hit:
                    return hit.group(1) if pattern.groups else hit.group(0)
            except OSError:
                pass
            ok, why = m.alive()
            if not ok:
                raise self.error_cls(f"{self.engine} {m.label} (pid {m.pid}) {why} before it could {what}: "
                                     f"{log_tail(m.log)}", f"full log: {m.log}")
            self.check_alive(what)
            if time.monotonic() > deadline:
                raise self.error_cls(f"{self.engine} {m.label} (pid {m.pid}) did not {what} within {timeout:.0f} s: "
                                     f"{log_tail(m.log)}", f"full log: {m.log}")
            time.sleep(0.1)

    # -- inspection --
    def workers(self) -> list[Member]:
        return [m for m in self.members if m.role == "worker"]

    def member(self, role: str) -> Member | None:
        return next((m for m in self.members if m.role == role), None)

    def dead(self) -> list[tuple[Member, str]]:
        out = []
        for m in self.members:
            ok, why = m.alive()
            if not ok:
                out.append((m, why))
        return out

    def check_alive(self, what: str) -> None:
        """Raise when any member died (a cluster with a dead member gives no valid results)."""
        bad = self.dead()
        if bad:
            m, why = bad[0]
            raise self.error_cls(f"{self.engine} {m.label} (pid {m.pid}) {why} while trying to {what}: "
                                 f"{log_tail(m.log)}", f"log: {m.log}")

    def member_status(self, m: Member) -> dict:
        """pid, binding read back from /proc, health."""
        ok, why = m.alive()
        d = {"role": m.role, "instance": m.instance, "pid": m.pid, "alive": ok, "healthy": ok, "detail": why,
             "cpus": cpulist.format(m.binding.cpus) if m.binding.cpus is not None else "any",
             "mem_policy": m.binding.mem_policy, "mem_nodes": list(m.binding.mem_nodes),
             "cores": m.cores, "memory_mb": m.memory_mb, "log": m.log,
             "binding_verified": None, "verification": None, "executors": []}
        if not ok:
            tail = log_tail(m.log, 2)
            d["detail"] = f"{why}; last log lines: {tail}" if tail else why
            return d
        v = verification.verify(m.pid, m.binding, allocator_wait_s=0.0)
        d["verification"] = v.to_json()
        d["binding_verified"] = v.verdict  # True verified, False mismatch, None not checkable
        if not v.verified:
            d["detail"] = v.summary()
        return d

    def statuses(self) -> list[dict]:
        return [self.member_status(m) for m in self.members]

    @staticmethod
    def _unhealthy(d: dict, why: str) -> None:
        d["healthy"] = False
        d["detail"] = (d["detail"] + "; " if d["detail"] else "") + why

    # -- stopping --
    def stop(self, timeout: float = 10.0) -> list[int]:
        """Stop every member's whole tree and every process carrying the cluster token (children a
        crashed member left behind included): SIGTERM, `timeout`, SIGKILL, then check (procs.stop).
        Idempotent. Returns the pids stopped; raises if any process survived."""
        trees = [m.tree() for m in sorted(self.members, key=lambda m: self.STOP_ORDER.get(m.role, 3))]
        trees.append(procs.Tree(None, self.token, TOKEN_VAR))
        rep = procs.stop(trees, grace=timeout)
        if not rep.ok:
            raise self.error_cls(f"could not stop processes of the cluster: {rep.summary()}",
                                 "kill them by pid (are you the same user?)")
        return [p["pid"] for p in rep.stopped]
