"""`tilewise data`: generate benchmark data sets (TPC-H, JCC-H) and check JCC-H against its spec."""

from __future__ import annotations

import click

from tilewise.cli import LazyGroup
from tilewise.cli.common import ProgressBars, console, emit_json, json_option

BENCHMARKS = ("tpch", "jcch")

benchmark_option = click.option("--benchmark", "-b", type=click.Choice(BENCHMARKS), default="tpch", show_default=True,
                                help="tpch: TPC-H (tpchgen-cli); jcch: JCC-H, TPC-H with join-crossing correlations and skew.")
sf_option = click.option("--sf", default="1", show_default=True, help="Scale factor (> 0; JCC-H needs >= 0.01).")
data_dir_option = click.option("--data-dir", default=None, metavar="DIR",
                               help="Data cache root (default: ~/.cache/tilewise/tpch or ~/.cache/tilewise/jcch).")
seed_option = click.option("--seed", default=None, metavar="S",
                           help="JCC-H only: seed of the generator's random streams (default 0).")


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
    """Generate the 8 tables as Parquet (cached: a valid set is reused, never half-written).

    Example: tilewise data generate --benchmark jcch --sf 1 --seed 0
    """
    import time

    from tilewise.data import dataset_for, store

    t0 = time.monotonic()
    with DataProgress() as prog:
        ds = dataset_for(benchmark, sf, data_dir, seed=seed, log=prog.message, progress=prog)
    man = store.read_manifest(ds.dir) or {}
    doc = {"dir": str(ds.dir), **ds.to_json(), "generator": man.get("generator"),
           "rows": {t: v["rows"] for t, v in man.get("tables", {}).items()},
           "bytes": ds.parquet_bytes(), "seconds": round(time.monotonic() - t0, 2),
           "generated_s": man.get("generated_s")}
    if as_json:
        emit_json(doc)
        return
    rows = sum(doc["rows"].values())
    click.echo(f"{ds.label}: {ds.dir}")
    click.echo(f"  8 tables, {rows:,} rows, {doc['bytes'] / 1e6:,.1f} MB Parquet ({doc['generator']}; "
               f"generation took {doc['generated_s']} s)" if doc["generated_s"] is not None else
               f"  8 tables, {rows:,} rows, {doc['bytes'] / 1e6:,.1f} MB Parquet ({doc['generator']})")


@click.command("check")
@click.option("--benchmark", "-b", type=click.Choice(["jcch"]), default="jcch", show_default=True,
              help="Only JCC-H has a specification to check against.")
@sf_option
@data_dir_option
@seed_option
@click.option("--dir", "set_dir", default=None, metavar="DIR",
              help="Check the tables in DIR instead of the cached set (e.g. the reference dbgen's, as Parquet).")
@click.option("--generate", "gen", is_flag=True, help="Generate the set first when it is not cached.")
@json_option
def check_cmd(benchmark, sf, data_dir, seed, set_dir, gen, as_json):
    """Check a JCC-H set against every hard invariant and statistical target of its specification.

    Exits 1 when one fails. Example: tilewise data check --benchmark jcch --sf 1
    """
    from pathlib import Path

    from tilewise.data import jcch, jcch_check, table_paths
    from tilewise.errors import TilewiseError, UsageError

    sf_v = jcch.check_sf(sf)
    seed_v = jcch.check_seed(jcch.DEFAULT_SEED if seed is None else seed)
    if set_dir:
        d = Path(set_dir)
        missing = [t for t, p in table_paths(d).items() if not p.exists()]
        if missing:
            raise UsageError(f"{d} has no {missing[0]}.parquet", "point --dir at a folder with the 8 tables as Parquet")
    else:
        d = jcch.set_dir(sf_v, seed_v, data_dir)
        if not jcch.is_valid(d):
            if not gen:
                raise UsageError(f"no JCC-H SF {sf_v:g} seed {seed_v} data in {d}",
                                 f"run `tilewise data generate --benchmark jcch --sf {sf_v:g} --seed {seed_v}` "
                                 "or add --generate")
            with DataProgress() as prog:
                d = jcch.ensure_data(sf_v, data_dir, seed=seed_v, log=prog.message, progress=prog)
    with console(stderr=True).status("checking"):
        results = jcch_check.run(d, sf_v)
    bad = jcch_check.failed(results)
    if as_json:
        emit_json({"dir": str(d), "sf": sf_v, "seed": None if set_dir else seed_v, "ok": not bad,
                   "failed": len(bad), "checks": [r.to_json() for r in results]})
    else:
        render(results, f"JCC-H SF {sf_v:g} in {d}")
    if bad:
        raise TilewiseError(f"{len(bad)} of {len(results)} JCC-H check(s) failed: {bad[0].id} = {bad[0].value} "
                            f"(expected {bad[0].expected})")


def render(results, title: str, out=None) -> None:
    from rich.table import Table

    out = out or console()
    if not out.is_terminal:
        out.width = max(out.width, 150)  # a report piped to a file: one line per check
    for kind, heading in (("invariant", "hard invariants"), ("target", "statistical targets (SF 1 reference)")):
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


class DataGroup(LazyGroup):
    registry = {"generate": "tilewise.cli.data:generate_cmd", "check": "tilewise.cli.data:check_cmd"}


@click.group("data", cls=DataGroup)
def data() -> None:
    """Benchmark data sets: generate TPC-H or JCC-H as Parquet, check JCC-H against its specification."""
