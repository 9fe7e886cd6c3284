"""`tilewise bench ...`: benchmark commands (each in its own module, loaded lazily), and one harness
command per registered benchmark (tilewise.benchmarks), made from its spec."""

from __future__ import annotations

import click

from tilewise import benchmarks
from tilewise.cli import LazyGroup

# name -> "module:attribute"; a new command is one line here (a registered benchmark needs none).
BENCH_COMMANDS = {
    "elastic": "tilewise.cli.bench_elastic:bench_elastic",
    "elastic-tick": "tilewise.cli.bench_tick:bench_tick",
    "overhead": "tilewise.cli.bench_overhead:overhead",
}


class BenchGroup(LazyGroup):
    registry = BENCH_COMMANDS

    def list_commands(self, ctx):
        return sorted(set(BENCH_COMMANDS) | set(benchmarks.names()))

    def get_command(self, ctx, name):
        if name in BENCH_COMMANDS:
            return super().get_command(ctx, name)
        if name not in benchmarks.names():
            return None
        from tilewise.cli.bench_harness import make_command
        from tilewise.cli.common import harden

        return harden(make_command(name))


@click.group("bench", cls=BenchGroup)
def bench() -> None:
    """Benchmarks: TPC-H (and every registered benchmark) per deployment policy, the elastic allocator experiment."""
