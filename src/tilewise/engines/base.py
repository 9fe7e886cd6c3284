"""The engine adapter interface: start instances from a plan, load data, run a query, stop.

The harness (bench, up/status/down, elastic experiments) talks only to this interface, so Trino
and others are added by writing one adapter and one line in engines.ENGINES.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from tilewise.data import Dataset
from tilewise.plan import Plan


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple]  # full result, for validation
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


class Engine(abc.ABC):
    name: str = "engine"

    @abc.abstractmethod
    def start(self, plan: Plan, *, dataset: Dataset, allocator: str = "system") -> None:
        """Start one bound process (or worker) per plan instance and load the dataset's tables."""

    @abc.abstractmethod
    def run_query(self, sql: str, *, instance: int | None = None) -> QueryResult:
        """Run one query; instance=None lets the engine route it (round robin / the whole cluster)."""

    @abc.abstractmethod
    def status(self) -> list[InstanceStatus]:
        """Per instance: pid, binding read back from /proc, health (a crashed instance is unhealthy)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process started; idempotent; leaves no orphan."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
