"""`tilewise bench <benchmark>`: a benchmark per deployment policy, validated, with
results.json/CSV/plots. One command per benchmark of the registry (tilewise.benchmarks: `bench
tpch`, `bench jcch`, `bench tpcds`, a plug-in's), its options from the benchmark's spec."""

from __future__ import annotations

import click

from tilewise import benchmarks, engines
from tilewise.benchmarks.spec import check_seed
from tilewise.cli import modes
from tilewise.cli.common import (AT_LEAST_1, SECONDS, ProgressBars, console, emit_json, json_option,
                                 topology_option)
from tilewise.cli.engines import LazyHelpOption, exchange_help, memory_help
from tilewise.errors import UsageError


class _RichReporter(ProgressBars):
    """Progress bar and messages on stderr (plain when not a terminal or NO_COLOR is set)."""

    def __init__(self, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        # it redraws inside the timed runs: 10 Hz (rich's default) cost 1.6 % of a core on a
        # terminal, 2 Hz a third of that (docs/overhead.md)
        super().__init__(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), refresh_per_second=2)
        self.quiet = quiet
        self.task = None
        self.policy = ""

    def message(self, text: str) -> None:
        if not self.quiet:
            super().message(text)

    def start_policy(self, name: str, total_steps: int) -> None:
        self.policy = name
        self.task = self.progress.add_task(name, total=total_steps)

    def step(self, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, description=f"{self.policy}: {label}")

    def end_policy(self, name: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None


def make_command(name: str) -> click.Command:
    """The harness command for the benchmark `name`, its options from the benchmark's spec."""
    own = benchmarks.get(name)
    functions = f" {'/'.join(own.refresh.functions)}" if own.refresh else ""

    opts = [
        click.option("--engine", "-e", default=engines.DEFAULT_BENCH, show_default=True, cls=LazyHelpOption,
                     help_text=lambda: f"Engine: {', '.join(engines.names())} (`tilewise engines list`)."),
    ]
    # `bench tpch --benchmark NAME` ran another benchmark before each had its own command: refused,
    # naming the command to use (hidden from the help)
    opts.append(click.option("--benchmark", "-b", "other", default=None, hidden=True))
    # what only some benchmarks take: shown where the benchmark takes it; elsewhere hidden, and refused
    # in one line naming the benchmarks that take it (benchmarks.check_flag)
    opts += [
        click.option("--params", "qparams", default=None, hidden=own.params is None,
                     type=click.Choice(own.params.choices) if own.params is not None else None,
                     help=f"Query parameters, drawn per stream: {own.params.help}." if own.params else None),
        click.option("--seed", default=None, metavar="S", hidden=not own.query_seed,
                     help="Seed of the query parameters; each stream draws its own (default 0)."),
        click.option("--data-seed", default=None, metavar="S", hidden=not own.data.seeded,
                     help="Seed of the data generator (default 0)."),
    ]
    opts += [
        click.option("--sf", default="1", show_default=True, help=f"Scale factor ({own.data.sf_rule}), e.g. 1 or 0.01."),
        click.option("--policies", "-p", default="wim,wic,auto", show_default=True,
                     help="Comma-separated deployment policies; the first is the baseline (n=K for K instances)."),
        click.option("--streams", "-s", type=AT_LEAST_1, default=None,
                     help=f"Query streams of the throughput test (default: the benchmark's minimum for the SF, "
                          f"{own.metrics.min_streams(1.0)} at SF 1 for {own.title}, and at least one per instance on "
                          "engines whose instances are replicas: `tilewise engines list`)."),
        click.option("--tests", "tests", default="power,throughput", show_default=True, metavar="LIST",
                     help="Tests per run: power (1 stream, with the refresh functions around the queries), "
                          "throughput (S streams + a refresh stream)."),
        click.option("--refresh/--no-refresh", "refresh", default=None,
                     help=f"Run the refresh functions{functions} (default: where the benchmark has them and the "
                          "engine can write its tables)."),
        click.option("--runs", "-r", type=AT_LEAST_1, default=3, show_default=True, help="Timed runs after one warm-up run."),
        click.option("--out", "-o", "out_dir", default=f"{name}-results", show_default=True, metavar="DIR",
                     help="Where results.json, results.csv and the plots go."),
        topology_option,
        click.option("--queries", "-q", "query_list", default=None, metavar="LIST",
                     help="Subset, e.g. 1,6,10-12 (default: all of the benchmark's)."),
        click.option("--allocator", default=None,
                     help="Memory allocator preloaded into every instance: system (default), jemalloc, tcmalloc, "
                          "mimalloc, tbbmalloc."),
        click.option("--config", "config_path", default=None, metavar="FILE",
                     help="A configuration written by `tilewise tune`: supplies allocator and memory policy (flags win)."),
        click.option("--data-dir", default=None, metavar="DIR",
                     help="Data cache (default: ~/.cache/tilewise/<benchmark>)."),
        click.option("--mem", default=None, metavar="POLICY", help="Override every policy's memory policy."),
        click.option("--mem-variants", "mem_variants", default=None, metavar="LIST",
                     help="The far-memory study: run each policy with its data in near memory, its far tier, "
                          "interleaved over both, weighted by bandwidth (near,far,interleave,weighted) and report each "
                          "query's slowdown against near memory with a verdict; on a machine without a far tier it "
                          "says so and runs nothing."),
        click.option("--layout", default=None, metavar="NAME",
                     help="Read the tables in place in this layout: csv or tbl (the generator's text), parquet (its "
                          "Parquet set), parquet-K[-rgN][-sorted-COL|+sorted-COL] (made once in the layout store, or "
                          "the one `data layout --apply` made there); answers are still checked against the Parquet "
                          "set's. Spark and Trino results then show how each table's files and row groups split over "
                          "the tiles."),
        click.option("--layout-dir", default=None, metavar="DIR",
                     help="The layout store for --layout (default: <data set directory>/layouts)."),
        click.option("--smt", is_flag=True, help="Use SMT siblings too (default: physical cores only)."),
        click.option("--worker-memory", default=None, metavar="SIZE", cls=LazyHelpOption,
                     help_text=lambda: memory_help("The engine's memory per worker or instance, e.g. 2g")),
        click.option("--exchange", default=None, metavar="NAME", cls=LazyHelpOption, help_text=exchange_help),
        click.option("--query-timeout", "query_timeout", type=SECONDS, default=None, metavar="S",
                     help="Give up on a query after S seconds: it is reported as failed with that reason, never as "
                          "valid, and the others still run (the engine cancels it where it can: PostgreSQL's "
                          "statement_timeout)."),
        click.option("--no-warmup", is_flag=True, help="Skip the warm-up run."),
        click.option("--no-plots", is_flag=True, help="Do not write PNG plots."),
        click.option("--inject-wrong-answer", "inject", default=None, hidden=True,
                     help="Test hook: corrupt these queries' answers before validation, e.g. 6."),
        json_option,
    ]

    def command(other, **kw):
        if other is not None:
            raise UsageError(f"--benchmark is gone: each benchmark has its own command (`tilewise bench {name}` "
                             f"runs {own.title})", f"use `tilewise bench {other}` with the same options")
        _run(name, **kw)

    command.__doc__ = _help(own)
    for opt in reversed(opts):
        command = opt(command)
    return _modes(own)(click.command(name)(command))


def _modes(own):
    """Which options go with which choices of the benchmark's command (cli/modes.py)."""
    from tilewise.bench.harness import parse_tests

    rules = [
        modes.Mode("the throughput test (--tests with throughput)", lambda a: "throughput" in parse_tests(a["tests"]),
                   ("streams",)),
        modes.Mode("--layout", lambda a: a["layout"] is not None, ("layout_dir",)),
    ]
    if own.params is not None and own.params.fixed:
        drawn = [c for c in own.params.choices if c not in own.params.fixed]
        rules.append(modes.Mode(f"drawn parameters (--params {' or '.join(drawn)})",
                                lambda a: own.params.seeded(a["qparams"]), ("seed",),
                                hint=f"--params {' or '.join(own.params.fixed)} draws nothing; drop --seed"))
    return modes.declare(*rules)


def _help(spec) -> str:
    """The command's help, from the benchmark's spec."""
    text = f"""Run {spec.title} under each deployment policy: per run a power test and a throughput test
    (with the refresh functions where the benchmark has them and the engine can write), every answer
    validated; report per-query times, speedups and {', '.join(t for _, t in spec.metrics.names)}."""
    example = f"tilewise bench {spec.name} --sf 1 --policies wim,wic,auto --runs 3 --out results/{spec.name}"
    return f"{text}\n\n    \b\n    Example: {example}\n    "


def _run(benchmark, *, engine, sf, policies, streams, tests, refresh, runs, out_dir, topology_src, query_list,
         allocator, config_path, data_dir, mem, smt, worker_memory, no_warmup, no_plots, inject, as_json,
         qparams=None, seed=None, data_seed=None, mem_variants=None, layout=None, layout_dir=None,
         query_timeout=None, exchange=None):
    from tilewise.bench import far_memory, harness

    spec = benchmarks.get(benchmark)
    for flag, value, takes in (("--params", qparams, "params"), ("--seed", seed, "seed"),
                               ("--data-seed", data_seed, "data_seed")):
        benchmarks.check_flag(spec, flag, value, takes)
    if config_path:  # a tuned configuration (tilewise tune): explicit flags win
        from tilewise.tune.knobs import load_config

        tuned = load_config(config_path).config
        allocator = allocator or tuned.allocator
        mem = mem or tuned.mem
    allocator = allocator or "system"
    cfg = harness.Config(
        engine=engine, benchmark=spec.name, params=qparams,
        seed=check_seed(seed) if seed is not None else 0,
        data_seed=spec.data.check_seed(data_seed) if data_seed is not None else 0, sf=spec.data.check_sf(sf),
        policies=policies, streams=streams, runs=runs, out=out_dir,
        tests=harness.parse_tests(tests), refresh=refresh,
        topology_src=topology_src, queries=spec.catalog.parse(query_list), allocator=allocator,
        data_dir=data_dir, smt=smt, mem=mem, warmup=not no_warmup, plots=not no_plots,
        inject_wrong=tuple(spec.catalog.parse(inject)) if inject else (), worker_memory=worker_memory,
        mem_variants=far_memory.parse_variants(mem_variants) if mem_variants is not None else (),
        layout=layout, layout_dir=layout_dir, query_timeout_s=query_timeout, exchange=exchange,
    )
    out = console(wide=True)
    with _RichReporter(quiet=False) as rep:
        try:
            doc = harness.run(cfg, rep)
        except harness.WrongAnswer:
            _final(out, cfg, as_json, failed=True)
            raise
    _final(out, cfg, as_json, failed=False, doc=doc)



def _final(out, cfg, as_json: bool, failed: bool, doc: dict | None = None) -> None:
    from pathlib import Path

    from tilewise.results import model, report

    path = Path(cfg.out) / "results.json"
    if doc is None:
        try:
            doc = model.load(path)
        except Exception:
            return
    if as_json:
        emit_json(doc)
        return
    report.render(doc, out)
    if failed:
        err = console(stderr=True)
        for w in doc.get("validation", {}).get("wrong_answers", []):
            err.print(f"[bold red]WRONG ANSWER[/bold red] {w}", highlight=False)
    extra = [*report.csv_files(doc), *(Path(p).name for p in doc.get("plots", []))]
    out.print(f"report: {path.resolve()}" + (f" (+ {', '.join(extra)})" if extra else ""), markup=False)
