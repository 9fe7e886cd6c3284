"""The engine adapter interface: start instances from a plan, load data, run a query, stop.

The harness (bench, up/status/down, elastic experiments) talks only to this interface, so Trino
and others are added by writing one adapter and one line in engines.ENGINES.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

from tilewise.data import Dataset
from tilewise.data.refresh import RefreshSet
from tilewise.plan import Plan


class ArrowRows(Sequence):
    """The rows of a query result whose first rows came as tuples and the rest as an Arrow IPC
    stream, turned into Python tuples only when first used (after the harness's clock stopped): the
    values equal what DuckDB's fetchall() returns (Decimal, date, str, int, float; HUGEINT exported
    losslessly becomes int)."""

    def __init__(self, head: list[tuple], ipc: bytes | bytearray | memoryview) -> None:
        self._head = head
        self._ipc = ipc
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
            cols = [_column_values(c) for c in self.table.columns]
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


def _column_values(col) -> list:
    """Python values of one Arrow column; DuckDB's lossless HUGEINT/UHUGEINT (16 bytes) -> int."""
    t = col.type
    if getattr(t, "extension_name", "") == "arrow.opaque":
        name = getattr(t, "type_name", "")
        if name in ("hugeint", "uhugeint"):
            signed = name == "hugeint"
            return [None if b is None else int.from_bytes(b, "little", signed=signed)
                    for chunk in col.chunks for b in chunk.storage.to_pylist()]
    return col.to_pylist()


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
                                  d["binding_verified"], bool(d["healthy"]), d["detail"], extra(d)))
    return out


class Engine(abc.ABC):
    name: str = "engine"
    # Capabilities the harness reads (class attributes, so they are known before start):
    # replicas: every instance holds a full copy of the data and a query runs on one instance (they
    #   cannot cooperate on one query, e.g. DuckDB); a throughput test needs streams >= instances.
    # supports_refresh: apply_refresh() works (the engine can write its tables: TPC-H RF1/RF2).
    replicas: bool = False
    supports_refresh: bool = False

    @abc.abstractmethod
    def start(self, plan: Plan, *, dataset: Dataset, allocator: str = "system") -> None:
        """Start one bound process (or worker) per plan instance and load the dataset's tables."""

    @abc.abstractmethod
    def run_query(self, sql: str, *, instance: int | None = None) -> QueryResult:
        """Run one query; instance=None lets the engine route it (round robin / the whole cluster)."""

    @abc.abstractmethod
    def status(self) -> list[InstanceStatus]:
        """Per instance: pid, binding read back from /proc, health (a crashed instance is unhealthy)."""

    def apply_refresh(self, function: str, rset: RefreshSet) -> float:
        """Apply TPC-H refresh function `function` ("RF1", "RF2", or "undo-RF1"/"undo-RF2", which
        restore the loaded state) of update set `rset` to the data, as one transaction; a replica
        engine applies it to every instance. Returns the seconds until every instance committed.
        Engines that cannot write keep supports_refresh = False and do not override this."""
        raise NotImplementedError(f"the {self.name} engine cannot apply refresh functions")

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process started; idempotent; leaves no orphan."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
