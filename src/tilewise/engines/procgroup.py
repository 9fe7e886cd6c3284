"""The process group under every built-in engine runtime: bound processes that make up one deployment.

One class, used both by the benchmarks (the processes die with tilewise, in a temporary directory)
and by `tilewise up/join` (detached: they outlive the command and are recorded in a state file,
see tilewise.cluster, and later commands rebuild the runtime from it):

- every process is started through the process edge (launch.spawn: bound before exec, own session,
  journaled first in a change session so `tilewise restore` stops what a killed tilewise left) and
  recorded as a Member (role, instance, pid + start time, binding, log);
- every process carries ``TILEWISE_CLUSTER_TOKEN=<token>`` in its environment (inherited by what it
  forks: Spark executors, JVM helpers); stopping goes through procs.stop: each member's tree (by
  pid + start time, its group, descendants and spawn token) plus every process carrying the cluster
  token, checked, so nothing is orphaned even when the process that started the cluster is gone;
- status: every member's binding read back from /proc (verification.verify), health, the engine's own
  checks (member_status), and per plan instance for the harness (status()).

An engine's runtime subclasses it (engines/<name>/): start() spawns its processes, run_query()
talks to them; connect_hints() says how users reach a detached deployment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tilewise import changes, dirs, fsutil, launch, procs, verification
from tilewise.binding import Binding, ensure_runnable
from tilewise.data import record_of
from tilewise.engines.contract import (CLUSTER_VAR, TOKEN_VAR, InstanceStatus, Runtime, instance_statuses,
                                      process_status)
from tilewise.engines.memory import live_node_memory
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Plan
from tilewise.procs import ProcId

START_TIMEOUT_S = 90.0


class ClusterError(TilewiseError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on host now (an IPv4 or IPv6 address, or a name resolving to one); OSError when
    this machine cannot listen on host at all."""
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM):
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr)
                return s.getsockname()[1]
        except OSError as e:
            last = e
    raise last or OSError(f"no address for {host}")


def check_bindable(host: str, option: str = "--host") -> None:
    """UsageError unless this machine can listen on host (free_port finds a port there): checked
    before anything starts."""
    try:
        free_port(host)
    except socket.gaierror as e:
        raise UsageError(f"{option} {host}: cannot resolve it ({e.strerror or e})",
                         "give an address of this machine, e.g. 127.0.0.1") from None
    except OSError as e:
        raise UsageError(f"{option} {host}: this machine cannot listen there ({e.strerror or e})",
                         "give an address of one of its interfaces, e.g. 127.0.0.1") from None


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

    def how_it_ended(self, wait_s: float = 2.0) -> str:
        """'was killed by SIGKILL', 'exited with status 1' (waits for an owned process to end)."""
        if self.proc is None:
            ok, why = self.alive()
            return "is still running" if ok else why
        try:
            rc = self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}"


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
    """Live (non-zombie) processes whose environment carries var=token (by default: the cluster
    token), found by procs.carrying, as psutil processes for their callers' reports."""
    import psutil

    found = []
    for pid in sorted(procs.carrying(var, [token], procs.scan())[token]):
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


class ProcessCluster(Runtime):
    """Start/inspect/stop the bound processes of one deployment. `detach`: processes outlive this
    Python (tilewise up); otherwise they die with it and live in a temporary directory (root=None)
    that stop() removes.

    Subclasses (one per engine) implement start() and run_query(), and may extend env(),
    member_status(), instance_extra(), info(), close() and connect_hints(); STOP_ORDER says which
    roles are stopped first."""

    STOP_ORDER: ClassVar[dict[str, int]] = {"driver": 0, "worker": 1, "server": 1, "coordinator": 2, "master": 2}
    error_cls: ClassVar[type[TilewiseError]] = ClusterError

    def __init__(self, root: Path | None = None, token: str | None = None, *, host: str = "127.0.0.1",
                 detach: bool = False) -> None:
        super().__init__(root, token, host=host, detach=detach)
        self._own_root = root is None
        self.members: list[Member] = []
        self.keep_logs = False  # keep a temporary working directory's logs after stop()
        self.plan: Plan | None = None
        self._own_journal = False
        self._stopped = False

    def members_record(self) -> list[dict]:
        return [m.to_json() for m in self.members]

    def adopt(self, record: dict) -> None:
        super().adopt(record)
        self.members = [Member.from_json(m) for m in record.get("members") or []]

    def alive(self) -> bool:
        return any(m.alive()[0] for m in self.members) or bool(
            procs.carrying(TOKEN_VAR, [self.token], procs.scan())[self.token])

    @property
    def engine(self) -> str:
        return self.spec.name

    @property
    def title(self) -> str:
        return self.spec.title

    # -- the start, shared by every engine --
    def _begin(self, plan: Plan, dataset, memory_mb: dict[int, int] | None, join: str | None) -> dict[int, int]:
        """Common first steps of start(): the working directory, the data set record, the memory
        per instance (the spec's memory knob for this machine unless given)."""
        ensure_runnable(plan)
        if self.root is None:  # the run's own directory: journaled before it exists, so that `tilewise
            # restore` removes it (sockets, logs, spill) after a kill -9 of tilewise, as it stops the processes
            root = Path(dirs.scratch_base()) / f"tilewise-{self.engine}-work-{self.token[:12]}"
            self.own_journal().record(changes.CreatedDirectory(str(root), f"{self.engine} working directory"),
                                      "state", "absent", "present", lock=False)
            root.mkdir(mode=0o700)
            self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.plan = plan
        self.joined = bool(join)
        if join and not self.spec.capabilities.join:
            raise UsageError(f"{self.engine} workers cannot join a cluster on another host",
                             f"start them on each host with `tilewise up --engine {self.engine}`")
        if dataset is not None:
            self.spec.check_reads(dataset)
            missing = [f for s in dataset.table_sources().values() for f in s.files if not os.path.exists(f)]
            if missing:
                raise TilewiseError(f"{dataset.label} data missing in {dataset.dir}: {', '.join(missing)}")
            self.data = record_of(dataset)
        return memory_mb if memory_mb is not None else self.default_memory_mb(plan, live_node_memory())

    # -- processes --
    def env(self) -> dict:
        env = dict(os.environ)
        env[TOKEN_VAR] = self.token
        if self.detach and self.root is not None:
            env[CLUSTER_VAR] = str(self.root)
        return env

    def _spawn(self, role: str, instance: int | None, argv: list[str], b: Binding, *, cores=0, memory_mb=0,
               env: dict | None = None, extra: dict | None = None, log_name: str | None = None,
               die_with_parent: bool | None = None, **popen_kwargs) -> Member:
        """Start one member bound, logging to logs/<name>.log. die_with_parent: default, unless detached."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        name = log_name or (role if instance is None else f"{role}-{instance}")
        log = self.root / "logs" / f"{name}.log"
        self.own_journal()
        with open(log, "ab") as fh:
            proc = launch.spawn(argv, b, env=env or self.env(), journal=self.journal,
                                die_with_parent=not self.detach if die_with_parent is None else die_with_parent,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, **popen_kwargs)
        m = Member(role, instance, proc.pid, create_time(proc.pid), b, str(log), cores, memory_mb, proc,
                   dict(extra or {}), start=proc.ident.start, token=proc.token)
        self.members.append(m)
        if self.on_change:
            self.on_change(self)
        return m

    def own_journal(self) -> changes.Session | None:
        """The change session each start (and a run's own directory) is journaled in first, so that
        `tilewise restore` undoes what a killed run left: the one `up` gives, or, for a run that dies
        with tilewise, one of its own (committed once stop() has stopped and removed everything)."""
        if self.journal is None and not self.detach:
            self.journal, self._own_journal = changes.Session(f"processes started by {self.engine}"), True
        return self.journal

    def _verify_started(self, m: Member) -> None:
        v = verification.verify(m.pid, m.binding)
        if not v.ok:
            raise launch.LaunchError(f"{self.engine} {m.label}: binding not applied: " + "; ".join(v.problems))

    def wait_log(self, m: Member, pattern, timeout: float, what: str) -> str:
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

    def worker(self, instance: int) -> Member | None:
        return next((m for m in self.workers() if m.instance == instance), None)

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
        """pid, binding read back from /proc, health (contract.process_status)."""
        alive = m.alive()
        return process_status(m.role, m.instance, m.pid, m.binding, alive, cores=m.cores, memory_mb=m.memory_mb,
                              log=m.log, last_lines="" if alive[0] else log_tail(m.log, 2))

    def statuses(self) -> list[dict]:
        return [self.member_status(m) for m in self.members]

    def status(self) -> list[InstanceStatus]:
        """Per plan instance (the harness's view): its worker's status document, and the engine's details."""
        if self.plan is None or self._stopped:
            return []
        docs = {d["instance"]: d for d in self.statuses() if d["role"] == "worker"}
        return instance_statuses(self.plan, docs, self.instance_extra)

    def instance_extra(self, d: dict) -> dict:
        """The engine's own details of one instance's status document (InstanceStatus.extra)."""
        return {"memory_mb": d["memory_mb"]}

    def info(self, instance: int) -> dict:
        """What results record per instance: the worker's cores (its threads) and memory."""
        m = self.worker(instance)
        return {"threads": m.cores, "memory_mb": m.memory_mb, "pid": m.pid} if m else {}

    def processes(self) -> list[int]:
        """Every live process of the deployment's members and their descendants (Spark's executors
        included): whose /proc I/O and CPU counters are the deployment's work."""
        live = [m.pid for m in self.members if m.alive()[0]]
        return sorted(set(live) | procs.descendants(live, procs.scan()))

    @staticmethod
    def _unhealthy(d: dict, why: str) -> None:
        d["healthy"] = False
        d["detail"] = (d["detail"] + "; " if d["detail"] else "") + why

    def _check_whole_cluster(self, instance: int | None) -> None:
        """Engines whose workers cooperate: a query has no instance to pick, and a joined host none to ask."""
        if instance not in (None, -1):
            raise UsageError(f"{self.title} runs every query on the whole cluster", "drop --instance")
        if self.joined:
            raise UsageError("this cluster only holds workers that joined a coordinator elsewhere",
                             "query the coordinator's cluster (on the host that ran `tilewise up`)")

    # -- stopping --
    def stop(self, timeout: float = 10.0) -> list[int]:
        """Stop every member's whole tree and every process carrying the cluster token (children a
        crashed member left behind included): SIGTERM, `timeout`, SIGKILL, then check (procs.stop).
        Idempotent. Returns the pids stopped; raises if any process survived. A temporary working
        directory is removed (unless keep_logs)."""
        self._stopped = True
        try:
            self.close()
        except Exception:  # noqa: BLE001 - stopping goes on; the processes are what matter
            pass
        trees = [m.tree() for m in sorted(self.members, key=lambda m: self.STOP_ORDER.get(m.role, 3))]
        trees.append(procs.Tree(None, self.token, TOKEN_VAR))
        rep = procs.stop(trees, grace=timeout)
        if not rep.ok:
            raise self.error_cls(f"could not stop processes of the cluster: {rep.summary()}",
                                 "kill them by pid (are you the same user?)")
        if self._own_root and self.root is not None and not self.keep_logs:
            fsutil.remove_run_dir(self.root)  # a failed run's logs stay where its error names them
        if self._own_journal and self.journal is not None:
            self.journal.commit()  # everything journaled was stopped, checked and removed
            self.journal = None
        return [p["pid"] for p in rep.stopped]
