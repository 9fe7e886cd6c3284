"""Benchmarks: each one package behind one contract (tilewise.benchmarks.spec.Benchmark), listed
here and nowhere else.

Built-ins are listed by module path (listing names imports nothing); packages outside the tree
register under the entry-point group ``tilewise.benchmarks`` (value: ``module`` or
``module:ATTRIBUTE``, default attribute SPEC). The command line's choices (`data --benchmark`,
`bench <name>`) come from here.
"""

from __future__ import annotations

from collections.abc import Callable

from tilewise.benchmarks.spec import Benchmark
from tilewise.errors import TilewiseError, UsageError
from tilewise.registry import Registry

REGISTRY: Registry[Benchmark] = Registry("benchmark", "tilewise.benchmarks", {
    "tpch": "tilewise.benchmarks.tpch",
    "jcch": "tilewise.benchmarks.jcch",
    "tpcds": "tilewise.benchmarks.tpcds",
})


def names() -> list[str]:
    return REGISTRY.names()


def get(name: str) -> Benchmark:
    return REGISTRY.get(name)


def loadable() -> list[Benchmark]:
    """Every benchmark whose package imports (for help texts and choices): a broken plug-in is
    left out here and reported with its one-line error when it is named."""
    out = []
    for n in names():
        try:
            out.append(get(n))
        except TilewiseError:
            pass
    return out


# what only some benchmarks take: query parameter sets, a seed for them, a seed for the data generator
TAKES: dict[str, Callable[[Benchmark], bool]] = {
    "params": lambda b: b.params is not None,
    "seed": lambda b: b.query_seed,
    "data_seed": lambda b: b.data.seeded,
}


def check_flag(spec: Benchmark, flag: str, value, takes: str, *, command: str = "bench") -> None:
    """`flag` (setting what TAKES[takes] says) given, not None, to a benchmark that takes none: one
    usage error naming the benchmarks that do (as `tilewise bench NAME`, or with command="data",
    `--benchmark NAME`)."""
    if value is None or TAKES[takes](spec):
        return
    others = [b.name for b in loadable() if TAKES[takes](b)]
    if not others:
        where = "no benchmark here"
    elif command == "bench":
        where = " or ".join(f"`tilewise bench {o}`" for o in others)
    else:
        where = f"--benchmark {' or '.join(others)}"
    raise UsageError(f"{flag} applies to {where} only", f"drop {flag} for {spec.title}")
