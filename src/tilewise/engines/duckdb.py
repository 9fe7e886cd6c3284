"""DuckDB engine: one bound worker process per plan instance (engines/duckdb_worker.py).

Each worker is started through tilewise.launch with its instance's Binding (CPU affinity, memory
policy, allocator), verified from /proc, then loads the Parquet tables into its own in-memory tables
(so first-touch places them in its local memory) and runs with threads = its CPU count. WIM is one
worker with every core.

Routing: run_query(instance=None) sends the query to the instance with the fewest queries in flight
(lowest id on ties). A single stream therefore always runs whole queries on instance 0; S concurrent
streams spread over the instances (throughput mode), and several streams on one instance run
concurrently there, like concurrent clients of one server.

The pipe, with as few hand-offs between threads as possible (each costs a scheduler wake-up, and
on a busy machine a wake-up can cost milliseconds): the thread that asked reads the answers itself.
Of the threads waiting on one worker, one reads its pipe at a time and hands the others their
answers; when it has its own it leaves, and the next waiter takes over reading. A worker that dies
is seen by whoever is reading (end of file) and reported with its exit status; every waiting query
fails at once instead of hanging. A large answer's rows after the first ones arrive as Arrow IPC
(see duckdb_worker) and become tuples only when first used, after the harness's clock stopped.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tilewise import launch, verification
from tilewise.binding import Binding
from tilewise.data import Dataset
from tilewise.engines.base import ArrowRows, Engine, InstanceStatus, QueryResult
from tilewise.engines.duckdb_worker import read_msg, write_msg
from tilewise.errors import TilewiseError
from tilewise.plan import Plan


class InstanceDied(TilewiseError):
    pass


@dataclass
class _Pending:
    done: bool = False
    reply: dict | None = None


@dataclass
class _Worker:
    id: int
    started: launch.Started
    fd_to: int
    fd_from: int
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    read_lock: threading.Lock = field(default_factory=threading.Lock)  # held by the thread reading the pipe
    cond: threading.Condition = field(default_factory=threading.Condition)  # guards pending/done/dead
    pending: dict = field(default_factory=dict)
    inflight: int = 0
    dead: str = ""


def engine_version() -> str:
    import duckdb

    return duckdb.__version__


class DuckDBEngine(Engine):
    name = "duckdb"
    replicas = True  # every instance loads its own copy; a query runs on one instance
    supports_refresh = True

    def __init__(self) -> None:
        self._sup = launch.Supervisor()
        self._workers: list[_Worker] = []
        self._route = threading.Lock()
        self._ids = itertools.count(1)
        self._stopped = False
        self.load_s: dict[int, float] = {}
        self.version = engine_version()
        self._dataset: Dataset | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self, plan: Plan, *, dataset: Dataset, allocator: str = "system") -> None:
        self._dataset = dataset
        tables = {k: str(v) for k, v in dataset.tables.items()}
        missing = [p for p in tables.values() if not os.path.exists(p)]
        if missing:
            raise TilewiseError(f"{dataset.label} data missing in {dataset.dir}: {', '.join(missing)}")
        try:
            for inst in plan.instances:
                b = Binding.from_instance(inst, allocator)
                p2c_r, p2c_w = os.pipe()
                c2p_r, c2p_w = os.pipe()
                argv = [sys.executable, "-m", "tilewise.engines.duckdb_worker", str(p2c_r), str(c2p_w)]
                try:
                    st = self._sup.start(f"duckdb instance {inst.id}", argv, b, pass_fds=(p2c_r, c2p_w),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                except BaseException:
                    for fd in (p2c_w, c2p_r):
                        os.close(fd)
                    raise
                finally:
                    os.close(p2c_r)
                    os.close(c2p_w)
                self._workers.append(_Worker(inst.id, st, p2c_w, c2p_r))
            # load in parallel: every worker reads its own copy into its own memory
            waits = [(w, self._submit(w, {"op": "load", "tables": tables})) for w in self._workers]
            for w, pend in waits:
                reply = self._wait(w, pend, "loading the tables")
                if not reply.get("ok"):
                    raise TilewiseError(f"DuckDB instance {w.id} could not load the tables: {reply.get('error')}")
                self.load_s[w.id] = reply["elapsed_s"]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for w in self._workers:
            try:
                if w.started.proc.poll() is None and w.write_lock.acquire(timeout=0.1):
                    try:
                        write_msg(w.fd_to, {"op": "exit", "id": 0})
                    finally:
                        w.write_lock.release()
            except OSError:
                pass
        for w in self._workers:
            try:
                w.started.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        self._sup.stop_all(timeout=3)  # whatever did not exit: SIGTERM, then SIGKILL, always reaped
        for w in self._workers:
            self._fail_all(w, w.dead or "was stopped")  # a thread still waiting gives up now
            for fd in (w.fd_to, w.fd_from):
                try:
                    os.close(fd)
                except OSError:
                    pass

    # ---- queries ------------------------------------------------------------------------------
    @property
    def instances(self) -> int:
        return len(self._workers)

    def run_query(self, sql: str, *, instance: int | None = None) -> QueryResult:
        if self._stopped:
            raise TilewiseError("the DuckDB engine was stopped")
        with self._route:
            if instance is None:
                live = [w for w in self._workers if not w.dead] or self._workers
                w = min(live, key=lambda x: (x.inflight, x.id))
            else:
                w = self._by_id(instance)
            w.inflight += 1
        try:
            reply = self._wait(w, self._submit(w, {"op": "query", "sql": sql}), "running a query")
        finally:
            with self._route:
                w.inflight -= 1
        if not reply.get("ok"):
            raise TilewiseError(f"DuckDB instance {w.id} rejected the query: {reply.get('error')}")
        rows = ArrowRows(reply["rows"], reply["payload"]) if "payload" in reply else reply["rows"]
        return QueryResult(reply["columns"], rows, reply["elapsed_s"], w.id)

    def apply_refresh(self, function: str, rset) -> float:
        """Every replica applies the function in one transaction, all in parallel (concurrently
        with the queries running there); returns the wall time until the last one committed."""
        from tilewise.data import refresh

        if self._stopped or self._dataset is None:
            raise TilewiseError("the DuckDB engine is not running")
        sql = refresh.statements(function, rset, self._dataset)
        t0 = time.perf_counter()
        waits = [(w, self._submit(w, {"op": "execute", "sql": sql})) for w in self._workers]
        errors = []
        for w, pend in waits:
            reply = self._wait(w, pend, f"applying {function} of refresh set {rset.number}")
            if not reply.get("ok"):
                errors.append(f"instance {w.id}: {reply.get('error')}")
        if errors:
            raise TilewiseError(f"DuckDB could not apply {function} of refresh set {rset.number}: {errors[0]}")
        return time.perf_counter() - t0

    def info(self, instance: int) -> dict:
        w = self._by_id(instance)
        return self._wait(w, self._submit(w, {"op": "info"}), "reporting its settings")

    def _by_id(self, wid: int) -> _Worker:
        for w in self._workers:
            if w.id == wid:
                return w
        raise TilewiseError(f"no DuckDB instance {wid}", f"instances are 0..{len(self._workers) - 1}")

    # ---- the pipe ------------------------------------------------------------------------------
    def _submit(self, w: _Worker, msg: dict) -> _Pending:
        if w.dead:
            raise self._died(w, "receiving a request")
        rid = next(self._ids)
        pend = _Pending()
        with w.cond:
            w.pending[rid] = pend
        msg["id"] = rid
        try:
            with w.write_lock:
                write_msg(w.fd_to, msg)
        except OSError:
            with w.cond:
                w.pending.pop(rid, None)
            raise self._died(w, "receiving a request") from None
        return pend

    def _wait(self, w: _Worker, pend: _Pending, doing: str) -> dict:
        """Our answer: read the pipe ourselves when no other thread is, else wait to be handed it
        (short waits keep Ctrl-C responsive; a reader that leaves wakes us to take over)."""
        while not pend.done:
            if w.read_lock.acquire(blocking=False):
                try:
                    self._read_until(w, pend)
                finally:
                    w.read_lock.release()
                    with w.cond:
                        w.cond.notify_all()  # the next waiter becomes the reader
                break
            with w.cond:
                w.cond.wait_for(lambda: pend.done or not w.read_lock.locked(), 0.2)
        if pend.reply is None:
            raise self._died(w, doing)
        return pend.reply

    def _read_until(self, w: _Worker, pend: _Pending) -> None:
        """Read answers, handing each to its waiter, until ours came or the worker is gone."""
        while not pend.done:
            if w.dead:
                self._fail_all(w, w.dead)
                return
            try:
                msg = read_msg(w.fd_from)
            except OSError:
                msg = None
            except BaseException:  # Ctrl-C in the middle of a message: the stream is unusable now
                self._fail_all(w, "was interrupted while answering")
                raise
            if msg is None:
                self._fail_all(w, w.dead or self._how(w))
                return
            with w.cond:
                other = w.pending.pop(msg.get("id"), None)
                if other is not None:
                    other.reply, other.done = msg, True
                    if other is not pend:
                        w.cond.notify_all()

    def _fail_all(self, w: _Worker, how: str) -> None:
        with w.cond:
            w.dead = w.dead or how
            for rid in list(w.pending):
                w.pending.pop(rid).done = True  # reply None: the instance is gone
            w.cond.notify_all()

    def _how(self, w: _Worker) -> str:
        try:
            rc = w.started.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its pipe"
        if rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}"

    def _died(self, w: _Worker, doing: str) -> InstanceDied:
        how = w.dead or self._how(w)
        if self._stopped:
            return InstanceDied(f"DuckDB instance {w.id} was stopped while {doing}")
        return InstanceDied(f"DuckDB instance {w.id} (pid {w.started.pid}) {how} while {doing}",
                            "the run was stopped and every other instance shut down")

    # ---- status -------------------------------------------------------------------------------
    def status(self) -> list[InstanceStatus]:
        out = []
        for w in self._workers:
            b = w.started.binding
            rc = w.started.proc.poll()
            if rc is None:
                v = verification.verify(w.started.pid, b, allocator_wait_s=0.0)
                out.append(InstanceStatus(w.id, w.started.pid, tuple(b.cpus or ()), b.mem_nodes, b.mem_policy,
                                          v.verdict, True, "" if v.verified else v.summary(),
                                          {"verification": v.to_json()}))
            else:
                out.append(InstanceStatus(w.id, w.started.pid, tuple(b.cpus or ()), b.mem_nodes, b.mem_policy,
                                          False, False, f"pid {w.started.pid} {w.dead or self._how(w)}"))
        return out
