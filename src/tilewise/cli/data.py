"""`tilewise data`: generate the data set of any registered benchmark (tilewise.benchmarks) and check
a set against its benchmark's specification, where it has one (JCC-H)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from tilewise import benchmarks, engines
from tilewise.cli import LazyGroup, modes
from tilewise.cli.common import (AT_LEAST_1, Messages, Number, ProgressBars, conflicts, console, emit_json,
                                 json_option, topology_option)
from tilewise.cli.engines import LazyHelpOption
from tilewise.data import store, table_paths
from tilewise.errors import TilewiseError, UsageError

_SPECS = benchmarks.loadable()
_CHECKED = [b for b in _SPECS if b.data.check_kinds]  # benchmarks with a specification to check a set against


def _rule(b) -> str:
    return f"{b.title} {b.data.sf_rule}"


benchmark_option = click.option("--benchmark", "-b", type=click.Choice(benchmarks.names()),
                                default=benchmarks.names()[0], show_default=True,
                                help="; ".join(f"{b.name}: {b.about}" for b in _SPECS) + ".")
sf_option = click.option("--sf", default="1", show_default=True,
                         help=f"Scale factor ({'; '.join(_rule(b) for b in _SPECS)}).")
data_dir_option = click.option("--data-dir", default=None, metavar="DIR",
                               help="Data cache root (default: ~/.cache/tilewise/<benchmark>).")
seed_option = click.option("--seed", default=None, metavar="S",
                           help=f"{' and '.join(b.title for b in _SPECS if b.data.seeded) or 'Seeded generators'} "
                                "only: seed of the generator's random streams (default 0).")


class DataProgress(ProgressBars):
    """Progress bars on stderr for data generation, one per table (plain lines when not a terminal)."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

        super().__init__(TextColumn("{task.description:<16}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
        self.tasks: dict[str, int] = {}

    def __call__(self, task: str, done: float, total: float | None) -> None:
        if task not in self.tasks:
            self.tasks[task] = self.progress.add_task(task, total=total)
        self.progress.update(self.tasks[task], completed=min(done, total) if total else done, total=total)


@click.command("generate")
@benchmark_option
@sf_option
@data_dir_option
@seed_option
@json_option
def generate_cmd(benchmark, sf, data_dir, seed, as_json):
    """Generate a benchmark's tables as Parquet (cached: a valid set is reused, never half-written).

    Example: tilewise data generate --benchmark jcch --sf 1 --seed 0
    """
    spec = benchmarks.get(benchmark)
    benchmarks.check_flag(spec, "--seed", seed, "data_seed", command="data")
    t0 = time.monotonic()
    with DataProgress() as prog:
        ds = spec.dataset(sf, data_dir, seed=seed, log=prog.message, progress=prog)
    man = store.read_manifest(ds.dir) or {}
    doc = {"dir": str(ds.dir), **ds.to_json(), "generator": man.get("generator"),
           "rows": {t: v["rows"] for t, v in man.get("tables", {}).items()},
           "bytes": ds.parquet_bytes(), "seconds": round(time.monotonic() - t0, 2),
           "generated_s": man.get("generated_s")}
    if as_json:
        emit_json(doc)
        return
    rows = sum(doc["rows"].values())
    what = f"  {len(ds.tables)} tables, {rows:,} rows, {doc['bytes'] / 1e6:,.1f} MB Parquet ({doc['generator']}"
    click.echo(f"{ds.label}: {ds.dir}")
    click.echo(f"{what}; generation took {doc['generated_s']} s)" if doc["generated_s"] is not None else f"{what})")


@modes.declare(
    modes.Mode("the cached set (without --dir)", lambda a: a["set_dir"] is None, ("data_dir", "seed", "gen"),
               hint="drop it (--dir names the tables to check)"),
)
@click.command("check")
@click.option("--benchmark", "-b", type=click.Choice([b.name for b in _CHECKED]),
              default=_CHECKED[0].name if _CHECKED else None, show_default=True,
              help=f"The benchmarks with a specification to check a set against: {', '.join(b.title for b in _CHECKED)}.")
@sf_option
@data_dir_option
@seed_option
@click.option("--dir", "set_dir", default=None, metavar="DIR",
              help="Check the tables in DIR instead of the cached set (e.g. the reference dbgen's, as Parquet).")
@click.option("--generate", "gen", is_flag=True, help="Generate the set first when it is not cached.")
@json_option
def check_cmd(benchmark, sf, data_dir, seed, set_dir, gen, as_json):
    """Check a set against every check of its benchmark's specification (JCC-H: every hard
    invariant and statistical target).

    Exits 1 when one fails. Example: tilewise data check --benchmark jcch --sf 1
    """
    spec = benchmarks.get(benchmark)
    benchmarks.check_flag(spec, "--seed", seed, "data_seed", command="data")
    data = spec.data
    sf_v = data.check_sf(sf)
    seed_v = data.check_seed(data.default_seed if seed is None else seed) if data.seeded else None
    shown = f"{spec.title} SF {sf_v:g}" + (f" seed {seed_v}" if seed_v is not None else "")
    if set_dir:
        from tilewise import userfiles

        d = Path(set_dir)
        paths = table_paths(d, data.tables)
        missing = [t for t, p in paths.items() if not p.exists() and not p.is_symlink()]
        if missing:
            raise UsageError(f"{d} has no {missing[0]}.parquet",
                             f"point --dir at a folder with the {len(data.tables)} tables as Parquet")
        for t, p in paths.items():  # every footer read before any check runs
            userfiles.parquet_file(p, f"table {t}:")
    else:
        d = data.set_dir(sf_v, seed_v, data_dir)
        if not data.is_valid(d):
            if not gen:
                seed_arg = f" --seed {seed_v}" if seed_v is not None else ""
                damage = store.problem(d, None, data.tables)
                if damage not in (None, "no set"):
                    raise UsageError(f"the {shown} data in {d} is damaged: {damage}",
                                     f"generate it again with --generate, or `tilewise data generate --benchmark "
                                     f"{spec.name} --sf {sf_v:g}{seed_arg}` (the damaged set is replaced)")
                raise UsageError(f"no {shown} data in {d}",
                                 f"run `tilewise data generate --benchmark {spec.name} --sf {sf_v:g}{seed_arg}` "
                                 "or add --generate")
            with DataProgress() as prog:
                d = spec.dataset(sf_v, data_dir, seed=seed_v, log=prog.message, progress=prog).dir
    with console(stderr=True).status("checking"):
        results = data.check(d, sf_v)
    bad = [r for r in results if not r.ok]
    if as_json:
        emit_json({"dir": str(d), "sf": sf_v, "seed": None if set_dir else seed_v, "ok": not bad,
                   "failed": len(bad), "checks": [r.to_json() for r in results]})
    else:
        render(results, f"{spec.title} SF {sf_v:g} in {d}", data.check_kinds)
    if bad:
        raise TilewiseError(f"{len(bad)} of {len(results)} {spec.title} check(s) failed: {bad[0].id} = {bad[0].value} "
                            f"(expected {bad[0].expected})")


def render(results, title: str, kinds: tuple[tuple[str, str], ...], out=None) -> None:
    from rich.table import Table

    out = out or console()
    if not out.is_terminal:
        out.width = max(out.width, 150)  # a report piped to a file: one line per check
    for kind, heading in kinds:
        t = Table(title=f"{title}: {heading}", show_edge=False, pad_edge=False, title_justify="left")
        for col in ("", "check", "what", "value", "expected"):
            t.add_column(col, overflow="fold")
        for r in results:
            if r.kind == kind:
                t.add_row("ok" if r.ok else "FAIL", r.id, r.what, str(r.value), r.expected,
                          style=None if r.ok else "bold red")
        out.print(t)
    n_bad = sum(1 for r in results if not r.ok)
    out.print(f"{len(results) - n_bad} of {len(results)} checks pass" + (f"; {n_bad} FAIL" if n_bad else ""),
              markup=False)


@modes.declare(
    modes.Mode("a benchmark's own tables (without --data)", lambda a: a["data_path"] is None,
               ("sf", "raw_format", "data_dir"), hint="drop it (--data names the tables)"),
    modes.Mode("a benchmark's queries (--benchmark)", lambda a: a["benchmark"] is not None, ("query_list",)),
)
@click.command("layout")
@click.option("--data", "data_path", default=None, metavar="DIR",
              help="A directory of raw tables: <table>.csv/.tbl/.json/.parquet or a folder of them per table "
                   "(columns from schema.json beside them, else inferred; TBL needs schema.json).")
@click.option("--benchmark", "-b", type=click.Choice(benchmarks.names()), default=None,
              help="Its queries are the workload (over --data, or over its own tables at --sf).")
@click.option("--sf", default=None, help="Without --data: the benchmark's tables at this scale factor, as its "
                                         "generator writes them as text (--raw).")
@click.option("--raw", "raw_format", type=click.Choice(["csv", "tbl"]), default="csv", show_default=True,
              help="Without --data: the text format of the benchmark's tables (TPC-H: tpchgen-cli csv|tbl).")
@data_dir_option
@click.option("--queries", "-q", "query_list", default=None, metavar="LIST",
              help="A subset of the benchmark's queries, e.g. 1,6,14,15,20 (default: all).")
@click.option("--sql", "sql_file", default=None, metavar="FILE",
              help="The workload as a file of SQL statements (each ending with ';') instead of a benchmark's queries.")
@click.option("--engine", "-e", default=None, metavar="ENGINE", cls=LazyHelpOption,
              help_text=lambda: "Engine that runs the workload, reading the files in place: "
                                + ", ".join(s.name for s in engines.specs(lambda s: s.capabilities.reads))
                                + f" (default {engines.DEFAULT_BENCH}).")
@click.option("--policy", "-p", default="auto", show_default=True, metavar="POLICY",
              help="Deployment policy: its tiles decide the file counts tried (multiples of the tiles).")
@click.option("--instances", "-k", type=AT_LEAST_1, default=None, help="Number of instances (policy n).")
@topology_option
@click.option("--layouts", "layout_list", default=None, metavar="LIST",
              help="Measure these layouts instead of the candidates, e.g. parquet-1,parquet-8,"
                   "parquet-8-sorted-l_shipdate,parquet-8+sorted-l_shipdate (the data as it is is always measured).")
@click.option("--runs", "-r", type=AT_LEAST_1, default=3, show_default=True,
              help="Measured runs per query and layout (after one unmeasured run that checks the answer).")
@click.option("--drop", type=click.Choice(["files", "system", "none"]), default="files", show_default=True,
              help="Page cache before every run: dropped per file of the layout (posix_fadvise), system-wide "
                   "(root), or none (warm).")
@click.option("--expected-runs", type=Number(min=0, min_open=True), default=None, metavar="N",
              help="The workload will run N times: recommend what is cheapest over N runs, making the layout included.")
@click.option("--max-file-mb", type=Number(min=0, min_open=True), default=200, show_default=True,
              help="Size bound per file (the thesis: Parquet files should stay under 200 MB).")
@click.option("--apply", "apply", is_flag=True, help="Make the recommended layout in the layout store (atomic, checked).")
@click.option("--apply-layout", default=None, metavar="NAME", help="Make this layout instead of the recommended one.")
@click.option("--layout-dir", default=None, metavar="DIR",
              help="The layout store (default: <data>/layouts when writable, else ~/.cache/tilewise/layouts).")
@click.option("--out", "-o", "out_dir", default=None, metavar="DIR", help="Write results.json and CSV files here.")
@json_option
def layout_cmd(data_path, benchmark, sf, raw_format, data_dir, query_list, sql_file, engine, policy, instances,
               topology_src, layout_list, runs, drop, expected_runs, max_file_mb, apply, apply_layout, layout_dir,
               out_dir, as_json):
    """Measure candidate layouts of a data set for a workload and recommend one (thesis 004, ch. 5).

    Candidates: the data as it is, Parquet with one file per table, K files per table (K a multiple
    of the plan's tiles, by size bounds), smaller row groups, sorted on the column the workload's
    predicates filter on most, and a sorted second copy. Per layout and query: time (median, 95 %
    CI), bytes read from storage (/proc/<pid>/io, page cache dropped per --drop), CPU-seconds; per
    layout what making it cost and its break-even in workload runs.

    \b
    Example: tilewise data layout --benchmark tpch --sf 1 --queries 1,6,14,15,20 --out results/layout
             tilewise data layout --data ./drop --sql queries.sql --apply
    """
    from tilewise.layout import session

    if apply_layout is not None:
        conflicts("--apply-layout", ["apply"], "--apply-layout names the layout to make; --apply makes the recommended one")
    if engine is not None:
        engines.get(engine)
    cfg = session.Config(
        data=data_path, benchmark=benchmark, sf=sf, raw_format=raw_format, data_dir=data_dir, queries=query_list,
        sql_file=sql_file, engine=engine or engines.DEFAULT_BENCH, policy=policy, instances=instances,
        topology_src=topology_src, layouts=_names(layout_list, "--layouts"), runs=runs, drop=drop,
        expected_runs=expected_runs, apply=apply, apply_layout=apply_layout, layout_dir=layout_dir, out=out_dir,
        max_file_mb=max_file_mb)
    doc = session.run(cfg, Messages(prefix="tilewise: "))
    if as_json:
        emit_json(doc)
        return
    from tilewise.results import report

    report.render(doc, console(wide=True))


def _names(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{flag} is empty", f"e.g. {flag} parquet-1,parquet-8")
    return names


class DataGroup(LazyGroup):
    registry = {"generate": "tilewise.cli.data:generate_cmd", "check": "tilewise.cli.data:check_cmd",
                "layout": "tilewise.cli.data:layout_cmd"}


@click.group("data", cls=DataGroup)
def data() -> None:
    """Benchmark data sets: generate any registered benchmark's as Parquet, check a set against its
    benchmark's specification, measure and make layouts of raw data (`data layout`)."""
