"""Engines behind one small adapter interface (see base.Engine). Registry: name -> "module:Class"."""

from __future__ import annotations

import importlib

from tilewise.errors import TilewiseError, UsageError

ENGINES = {
    "duckdb": "tilewise.engines.duckdb:DuckDBEngine",
    "spark": "tilewise.engines.spark:SparkEngine",
    "trino": "tilewise.engines.trino:TrinoEngine",
}


def missing(name: str) -> str | None:
    """Why engine `name` cannot run here (what to install), or None when it can."""
    import importlib.util

    name = name.lower()
    if name == "duckdb":
        return None if importlib.util.find_spec("duckdb") else "pip install duckdb"
    if name == "spark":
        from tilewise.engines import spark_cluster

        try:
            spark_cluster.spark_home()
        except TilewiseError as e:
            return str(e)
        return None
    if name == "trino":
        from tilewise.engines import trino_install

        return trino_install.missing()
    raise UsageError(f"unknown engine {name!r}", f"choose one of {', '.join(ENGINES)}")


def get(name: str):
    """The engine class registered under name (imported lazily)."""
    target = ENGINES.get(name.lower())
    if target is None:
        raise UsageError(f"unknown engine {name!r}", f"choose one of {', '.join(ENGINES)}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
