"""`tilewise bench tpch`: TPC-H per deployment policy, validated, with results.json/CSV/plots."""

from __future__ import annotations

import click

from tilewise import engines
from tilewise.cli.common import AT_LEAST_1, ProgressBars, console, emit_json, json_option, topology_option
from tilewise.cli.engines import LazyHelpOption, memory_help


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


@click.command("tpch")
@click.option("--engine", "-e", default=engines.DEFAULT_BENCH, show_default=True, cls=LazyHelpOption,
              help_text=lambda: f"Engine: {', '.join(engines.names())} (`tilewise engines list`).")
@click.option("--benchmark", "-b", type=click.Choice(["tpch", "jcch"]), default="tpch", show_default=True,
              help="tpch, or jcch: JCC-H, TPC-H with skewed data and join-crossing correlations (docs/jcch.md).")
@click.option("--params", "qparams", type=click.Choice(["skewed", "normal"]), default=None,
              help="JCC-H query parameters: skewed (default; they hit the skew) or normal (they avoid it).")
@click.option("--seed", default=None, metavar="S",
              help="JCC-H: seed of the query parameters; each stream draws its own (default 0).")
@click.option("--data-seed", default=None, metavar="S", help="JCC-H: seed of the data generator (default 0).")
@click.option("--sf", default="1", show_default=True, help="Scale factor (> 0; JCC-H >= 0.01), e.g. 1 or 0.01.")
@click.option("--policies", "-p", default="wim,wic,auto", show_default=True,
              help="Comma-separated deployment policies; the first is the baseline (n=K for K instances).")
@click.option("--streams", "-s", type=AT_LEAST_1, default=None,
              help="Query streams of the throughput test (default: the TPC-H minimum for the SF, 2 at SF 1, and at "
                   "least one per instance on engines whose instances are replicas: `tilewise engines list`).")
@click.option("--tests", "tests", default="power,throughput", show_default=True, metavar="LIST",
              help="TPC-H tests per run: power (1 stream, RF1, queries, RF2), throughput (S streams + a refresh stream).")
@click.option("--refresh/--no-refresh", "refresh", default=None,
              help="Run the refresh functions RF1/RF2 (default: where the engine can write its tables).")
@click.option("--runs", "-r", type=AT_LEAST_1, default=3, show_default=True, help="Timed runs after one warm-up run.")
@click.option("--out", "-o", "out_dir", default="tpch-results", show_default=True, metavar="DIR",
              help="Where results.json, results.csv and the plots go.")
@topology_option
@click.option("--queries", "-q", "query_list", default=None, metavar="LIST", help="Subset, e.g. 1,6,10-12 (default: all 22).")
@click.option("--allocator", default=None,
              help="Memory allocator preloaded into every instance: system (default), jemalloc, tcmalloc, mimalloc, tbbmalloc.")
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="A configuration written by `tilewise tune`: supplies allocator and memory policy (flags win).")
@click.option("--data-dir", default=None, metavar="DIR",
              help="Data cache (default: ~/.cache/tilewise/tpch, or ~/.cache/tilewise/jcch for JCC-H).")
@click.option("--mem", default=None, metavar="POLICY", help="Override every policy's memory policy.")
@click.option("--smt", is_flag=True, help="Use SMT siblings too (default: physical cores only).")
@click.option("--worker-memory", default=None, metavar="SIZE", cls=LazyHelpOption,
              help_text=lambda: memory_help("The engine's memory per worker or instance, e.g. 2g"))
@click.option("--no-warmup", is_flag=True, help="Skip the warm-up run.")
@click.option("--no-plots", is_flag=True, help="Do not write PNG plots.")
@click.option("--inject-wrong-answer", "inject", default=None, hidden=True,
              help="Test hook: corrupt these queries' answers before validation, e.g. 6.")
@json_option
def tpch(engine, benchmark, qparams, seed, data_seed, sf, policies, streams, tests, refresh, runs, out_dir, topology_src, query_list, allocator, config_path, data_dir, mem,
         smt, worker_memory, no_warmup, no_plots, inject, as_json):
    """Run TPC-H under each deployment policy: per run a power test and a throughput test (with the
    refresh functions where the engine can write), every answer validated; report per-query times,
    speedups, Power@Size, Throughput@Size and QphH@Size. --benchmark jcch runs JCC-H instead:
    skewed data and qgen's skewed or normal parameters, drawn per stream.

    \b
    Example: tilewise bench tpch --sf 1 --policies wim,wic,auto --runs 3 --out results/tpch
             tilewise bench tpch --benchmark jcch --params skewed --sf 1 --out results/jcch
    """
    from tilewise.bench import queries as Q
    from tilewise.bench import tpch as harness
    from tilewise.errors import UsageError

    if benchmark == "tpch":
        given = [f for f, v in (("--params", qparams), ("--seed", seed), ("--data-seed", data_seed)) if v is not None]
        if given:
            raise UsageError(f"{given[0]} applies to --benchmark jcch only", f"drop {given[0]} for TPC-H")
    from tilewise.data import jcch, tpch as tpch_data

    check_sf = jcch.check_sf if benchmark == "jcch" else tpch_data.check_sf

    if config_path:  # a tuned configuration (tilewise tune): explicit flags win
        from tilewise.tune.knobs import load_config

        tuned = load_config(config_path).config
        allocator = allocator or tuned.allocator
        mem = mem or tuned.mem
    allocator = allocator or "system"
    cfg = harness.Config(
        engine=engine, benchmark=benchmark, params=qparams,
        seed=jcch.check_seed(seed) if seed is not None else 0,
        data_seed=jcch.check_seed(data_seed) if data_seed is not None else 0, sf=check_sf(sf), policies=policies, streams=streams, runs=runs, out=out_dir,
        tests=harness.parse_tests(tests), refresh=refresh,
        topology_src=topology_src, queries=Q.parse_selection(query_list), allocator=allocator,
        data_dir=data_dir, smt=smt, mem=mem, warmup=not no_warmup, plots=not no_plots,
        inject_wrong=tuple(Q.parse_selection(inject)) if inject else (), worker_memory=worker_memory,
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
