"""`tilewise bench elastic`: TPC-H Q6 / mixed clients on DuckDB, with and without the elastic allocator."""

from __future__ import annotations

import click

from tilewise.cli.common import AT_LEAST_1, PERCENT, SECONDS, SEED, console, emit_json, json_option, topology_option
from tilewise.errors import UsageError


@click.command("elastic")
@click.option("--sf", default="0.1", show_default=True, help="TPC-H scale factor.")
@click.option("--clients", "-c", type=AT_LEAST_1, default=4, show_default=True, help="Concurrent clients (threads in the DuckDB process).")
@click.option("--duration", type=SECONDS, default=10.0, show_default=True, help="Seconds each case runs its clients.")
@click.option("--workloads", default="q6,mixed", show_default=True, help="q6 (every client loops Q6), mixed (random of the 22).")
@click.option("--configs", default="os,dense,sparse,adaptive", show_default=True,
              help="os = no allocator (all cores); dense/sparse/adaptive = the elastic daemon in that mode.")
@click.option("--interval", type=SECONDS, default=0.1, show_default=True, help="Daemon tick (s).")
@click.option("--th-min", type=PERCENT, default=10.0, show_default=True,
              help="Release a core at or below this load (%).")
@click.option("--th-max", type=PERCENT, default=70.0, show_default=True,
              help="Add a core at or above this load (%).")
@click.option("--data-dir", default=None, metavar="DIR", help="TPC-H Parquet cache (default: ~/.cache/tilewise/tpch).")
@click.option("--out", "out_dir", default="results/elastic", show_default=True, metavar="DIR",
              help="results.json, elastic.png and logs/<case>.jsonl go here.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Seed of the mixed stream.")
@click.option("--no-plot", is_flag=True, help="Skip elastic.png.")
@topology_option
@json_option
def bench_elastic(sf, clients, duration, workloads, configs, interval, th_min, th_max, data_dir, out_dir, seed,
                  no_plot, topology_src, as_json):
    """N clients on one DuckDB process: throughput, latency, CPU-seconds and cores over time,
    without the allocator (os) and with it (dense, sparse, adaptive).

    \b
    tilewise bench elastic --sf 0.1 --clients 4 --duration 10
    """
    from tilewise import topology
    from tilewise.benchmarks.tpch import data as tpch_data
    from tilewise.elastic import experiment as ex
    from tilewise.environment import system_check
    from tilewise.results import model, report
    from tilewise.results.output import Writer

    if th_min >= th_max:
        raise UsageError(f"--th-min must be below --th-max (got {th_min:g}, {th_max:g})")
    wl = ex.check_choice(workloads, ex.WORKLOADS, "workload")
    cf = ex.check_choice(configs, ex.CONFIGS, "config")
    sf_v = tpch_data.check_sf(sf)
    t = topology.load(topology_src)
    if not topology.is_live(t):
        raise UsageError("bench elastic runs processes: it needs this machine's topology", "drop --topology")
    writer = Writer(out_dir, plots=False)
    out = writer.dir
    say = console(stderr=True)
    data = tpch_data.ensure_data(sf_v, data_dir)
    threads = len(__import__("os").sched_getaffinity(0))
    params = {"sf": sf_v, "clients": clients, "duration_s": duration, "interval_s": interval,
              "th_min": th_min, "th_max": th_max, "duckdb_threads": threads, "seed": seed,
              "workloads": wl, "configs": cf}
    doc = model.new("elastic", topo=t, engines={"duckdb": _duckdb_version()}, allocator="system",
                    system_check=system_check(numa_nodes=len(t.cpu_nodes)), params=params)
    doc.update({"notes": _notes(t), "cases": []})
    try:
        for w in wl:
            tables, queries = ex.tables_for(w, data), ex.queries_for(w)
            for c in cf:
                if not as_json:
                    say.print(f"{w} / {c}: {clients} clients for {duration:g} s ...", markup=False)
                case = ex.run_case(config=c, workload=w, tables=tables, queries=queries, clients=clients,
                                   duration=duration, interval=interval, topo=t, th_min=th_min, th_max=th_max,
                                   threads=threads, log_path=out / "logs" / f"{w}-{c}.jsonl", seed=seed)
                doc["cases"].append(case)
                writer.write(doc)  # a late failure loses nothing
    except BaseException as e:
        model.stopped(doc, e)
        writer.write(doc)
        raise
    model.finish(doc, complete=True)
    writer.write(doc, plots=not no_plot)
    if as_json:
        emit_json({k: v for k, v in doc.items() if k != "cases"} |
                  {"cases": [{k: v for k, v in c.items() if k != "raw"} for c in doc["cases"]]})
        return
    c = console(wide=True)
    report.render(doc, c)
    c.print(f"results: {out / 'results.json'}" + (f", plot: {doc['plots'][0]}" if doc.get("plots") else "")
            + f", daemon logs: {out / 'logs'}", markup=False)


def _duckdb_version() -> str:
    try:
        import duckdb

        return duckdb.__version__
    except ImportError:  # pragma: no cover
        return "missing"


def _notes(t) -> list[str]:
    notes = []
    if len(t.cpu_nodes) < 2:
        notes.append("one NUMA node: dense, sparse and adaptive choose the same cores here; only the elastic "
                     "sizing (how many cores) differs from os, not where they are")
    if len(t.usable_cores()) <= 2:
        notes.append(f"{len(t.usable_cores())} cores: the allocator can only move between 1 and "
                     f"{len(t.usable_cores())} cores; the paper's gains (locality over 16+ cores, 4 sockets) cannot show")
    notes.append("no hardware counters here: L3 misses, interconnect traffic and remote/local ratios are not measured")
    return notes
