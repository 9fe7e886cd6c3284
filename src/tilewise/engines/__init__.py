"""The engines tilewise drives: the one place their names are listed.

Each engine is one package, ``tilewise.engines.<name>``, exporting one spec (``SPEC``, an
engines.contract.EngineSpec: capabilities as data, install hint, version, its runtime). Engines
outside the tree register through the entry-point group ``tilewise.engines`` (value: the module
holding SPEC, or ``module:ATTRIBUTE``); see docs/adding-an-engine.md. Command-line choices, help
texts, `tilewise engines list/install` and memory rules all come from here.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise.engines.contract import EngineSpec
from tilewise.errors import TilewiseError
from tilewise.registry import Registry

REGISTRY: Registry[EngineSpec] = Registry("engine", "tilewise.engines", {
    "duckdb": "tilewise.engines.duckdb",
    "spark": "tilewise.engines.spark",
    "trino": "tilewise.engines.trino",
    "postgres": "tilewise.engines.postgres",
    "clickhouse": "tilewise.engines.clickhouse",
    "tiles": "tilewise.engines.tiles",
})
# the engine a command uses when none is named: benchmarks run embedded DuckDB; `up` starts the
# distributed engine users most often connect their own jobs to
DEFAULT_BENCH = "duckdb"
DEFAULT_UP = "spark"


def get(name: str) -> EngineSpec:
    """The spec registered under name (a UsageError listing the choices when there is none)."""
    return REGISTRY.get(name)


def names() -> list[str]:
    """Every engine's name (built-ins first, then plug-ins), without importing any of them."""
    return REGISTRY.names()


def specs(where: Callable[[EngineSpec], bool] | None = None) -> list[EngineSpec]:
    """The specs (those `where` accepts); a plug-in that cannot be loaded is left out here (using it
    by name says why)."""
    out = []
    for n in names():
        try:
            s = get(n)
        except TilewiseError:
            continue
        if where is None or where(s):
            out.append(s)
    return out


def missing(name: str) -> str | None:
    """Why engine `name` cannot run here (what to install), or None when it can."""
    return get(name).why_not()
