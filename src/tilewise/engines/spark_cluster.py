"""A Spark standalone cluster made of bound processes: one master, one worker per plan instance.

Used by the Spark engine (bench, workers die with tilewise) and by `tilewise up` (detached: the
cluster outlives the command, its processes are recorded in a state file, see tilewise.cluster).

Every process started here (master, workers, the executors the workers fork, the driver) carries
``TILEWISE_CLUSTER_TOKEN=<token>`` in its environment (executors inherit the worker's environment).
Stopping kills the recorded process groups, then sweeps every live process carrying the token, so
nothing is orphaned even when a worker crashed and left its executor behind, or when the process
that started the cluster is long gone.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist, launch, procs
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan
from tilewise.procs import ProcId

TOKEN_VAR = "TILEWISE_CLUSTER_TOKEN"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
# worker memory: this share of the memory of the instance's NUMA node(s) (split between the
# instances on the same node), capped below 32 GiB (compressed oops), at least 512 MiB
MEMORY_FRACTION = 0.5
MEMORY_CAP_MB = 31 * 1024
MEMORY_MIN_MB = 512
START_TIMEOUT_S = 90.0

_MASTER_URL_RE = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED_RE = re.compile(r"Successfully registered with master (spark://\S+)")


class SparkError(TilewiseError):
    pass


def new_token() -> str:
    return uuid.uuid4().hex


def spark_home() -> Path:
    """The pyspark installation (it ships bin/spark-class and the jars); checks java too."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkError("pyspark is not installed", "install it with `pip install pyspark` (make setup does)")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise SparkError(f"pyspark at {home} has no bin/spark-class or jars/", "reinstall pyspark from PyPI")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise SparkError("no Java runtime found (java not on PATH, JAVA_HOME unset)",
                         "install one: apt-get install openjdk-17-jre-headless (scripts/setup-system.sh)")
    return home


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_size_mb(text: str, what: str = "--worker-memory") -> int:
    """'4g', '512m', '2GB', '1.5G' -> MiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        raise UsageError(f"{what}: cannot read size {text!r}", "use e.g. 4g or 512m")
    # a bare number is MiB, as Spark reads it
    val = float(m.group(1)) * {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2)]
    mb = int(val)
    if mb < MEMORY_MIN_MB:
        raise UsageError(f"{what}: {text} is below the {MEMORY_MIN_MB} MiB a Spark worker needs", "use e.g. 2g")
    return mb


def worker_memory_mb(plan: Plan, node_memory: dict[int, int], *, fraction: float = MEMORY_FRACTION,
                     cap_mb: int = MEMORY_CAP_MB) -> dict[int, int]:
    """Memory per worker (MiB): `fraction` of its NUMA nodes' memory, split between the instances
    sharing a node, capped at cap_mb. node_memory: node id -> bytes (0 = unknown: 4 GiB assumed)."""
    if not 0 < fraction <= 1:
        raise UsageError(f"memory fraction must be in (0, 1], got {fraction}")
    users: dict[int, int] = {}
    for inst in plan.instances:
        for n in _inst_nodes(inst):
            users[n] = users.get(n, 0) + 1
    out = {}
    for inst in plan.instances:
        total = 0.0
        for n in _inst_nodes(inst):
            mem = node_memory.get(n) or 4 * 1024 ** 3
            total += mem / users[n]
        mb = int(total * fraction / (1024 * 1024))
        out[inst.id] = max(MEMORY_MIN_MB, min(cap_mb, mb))
    return out


def _inst_nodes(inst: Instance) -> tuple[int, ...]:
    if inst.mem_policy in ("membind", "interleave", "preferred") and inst.mem_nodes:
        return tuple(inst.mem_nodes)
    return tuple(inst.numa_nodes) or (0,)


# ---- processes -------------------------------------------------------------------------------

@dataclass
class Member:
    """One process of the cluster, as recorded (also in the state file)."""

    role: str  # master | worker | driver
    instance: int | None
    pid: int
    create_time: float
    binding: launch.Binding
    log: str
    cores: int = 0
    memory_mb: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    start: int | None = None  # /proc/PID/stat start time (clock ticks): with pid, names the process
    token: str | None = None  # the spawn token its descendants carry (launch.SPAWN_VAR)

    def to_json(self) -> dict:
        return {"role": self.role, "instance": self.instance, "pid": self.pid, "create_time": self.create_time,
                "start": self.start, "token": self.token,
                "binding": self.binding.to_json(), "log": self.log, "cores": self.cores, "memory_mb": self.memory_mb}

    @classmethod
    def from_json(cls, d: dict) -> Member:
        b = d["binding"]
        binding = launch.Binding(tuple(b["cpus"]) if b.get("cpus") is not None else None, b.get("mem_policy", "first-touch"),
                                 tuple(b.get("mem_nodes", ())), b.get("allocator", "system"))
        return cls(d["role"], d.get("instance"), int(d["pid"]), float(d["create_time"]), binding, d.get("log", ""),
                   int(d.get("cores", 0)), int(d.get("memory_mb", 0)),
                   start=int(d["start"]) if d.get("start") is not None else None, token=d.get("token"))

    def tree(self) -> launch.Tree:
        """What stopping this member must reach: its group, its descendants, its token's carriers."""
        leader = ProcId(self.pid, self.start) if self.start is not None else None
        return launch.Tree(leader, self.token, popen=self.proc)

    def alive(self) -> tuple[bool, str]:
        """(alive, why not). Uses the Popen when we own it (reaps it), else pid + start time."""
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                return False, f"exited with {_rc_text(rc)}"
        if self.start is not None:
            st = procs.stat(self.pid)
            if st is None:
                return False, "exited"
            if st.start != self.start:
                return False, "exited (its pid now belongs to another process)"
            return (False, "exited (zombie)") if st.state in "ZX" else (True, "")
        import psutil

        try:
            p = psutil.Process(self.pid)
            if abs(p.create_time() - self.create_time) > 1.0:
                return False, "exited (its pid now belongs to another process)"
            if p.status() == psutil.STATUS_ZOMBIE:
                return False, "exited (zombie)"
            return True, ""
        except psutil.NoSuchProcess:
            return False, "exited"
        except psutil.AccessDenied:
            return True, ""


def _rc_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def _create_time(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


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


def tagged_processes(token: str) -> list:
    """Live (non-zombie) processes whose environment carries the cluster token."""
    import psutil

    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(TOKEN_VAR) == token and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def executors_of(pid: int) -> list[int]:
    """Executor JVMs forked by a worker (its descendants running CoarseGrainedExecutorBackend)."""
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:
            if any(EXECUTOR_CLASS in a for a in k.cmdline()):
                out.append(k.pid)
        except psutil.Error:
            continue
    return out


class SparkCluster:
    """Start/inspect/stop a master and bound workers. `detach`: processes outlive this Python."""

    def __init__(self, root: Path, token: str, *, host: str = "127.0.0.1", detach: bool = False,
                 members: list[Member] | None = None, master_url: str | None = None) -> None:
        self.root = Path(root)
        self.token = token
        self.host = host
        self.detach = detach
        self.members: list[Member] = list(members or [])
        self.master_url = master_url
        self.on_change = None  # callback after each member starts (the state file is rewritten)

    # -- environment --
    def env(self) -> dict:
        home = spark_home()
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            TOKEN_VAR: self.token,
        })
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _spawn(self, role: str, instance: int | None, argv: list[str], b: launch.Binding, *, cores=0, memory_mb=0,
               **popen_kwargs) -> Member:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "local").mkdir(parents=True, exist_ok=True)
        name = role if instance is None else f"{role}-{instance}"
        log = self.root / "logs" / f"{name}.log"
        with open(log, "ab") as fh:
            proc = launch.spawn(argv, b, env=self.env(), die_with_parent=not self.detach,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, **popen_kwargs)
        m = Member(role, instance, proc.pid, _create_time(proc.pid), b, str(log), cores, memory_mb, proc,
                   start=proc.ident.start, token=proc.token)
        self.members.append(m)
        if self.on_change:
            self.on_change(self)
        return m

    def start_master(self, timeout: float = START_TIMEOUT_S, *, wait: bool = True) -> str:
        """Start the master on a free loopback port; wait=False returns at once (check with wait_master)."""
        home = spark_home()
        port = free_port(self.host)
        argv = [str(home / "bin" / "spark-class"), MASTER_CLASS, "--host", self.host, "--port", str(port),
                "--webui-port", "0"]
        self.master_url = f"spark://{self.host}:{port}"
        self._spawn("master", None, argv, launch.Binding(None))
        if wait:
            self.wait_master(timeout)
        return self.master_url

    def wait_master(self, timeout: float = START_TIMEOUT_S) -> None:
        m = self.master()
        url = self._wait_log(m, _MASTER_URL_RE, timeout, "start")
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
        b = launch.Binding.from_instance(inst, allocator)
        argv = [str(home / "bin" / "spark-class"), WORKER_CLASS, url, "--cores", str(len(inst.cpus)),
                "--memory", f"{memory_mb}m", "--work-dir", str(wdir), "--host", self.host, "--webui-port", "0"]
        m = self._spawn("worker", inst.id, argv, b, cores=len(inst.cpus), memory_mb=memory_mb)
        v = launch.verify(m.pid, b)
        if not v.ok:
            raise launch.LaunchError(f"spark worker {inst.id}: binding not applied: " + "; ".join(v.problems))
        return m

    def wait_workers(self, timeout: float = START_TIMEOUT_S) -> None:
        for m in self.workers():
            self._wait_log(m, _REGISTERED_RE, timeout, "register with the master")

    def _wait_log(self, m: Member, pattern: re.Pattern, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        name = m.role if m.instance is None else f"{m.role} {m.instance}"
        while True:
            try:
                with open(m.log, errors="replace") as f:
                    hit = pattern.search(f.read())
                if hit:
                    return hit.group(1)
            except OSError:
                pass
            ok, why = m.alive()
            if not ok:
                raise SparkError(f"spark {name} (pid {m.pid}) {why} before it could {what}: {log_tail(m.log)}",
                                 f"full log: {m.log}")
            bad = self.dead()
            if bad:
                raise SparkError(f"spark {bad[0][0].role} (pid {bad[0][0].pid}) {bad[0][1]}: {log_tail(bad[0][0].log)}")
            if time.monotonic() > deadline:
                raise SparkError(f"spark {name} (pid {m.pid}) did not {what} within {timeout:.0f} s: {log_tail(m.log)}",
                                 f"full log: {m.log}")
            time.sleep(0.1)

    # -- inspection --
    def workers(self) -> list[Member]:
        return [m for m in self.members if m.role == "worker"]

    def master(self) -> Member | None:
        return next((m for m in self.members if m.role == "master"), None)

    def dead(self) -> list[tuple[Member, str]]:
        out = []
        for m in self.members:
            ok, why = m.alive()
            if not ok:
                out.append((m, why))
        return out

    def member_status(self, m: Member) -> dict:
        """pid, binding read back from /proc, health, executors (verified too)."""
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
        v = launch.verify(m.pid, m.binding, allocator_wait_s=0.0)
        d["verification"] = v.to_json()
        d["binding_verified"] = v.verdict  # True verified, False mismatch, None not checkable
        if not v.verified:
            d["detail"] = v.summary()
        if m.role == "worker":
            registered = False
            try:
                with open(m.log, errors="replace") as f:
                    registered = bool(_REGISTERED_RE.search(f.read()))
            except OSError:
                pass
            if not registered:
                d["healthy"] = False
                d["detail"] = (d["detail"] + "; " if d["detail"] else "") + "not registered with the master"
            for epid in executors_of(m.pid):
                ev = launch.verify(epid, m.binding, allocator_wait_s=0.0)
                d["executors"].append({"pid": epid, "binding_verified": ev.verdict, "verification": ev.state,
                                       "problems": ev.problems})
                if ev.verdict is False:
                    d["binding_verified"] = False
                elif ev.verdict is None and d["binding_verified"]:
                    d["binding_verified"] = None
        return d

    # -- stopping --
    def stop(self, timeout: float = 10.0) -> list[int]:
        """Stop every member's whole tree and every process carrying the cluster token (executors a
        crashed worker left behind included): SIGTERM, `timeout`, SIGKILL, then check. Idempotent.
        Returns the pids stopped; raises if any process survived."""
        trees = [m.tree() for m in self.members]
        trees.append(launch.Tree(None, self.token, TOKEN_VAR))
        rep = launch.stop(trees, grace=timeout)
        if not rep.ok:
            raise SparkError(f"could not stop processes of the cluster: {rep.summary()}",
                             "kill them by pid (are you the same user?)")
        return [p["pid"] for p in rep.stopped]
