"""`tilewise bench ...`: benchmark commands (each in its own module, loaded lazily)."""

from __future__ import annotations

import click

from tilewise.cli import LazyGroup

# name -> "module:attribute"; a new benchmark is one line here.
BENCH_COMMANDS = {
    "tpch": "tilewise.cli.bench_tpch:tpch",
    "elastic": "tilewise.cli.bench_elastic:bench_elastic",
    "elastic-tick": "tilewise.cli.bench_tick:bench_tick",
    "overhead": "tilewise.cli.bench_overhead:overhead",
}


class BenchGroup(LazyGroup):
    registry = BENCH_COMMANDS


@click.group("bench", cls=BenchGroup)
def bench() -> None:
    """Benchmarks: TPC-H per deployment policy, the elastic allocator experiment."""
