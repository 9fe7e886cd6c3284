"""Refresh (data maintenance) sets as engines see them: a numbered set whose functions are SQL.

A benchmark with refresh functions (TPC-H's RF1/RF2, tilewise.benchmarks.tpch.refresh) generates
its update sets and subclasses RefreshSet; an engine that can write its tables applies a function
by running the statements the set gives, as one transaction (Engine.apply_refresh). The data
state a query sees after some functions is a DataState: the reference engine builds it from the
loaded tables and the sets, so answers are checked against exactly that state.
"""

from __future__ import annotations

import abc
from pathlib import Path

from tilewise.data import Dataset


class RefreshSet(abc.ABC):
    """One update set: `number` (1, 2, ...), and the SQL of each of its functions."""

    number: int

    @abc.abstractmethod
    def statements(self, function: str, dataset: Dataset, *, source=None) -> list[str]:
        """The SQL of `function` (e.g. "RF1", or "undo-RF1" which restores the loaded state), run
        as one transaction. source(path) turns a Parquet file into a table expression (DuckDB:
        read_parquet('...'))."""

    @abc.abstractmethod
    def to_json(self) -> dict:
        """What results.json records about the set."""


def statements(function: str, rset: RefreshSet, dataset: Dataset, *, source=None) -> list[str]:
    """The SQL of one refresh function of set `rset` (see RefreshSet.statements)."""
    return rset.statements(function, dataset, source=source)


class DataState(abc.ABC):
    """The data a query sees: the loaded tables after some refresh functions."""

    changed: tuple[str, ...] = ()  # the tables refresh functions change (views over the loaded ones)

    @property
    @abc.abstractmethod
    def key(self) -> str:
        """A name for the state, used in cache paths ("loaded" for the loaded data)."""

    @property
    def loaded(self) -> bool:
        return self.key == "loaded"

    @abc.abstractmethod
    def after(self, function: str, k: int) -> DataState:
        """The state after function `function` of set k."""

    @abc.abstractmethod
    def describe(self) -> str:
        """In words, for messages: "the loaded data + RF1 of set(s) 1 - ..."."""

    @abc.abstractmethod
    def views(self, sets: dict[int, RefreshSet]) -> tuple[dict[str, Path], list[str]]:
        """For a reference engine: the Parquet files to register (name -> path) and the CREATE VIEW
        statements that make every table of `changed` this state, over the loaded tables
        registered as <table>__loaded."""
