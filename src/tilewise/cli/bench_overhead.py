"""`tilewise bench overhead`: tilewise's time on a benchmark (TPC-H by default) over plain DuckDB's,
with a 95 % interval."""

from __future__ import annotations

import click

from tilewise import benchmarks
from tilewise.cli.common import AT_LEAST_1, SECONDS, SEED, Number, console, emit_json, json_option
from tilewise.cli.engines import LazyHelpOption


class _Reporter:
    def __init__(self, quiet: bool) -> None:
        self.err = console(stderr=True)
        self.quiet = quiet

    def message(self, text: str) -> None:
        if not self.quiet:
            self.err.print(text, markup=False, highlight=False)

    def pass_done(self, rnd: int, side: str, total_s: float) -> None:
        self.message(f"round {rnd}: {side} {total_s:.3f} s")


@click.command("overhead")
@click.option("--benchmark", "-b", default="tpch", show_default=True, metavar="NAME", cls=LazyHelpOption,
              help_text=lambda: f"Whose data and queries: {', '.join(benchmarks.names())}.")
@click.option("--sf", default="1", show_default=True, help="The benchmark's scale factor.")
@click.option("--rounds", "-k", type=Number(integer=True, min=2), default=6, show_default=True,
              help="Rounds of one plain and one tilewise pass (the samples of the interval; >= 2).")
@click.option("--runs", "-r", type=AT_LEAST_1, default=3, show_default=True, help="Timed runs per pass, after one warm-up run.")
@click.option("--queries", "-q", "query_list", default=None, metavar="LIST", help="Subset, e.g. 1,6,10-12 (default: all of the benchmark's).")
@click.option("--order", type=click.Choice(["abba", "random"]), default="abba", show_default=True,
              help="Order of the two passes in each round: ABBA, or random (seeded by --seed).")
@click.option("--seed", type=SEED, default=1, show_default=True)
@click.option("--data-dir", default=None, metavar="DIR",
              help="The benchmark's data cache (default: ~/.cache/tilewise/<benchmark>).")
@click.option("--tilewise-src", default=None, metavar="DIR",
              help="Run the tilewise passes from this source tree's src/ (e.g. an older commit) instead of this install.")
@click.option("--plain-fetch", type=click.Choice(["worker", "rows"]), default="worker", show_default=True,
              help="How the plain pass fetches answers: worker (as the worker does now) or rows (fetchall, as older workers did).")
@click.option("--timeout", type=SECONDS, default=None, metavar="S", help="Give up on a pass after S seconds.")
@click.option("--out", "-o", "out_dir", default="overhead-results", show_default=True, metavar="DIR",
              help="results.json, the SQL run (queries.json) and each tilewise pass's results go here.")
@json_option
def overhead(benchmark, sf, rounds, runs, query_list, order, seed, data_dir, tilewise_src, plain_fetch, timeout, out_dir, as_json):
    """Alternate plain-DuckDB passes and `bench <benchmark> --policies wim --streams 1` passes (same data, SQL,
    order and CPUs, fresh processes) and report tilewise/plain with a 95 % confidence interval,
    per-query differences, and whether the 5 % goal (stretch 2 %) is shown met, shown missed or
    not decided by the data.

    \b
    tilewise bench overhead --sf 1 --rounds 6 --runs 3
    tilewise bench overhead --benchmark tpcds --sf 1 --queries 3,7,42
    """
    from tilewise.bench import overhead as ov

    bench = benchmarks.get(benchmark)
    cfg = ov.Config(sf=bench.data.check_sf(sf), rounds=rounds, runs=runs, benchmark=bench.name,
                    queries=bench.catalog.parse(query_list) if query_list else None, order=order,
                    seed=seed, out=out_dir, data_dir=data_dir, tilewise_src=tilewise_src, plain_fetch=plain_fetch,
                    timeout_s=timeout)
    doc = ov.run(cfg, _Reporter(quiet=as_json))
    if as_json:
        emit_json(doc)
        return
    from tilewise.results import report

    report.render(doc, console(wide=True))
