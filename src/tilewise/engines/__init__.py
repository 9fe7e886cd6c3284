"""Engines behind one small adapter interface (see base.Engine). Registry: name -> "module:Class"."""

from __future__ import annotations

import importlib

from tilewise.errors import UsageError

ENGINES = {
    "duckdb": "tilewise.engines.duckdb:DuckDBEngine",
    "spark": "tilewise.engines.spark:SparkEngine",
}


def get(name: str):
    """The engine class registered under name (imported lazily)."""
    target = ENGINES.get(name.lower())
    if target is None:
        raise UsageError(f"unknown engine {name!r}", f"choose one of {', '.join(ENGINES)}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
