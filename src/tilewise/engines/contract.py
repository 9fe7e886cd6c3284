"""The engine contract: what an engine package exports (one EngineSpec, `SPEC`) and what its runtime
does (a Runtime). The harness (`bench tpch`, `bench overhead`, `bench elastic`) and the cluster
commands (`up/status/query/down/join`) talk only to these, so an engine is one folder: its spec, its
runtime, and whatever processes the runtime starts. docs/adding-an-engine.md walks through one.

- EngineSpec: the engine's name, its capabilities as data (replicas or cooperating workers, refresh
  functions, workers that join from other hosts, its memory knobs), `missing()` (the exact install
  hint), `version()`, an install step where it needs one, and an optional SQL dialect hook that
  rewrites a benchmark query (keyed by benchmark and query) into the engine's dialect.
- Runtime: one running deployment of the engine (one bound process or worker per plan instance),
  used by the benchmarks (it dies with tilewise) and by `tilewise up` (detached, recorded in a state
  file and driven again by later commands). One constructor, ``Runtime(root, token, host=, detach=)``
  (the benchmarks call it with no arguments), and one way back from the state file:
  ``Runtime.restore(root, token, host=, record=)`` with what ``record()`` returned. Then start,
  run_query, apply_refresh, status (per plan instance) and statuses (per process, for `tilewise
  status`), alive, info, close, stop; and what `up`/`join`/`status` ask before or after a start:
  join_address, default_memory_mb, connect_hints, status_fields. tilewise.cluster and the harness use
  nothing else. engines.procgroup.ProcessCluster implements it for every built-in engine; an engine
  may implement it directly (tests/fixtures/engine_plugin_direct).
"""

from __future__ import annotations

import abc
import functools
import importlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tilewise import cpulist, envvars, procs, signals, sqlrewrite, verification
from tilewise.binding import Binding
from tilewise.engines.memory import MemoryKnob
from tilewise.engines.splits import SplitRule
from tilewise.errors import TilewiseError, UsageError
from tilewise.parts import Part
from tilewise.sqlrewrite import Rule

if TYPE_CHECKING:  # only for annotations: the contract imports no engine and no data module
    from tilewise.data import Dataset
    from tilewise.plan import Plan


# ---- the spec -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Capabilities:
    """What the harness and the cluster commands may ask of an engine, known before it starts."""

    # True: every instance holds a full copy of the data and a query runs on one instance (they do
    # not cooperate on a query, e.g. DuckDB): a throughput test needs streams >= instances, and
    # `tilewise query --instance I` picks one. False: the workers cooperate on every query (instance -1).
    replicas: bool = False
    refresh: bool = False  # apply_refresh() works: the engine writes its tables (TPC-H RF1/RF2)
    join: bool = False  # workers can join a coordinator on another host (`tilewise join`)
    memory: MemoryKnob | None = None  # what --worker-memory sets, its minimum and default
    coordinator_memory: MemoryKnob | None = None  # what --coordinator-memory sets (a coordinator with its own heap)
    # the file formats it reads in place, per query (tilewise.data.sources.FORMATS): a data set with a
    # layout or raw tables (Dataset.in_place) is served from its files; () = it loads Parquet only
    reads: tuple[str, ...] = ()
    # a running deployment can switch a table to another copy of it (Runtime.switch_table): cracking
    switch: bool = False
    # an allocator the engine links in itself (ClickHouse: jemalloc); None: it uses the C library's
    # malloc, which a preloaded allocator (LD_PRELOAD) replaces. An engine with its own allocator
    # aborts when another one is preloaded (memory one allocates, the other frees), so `tune
    # --engine` sweeps no allocators for it and says why
    linked_allocator: str | None = None
    # the engine's integer division where its `/` divides integers as floating point ("//" in DuckDB,
    # "div" in Spark, "DIV" in ClickHouse); None: its `/` truncates, as the SQL standard says. A
    # benchmark query's integer divisions (Query.integer_divisions) are rewritten with it
    integer_division: str | None = None
    # the transports its cooperating tiles can exchange data over (`--exchange`), the default first;
    # () = the engine has one fixed exchange, or none
    exchanges: tuple[str, ...] = ()
    # Runtime.scan_stats() is cheap and says per tile what each query did (its scans, what its exchange
    # received): the power test records it per query whatever the data's layout (else only on --layout)
    tile_stats: bool = False


@dataclass(frozen=True)
class Query:
    """Which benchmark query a text is, for an engine's dialect hook."""

    benchmark: str  # "tpch", "jcch", ... (the benchmark registry's name)
    id: int | str  # the query's id in its benchmark's catalog: 6, or "2a" where a query has parts
    stream: int  # 0: the power test; 1..S: the throughput test's streams
    key: str  # the reference-answer name: equal text, equal key ("q01" for TPC-H's validation text)
    # where the text divides an integer by an integer: (pattern with two groups, occurrences), from
    # the benchmark's catalog (benchmarks.spec.Catalog.divisions)
    integer_divisions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class EngineSpec:
    """One engine, as its package exports it (``SPEC``); the registry (tilewise.engines) lists it."""

    name: str  # the registry name, lower case: what --engine takes
    title: str  # for messages: "DuckDB", "Spark", "Trino"
    summary: str  # one line: what `up` starts ("one server per instance", "master + workers")
    runtime: str  # "module:Class" of its Runtime, imported on first use
    capabilities: Capabilities
    missing: Callable[[], str | None]  # why it cannot run here and exactly what to install; None: it can
    version: Callable[[], str]  # the version results record, e.g. "1.2.0" or "trino 476"
    # what `tilewise engines install NAME` installs: its Python packages (pyproject's extra, parts.Part),
    # then its own install step for what is not a pip package: install(version, progress, keep_download)
    # -> a dict of what was installed (shown by `tilewise engines install`); uninstall(version) -> paths removed
    part: Part | None = None
    install: Callable[..., dict] | None = None
    uninstall: Callable[..., list[str]] | None = None
    # what `engines install NAME --version` takes and what it downloads, for its help text, e.g.
    # "default 476 (or TILEWISE_TRINO_VERSION); about 820 MB"
    install_help: str = ""
    # rewrite a benchmark query's text into the engine's dialect (None: it runs the text as written)
    dialect: Callable[[str, Query], str] | None = None
    endpoint_label: str = "at"  # how `status` names its endpoint: "master", "coordinator", "sockets in"
    # how it splits a scan of Parquet files over its tiles (engines.splits; None: a query runs on one
    # instance, or the engine does not say): `bench --layout` predicts each tile's files and row groups
    scan_split: SplitRule | None = None
    # the environment variables it reads (tilewise.envvars.Var): a bad value is why it cannot run
    env: tuple = ()
    # an engine whose tiles own whole files of the data: check(files per table, tiles) raises a
    # UsageError where a tile would own none (`bench --layout parquet-K` is checked before any data
    # is made); None: any file count goes
    check_shares: Callable[..., None] | None = None

    def why_not(self) -> str | None:
        """Why it cannot run here: a bad value in one of its environment variables, or what is missing."""
        return envvars.problem(self.env) or self.missing()

    def check_env(self) -> None:
        """UsageError (exit 2) naming the first of its environment variables with a bad value."""
        for v in self.env:
            v.value()

    def runtime_class(self) -> type[Runtime]:
        module, _, attr = self.runtime.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise TilewiseError(f"the {self.name} engine's runtime {self.runtime} cannot be loaded: {e}",
                                f"check the package that provides {module}") from None
        return cls

    def sql(self, text: str, query: Query) -> str:
        """The text this engine runs for a benchmark query: its integer divisions in the engine's
        operator (capabilities.integer_division), then its dialect hook, if any."""
        op = self.capabilities.integer_division
        if op and query.integer_divisions:
            rules = [Rule(pat, rf"\1 {op} \2", n) for pat, n in query.integer_divisions]
            text = sqlrewrite.apply(rules, text, f"{self.name} {query.benchmark} q{query.id}", __name__)
        return self.dialect(text, query) if self.dialect is not None else text

    def check_exchange(self, exchange: str | None) -> str | None:
        """The exchange to use: the one given (refused where the engine offers no choice, or not that
        one), else the engine's default (None for an engine without a choice)."""
        offered = self.capabilities.exchanges
        if exchange is None:
            return offered[0] if offered else None
        if not offered:
            raise UsageError(f"--exchange chooses how cooperating tiles exchange data; {self.title} offers no choice",
                             "drop --exchange (`tilewise engines list --json` shows each engine's exchanges)")
        if exchange not in offered:
            raise UsageError(f"--exchange {exchange!r}: {self.title} exchanges over {', '.join(offered)}",
                             f"use one of {', '.join(offered)}")
        return exchange

    def check_allocator(self, allocator: str, option: str = "--allocator") -> None:
        """A UsageError when `allocator` would be preloaded into an engine that links its own
        (capabilities.linked_allocator): the process would abort."""
        own = self.capabilities.linked_allocator
        if own and allocator != "system":
            raise UsageError(f"{self.title} links its own allocator ({own}): preloading {allocator} into it makes it "
                             "abort (memory one allocator hands out, the other frees)", f"use {option} system")

    def check_reads(self, dataset: Dataset | None) -> None:
        """A UsageError when the data set has a layout or raw tables (they are read in place) in a
        format this engine cannot read."""
        if dataset is None or not (dataset.in_place or dataset.sources):
            return
        fmts = sorted({s.format for s in dataset.table_sources().values()})
        bad = [f for f in fmts if f not in self.capabilities.reads]
        if bad:
            can = ", ".join(self.capabilities.reads) or "nothing in place (it loads Parquet files)"
            raise UsageError(f"{self.title} cannot read {', '.join(bad)} tables in place ({dataset.label})",
                             f"it reads {can}; pick another --engine or a Parquet layout")


class Progress:
    """What an install step reports while it works (the command line renders progress bars)."""

    def begin(self, what: str, total: int | None, done: int = 0, unit: str = "items") -> None: ...
    def advance(self, n: int) -> None: ...
    def end(self) -> None: ...
    def message(self, text: str) -> None: ...


# ---- answers and status -----------------------------------------------------------------------------

class ArrowRows(Sequence):
    """The rows of a query result whose first rows came as tuples and the rest as an Arrow IPC
    stream, turned into Python tuples only when first used (after the harness's clock stopped).
    column_values: how the engine's Arrow columns become Python values (default: to_pylist; an engine
    with a type of its own converts it in its folder: DuckDB's HUGEINT, engines/duckdb/types.py)."""

    def __init__(self, head: list[tuple], ipc: bytes | bytearray | memoryview,
                 column_values: Callable | None = None) -> None:
        self._head = head
        self._ipc = ipc
        self._column_values = column_values or (lambda col: col.to_pylist())
        self._table = None
        self._rows: list[tuple] | None = None

    @property
    def table(self):
        """The rows after the first ones, as a pyarrow.Table (zero-copy over the received bytes)."""
        if self._table is None:
            import pyarrow as pa

            self._table = pa.ipc.open_stream(pa.py_buffer(self._ipc)).read_all()
        return self._table

    def _materialise(self) -> list[tuple]:
        if self._rows is None:
            cols = [self._column_values(c) for c in self.table.columns]
            self._rows = list(self._head) + (list(zip(*cols)) if cols else [])
        return self._rows

    def __len__(self) -> int:
        return self._rows.__len__() if self._rows is not None else len(self._head) + self.table.num_rows

    def __getitem__(self, i):
        return self._materialise()[i]

    def __iter__(self):
        return iter(self._materialise())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"ArrowRows({len(self)} rows)"


@dataclass
class QueryResult:
    columns: list[str]
    rows: Sequence[tuple]  # full result, for validation (a list, or ArrowRows converted on first use)
    elapsed_s: float  # time inside the engine for this query (excludes result transfer to tilewise)
    instance: int  # which plan instance ran it (-1: the whole cluster, e.g. Spark)


@dataclass
class InstanceStatus:
    id: int
    pid: int | None
    cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    mem_policy: str
    binding_verified: bool | None  # True read back and matches, False mismatch, None not checkable (detail says why)
    healthy: bool
    detail: str = ""
    extra: dict = field(default_factory=dict)
    # the binding as read back from /proc (verification.Verification.to_json()); None: not read (gone)
    verification: dict | None = None

    @property
    def verdict(self) -> str:
        """verified, mismatch or not checkable (verification.VERDICT_TEXT)."""
        return verification.VERDICT_TEXT[self.binding_verified]


def process_status(role: str, instance: int | None, pid: int, binding: Binding, alive: tuple[bool, str], *,
                   cores: int = 0, memory_mb: int = 0, log: str = "", last_lines: str = "") -> dict:
    """One process's entry of Runtime.statuses(): its binding read back from /proc (verification),
    and its health; alive: (alive, why not); last_lines: the end of its log, for a dead one."""
    ok, why = alive
    stopped = ok and (st := procs.stat(pid)) is not None and st.state in ("T", "t")
    d = {"role": role, "instance": instance, "pid": pid, "alive": ok, "healthy": ok and not stopped,
         "detail": "stopped (SIGSTOP): it answers nothing until it is continued (kill -CONT)" if stopped else why,
         "cpus": cpulist.format(binding.cpus) if binding.cpus is not None else "any",
         "mem_policy": binding.mem_policy, "mem_nodes": list(binding.mem_nodes),
         "cores": cores, "memory_mb": memory_mb, "log": log,
         "binding_verified": None, "verification": None, "executors": []}
    if not ok:
        d["detail"] = f"{why}; last log lines: {last_lines}" if last_lines else why
        return d
    v = verification.verify(pid, binding, allocator_wait_s=0.0)
    d["verification"] = v.to_json()
    d["binding_verified"] = v.verdict  # True verified, False mismatch, None not checkable
    if not v.verified and not stopped:
        d["detail"] = v.summary()
    return d


def instance_statuses(plan: Plan, docs: dict[int, dict], extra) -> list[InstanceStatus]:
    """Per plan instance, from the cluster's worker status documents (ProcessCluster.member_status);
    extra(doc) -> the engine's own details. An instance without a worker is reported, not skipped."""
    out = []
    for inst in plan.instances:
        d = docs.get(inst.id)
        if d is None:
            out.append(InstanceStatus(inst.id, None, tuple(inst.cpus), tuple(inst.mem_nodes), inst.mem_policy,
                                      False, False, "worker not started"))
            continue
        out.append(InstanceStatus(inst.id, d["pid"], tuple(inst.cpus), tuple(inst.mem_nodes), inst.mem_policy,
                                  d["binding_verified"], bool(d["healthy"]), d["detail"], extra(d),
                                  d.get("verification")))
    return out


# ---- the runtime --------------------------------------------------------------------------------------

# every process of a deployment carries its token in this environment variable (what it forks
# inherits it): stopping a deployment reaches every carrier, even when its record is incomplete
TOKEN_VAR = "TILEWISE_CLUSTER_TOKEN"
# and, started by `tilewise up`, its directory (<cluster state dir>/<name>): a deployment whose state
# file was lost is still found by its name
CLUSTER_VAR = "TILEWISE_CLUSTER"


def new_token() -> str:
    return uuid.uuid4().hex


class Runtime(abc.ABC):
    """One deployment of an engine: a bound process or worker per plan instance. The benchmarks start
    one that dies with tilewise; `tilewise up` starts one detached and later commands rebuild it from
    the state file (restore) to query, inspect and stop it."""

    spec: ClassVar[EngineSpec]  # the engine this runtime belongs to (its capabilities say what works)

    def __init_subclass__(cls, **kwargs) -> None:
        """Every engine's stop() runs with SIGINT/SIGTERM/SIGHUP held (signals.deferred): a burst of
        Ctrl-C during a clean-up cannot abort it half way (its data directories, working directory
        and journal stay otherwise); the held signal acts once the clean-up is done."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("stop")
        if own is not None and not getattr(own, "_holds_signals", False):
            @functools.wraps(own)
            def stop(self, *args, **kw):
                with signals.deferred():
                    return own(self, *args, **kw)
            stop._holds_signals = True
            cls.stop = stop

    def __init__(self, root: Path | None = None, token: str | None = None, *, host: str = "127.0.0.1",
                 detach: bool = False) -> None:
        """root: the deployment's own directory (None: a temporary one, removed by stop()); token:
        what every process carries in TOKEN_VAR (None: a new one); host: the address its endpoints
        bind; detach: the processes outlive this Python (`tilewise up`), else they die with it."""
        self.root = Path(root) if root is not None else None
        self.token = token or new_token()
        self.host = host
        self.detach = detach
        self.endpoint: str | None = None  # how users reach it: a URL, an address, a socket directory
        self.data: dict = {}  # the data set served, as recorded (tilewise.data.record_of)
        self.joined = False  # only workers that joined a coordinator on another host
        self.placement = None  # where a coordinator went and why (tilewise.nic.Placement), if anywhere
        # the transport between cooperating tiles (spec.capabilities.exchanges; None: no choice);
        # set before start() by whoever chose it (`--exchange`)
        self.exchange: str | None = None
        # set by `tilewise up` before start(): called after each process starts, so the state file
        # always names what runs; and the change session each start is journaled in first
        self.on_change: Callable[[Runtime], None] | None = None
        self.journal = None

    # -- the state file of `tilewise up` --
    def record(self) -> dict:
        """What the state file keeps so that a later command can restore this deployment: endpoint,
        data, joined, placement, and "members": the engine's own list of its processes (opaque to
        tilewise.cluster, given back to adopt())."""
        return {"endpoint": self.endpoint, "data": dict(self.data), "joined": self.joined,
                "placement": self.placement.to_json() if self.placement is not None else {},
                "exchange": self.exchange, "members": self.members_record()}

    def members_record(self) -> list[dict]:
        """The engine's own record of its processes (JSON), for record()."""
        return []

    def adopt(self, record: dict) -> None:
        """Take over the deployment a record() names (the runtime is detached: it drives, it does
        not own). Engines extend it to read back their "members"."""
        self.endpoint = record.get("endpoint")
        self.data = dict(record.get("data") or {})
        self.joined = bool(record.get("joined"))
        self.exchange = record.get("exchange")

    @classmethod
    def restore(cls, root: Path, token: str, *, host: str = "127.0.0.1", record: dict) -> Runtime:
        """The runtime of a deployment a state file records (from record())."""
        rt = cls(root, token, host=host, detach=True)
        rt.adopt(record)
        return rt

    # -- what `up` and `join` ask before the start --
    @classmethod
    def default_memory_mb(cls, plan: Plan, node_memory: dict[int, int]) -> dict[int, int]:
        """The memory knob's default per instance (MiB) for a machine's node memory."""
        knob = cls.spec.capabilities.memory
        return knob.default_mb(plan, node_memory) if knob else {i.id: 0 for i in plan.instances}

    @classmethod
    def join_address(cls, text: str) -> str:
        """The coordinator address `tilewise join --coordinator` names, checked and normalised."""
        raise UsageError(f"{cls.spec.name} workers cannot join a cluster on another host")

    @abc.abstractmethod
    def start(self, plan: Plan, *, dataset: Dataset | None = None, allocator: str = "system",
              memory_mb: dict[int, int] | None = None, coordinator_mb: int | None = None,
              join: str | None = None, log: Callable[[str], None] | None = None) -> None:
        """Start one bound process (or worker) per plan instance, serving `dataset` (loaded or
        registered); memory_mb: the memory knob per instance (None: the spec's default for this
        machine); join: a coordinator on another host whose cluster the workers join instead."""

    @abc.abstractmethod
    def run_query(self, sql: str, *, instance: int | None = None, timeout_s: float | None = None) -> QueryResult:
        """Run one query; instance=None lets the engine route it (the least busy replica / the whole
        cluster); a replica engine accepts an instance id."""

    def apply_refresh(self, function: str, rset) -> float:
        """Apply TPC-H refresh function `function` ("RF1", "RF2", or "undo-RF1"/"undo-RF2", which
        restore the loaded state) of update set `rset` as one transaction; a replica engine applies
        it to every instance. Returns the seconds until every instance committed. Only engines whose
        spec says capabilities.refresh implement it."""
        raise TilewiseError(f"the {self.spec.name} engine cannot apply refresh functions")

    @abc.abstractmethod
    def status(self) -> list[InstanceStatus]:
        """Per plan instance: pid, binding read back from /proc, health (a crashed instance is unhealthy).
        The pid is the root of the instance's process tree: every process of the instance is it or a
        descendant (a server's backends and workers), which is what `bench elastic`, `elastic
        --instances` and `tune --engine` manage and verify."""

    def info(self, instance: int) -> dict:
        """The engine's settings of one instance as results record them: threads, memory_mb, load_s;
        where the engine knows them, its process's CPU seconds so far (cpu_s) and ctx_involuntary."""
        return {}

    def switch_table(self, table: str, source: dict) -> None:
        """Serve `table` from another copy of it (a TableSource's JSON) from now on, on every instance:
        queries that started keep the copy they bound, later ones read the new one. Only engines
        whose spec says capabilities.switch (cracking switches each table once its copy is checked)."""
        raise TilewiseError(f"the {self.spec.name} engine cannot switch a table to another copy while running")

    def scan_stats(self) -> dict[int, dict] | None:
        """Per plan instance, cumulative counters of what its workers scanned (tasks or splits, input
        bytes, rows), where the engine reports them: the harness takes differences per query to show
        how a scan split over the tiles. None: the engine does not say (replica engines: a query runs
        on one instance)."""
        return None

    def processes(self) -> list[int]:
        """The pids whose I/O and CPU time are this deployment's work (workers, executors, servers)."""
        return []

    # -- what `tilewise status` shows --
    @abc.abstractmethod
    def statuses(self) -> list[dict]:
        """Every process of the deployment, for `tilewise status`: {"role", "instance" (None for a
        coordinator), "pid", "healthy", "binding_verified" (True/False/None), "detail", "cpus",
        "mem_policy", "mem_nodes", ...}."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether any process of the deployment still runs (a recorded one, or a carrier of its token)."""

    def connect_hints(self, state) -> list[str]:
        """How users reach a detached deployment (lines `up` prints)."""
        return []

    def status_fields(self) -> dict:
        """Engine-specific fields of `tilewise status --json` (e.g. Spark's master_url)."""
        return {}

    def close(self) -> None:
        """Release what this process holds (connections, a query driver); the deployment keeps running."""

    @abc.abstractmethod
    def stop(self) -> list[int]:
        """Stop every process of the deployment; idempotent; leaves no orphan. The pids stopped."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
