"""A Spark standalone cluster made of bound processes: one master, one worker per plan instance.

Used by the Spark engine (bench, workers die with tilewise) and by `tilewise up` (detached: the
cluster outlives the command, its processes are recorded in a state file, see tilewise.cluster).

Every process started here (master, workers, the executors the workers fork, the driver) carries
``TILEWISE_CLUSTER_TOKEN=<token>`` in its environment (executors inherit the worker's environment).
Stopping (procgroup.ProcessCluster.stop, through procs.stop) reaches every member's tree and every
live process carrying the token, so nothing is orphaned even when a worker crashed and left its
executor behind, or when the process that started the cluster is long gone.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

from tilewise import verification
from tilewise.binding import Binding
from tilewise.engines.procgroup import (  # noqa: F401 - re-exported: the cluster API predates procgroup
    MEMORY_CAP_MB, MEMORY_FRACTION, MEMORY_MIN_MB, START_TIMEOUT_S, TOKEN_VAR, Member, ProcessCluster,
    free_port, log_tail, new_token, parse_size_mb, tagged_processes, worker_memory_mb)
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"

_MASTER_URL_RE = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED_RE = re.compile(r"Successfully registered with master (spark://\S+)")


class SparkError(TilewiseError):
    pass



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


class SparkCluster(ProcessCluster):
    """Start/inspect/stop a master and bound workers. `detach`: processes outlive this Python."""

    engine = "spark"
    error_cls = SparkError

    def __init__(self, root: Path, token: str, *, host: str = "127.0.0.1", detach: bool = False,
                 members: list[Member] | None = None, master_url: str | None = None,
                 endpoint: str | None = None) -> None:
        super().__init__(root, token, host=host, detach=detach, members=members, endpoint=endpoint or master_url)
        self.placement = None

    @property
    def master_url(self) -> str | None:
        return self.endpoint

    @master_url.setter
    def master_url(self, url: str | None) -> None:
        self.endpoint = url

    @classmethod
    def check_installed(cls) -> None:
        spark_home()

    @staticmethod
    def join_url(address: str) -> str:
        """HOST:PORT (or spark://HOST:PORT) -> the master URL workers register with."""
        m = re.fullmatch(r"(?:spark://)?([^:/]+):(\d+)", address or "")
        if not m:
            raise UsageError(f"{address!r} is not a Spark master address", "use spark://HOST:PORT or HOST:PORT")
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

    # -- the cluster interface (tilewise up / join) --
    def start(self, plan: Plan, *, memory_mb: dict[int, int], allocator: str = "system", join: str | None = None,
              dataset=None, log=None) -> None:
        from tilewise import nic

        if not join:
            self.placement = nic.place_coordinator(plan, *nic.detect(self.host))
            inst = self.placement.coordinator
            self.start_master(wait=False, binding=Binding.from_instance(inst, allocator) if inst else None)
            if log:
                log(f"master starting at {self.master_url}")
            nic_node = self.placement.nic_node
        else:
            self.master_url = self.join_url(join)
            nic_node = nic.detect(self.master_url.split("//", 1)[1].split(":")[0])[1]
        by_id = {i.id: i for i in plan.instances}
        for inst in (by_id[k] for k in nic.nic_local_first(plan, nic_node)):
            m = self.start_worker(inst, memory_mb[inst.id], allocator=allocator)
            if log:
                log(f"worker {inst.id} started: pid {m.pid}, {m.binding.describe()}, {m.memory_mb} MiB")
        if not join:
            self.wait_master()
        self.wait_workers()

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
            f"workers on other hosts: tilewise join --engine spark --coordinator <this host>:{port} --policy P "
            "(start this master with --host <routable address> for that)",
        ]
        if state.data:
            lines.append(f"{state.data.get('label', 'data')}: spark.read.parquet('{state.data['dir']}/lineitem.parquet') "
                         "(and the 7 others)")
        return lines

    def start_master(self, timeout: float = START_TIMEOUT_S, *, wait: bool = True,
                     binding: Binding | None = None) -> str:
        """Start the master on a free loopback port; wait=False returns at once (check with wait_master)."""
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

    # -- inspection --
    def master(self) -> Member | None:
        return self.member("master")

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
