"""`tilewise bench elastic`: TPC-H Q6 / mixed clients on one engine instance (DuckDB by default; a
process tree such as PostgreSQL's server the same way), static (all cores) and with the elastic
allocator; the use case is tilewise.elastic.experiment.run."""

from __future__ import annotations

import click

from tilewise import benchmarks, engines
from tilewise.cli.common import (AT_LEAST_1, NON_NEGATIVE, PERCENT, SECONDS, SEED, Messages, console, emit_json,
                                 json_option, topology_option)
from tilewise.cli.engines import EngineChoice, LazyHelpOption


@click.command("elastic")
@click.option("--engine", "-e", default=engines.DEFAULT_BENCH, show_default=True,
              type=EngineChoice(lambda s: s.capabilities.replicas),
              help="The DBMS: one instance of a replica engine (one process, or a server's process tree).")
@click.option("--benchmark", "-b", default="tpch", show_default=True, metavar="NAME", cls=LazyHelpOption,
              help_text=lambda: f"Whose data and queries: {', '.join(benchmarks.names())}.")
@click.option("--sf", default="0.1", show_default=True, help="The benchmark's scale factor.")
@click.option("--clients", "-c", type=AT_LEAST_1, default=4, show_default=True,
              help="Concurrent clients (threads of tilewise querying the engine instance).")
@click.option("--duration", type=SECONDS, default=10.0, show_default=True, help="Seconds each case runs its clients.")
@click.option("--idle", type=NON_NEGATIVE, default=1.0, show_default=True,
              help="Seconds without load before and after the clients: the load steps the reaction is measured on.")
@click.option("--workloads", default="q6,mixed", show_default=True,
              help="q6 (every client loops the benchmark's query 6), mixed (random of the queries).")
@click.option("--queries", "query_list", default=None, metavar="LIST",
              help="The mixed workload's queries, e.g. 1,3,5-7 (default: all of the benchmark's).")
@click.option("--configs", default="os,dense,sparse,adaptive", show_default=True,
              help="os = static, no allocator (all cores); dense/sparse/adaptive = the elastic daemon in that mode.")
@click.option("--interval", type=SECONDS, default=0.1, show_default=True, help="Daemon tick (s).")
@click.option("--th-min", type=PERCENT, default=10.0, show_default=True,
              help="Release a core at or below this load (%).")
@click.option("--th-max", type=PERCENT, default=70.0, show_default=True,
              help="Add a core at or above this load (%).")
@click.option("--data-dir", default=None, metavar="DIR",
              help="The benchmark's data cache (default: ~/.cache/tilewise/<benchmark>).")
@click.option("--out", "out_dir", default="results/elastic", show_default=True, metavar="DIR",
              help="results.json, elastic.png and logs/<case>.jsonl go here.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Seed of the mixed stream.")
@click.option("--no-plot", is_flag=True, help="Skip elastic.png.")
@topology_option
@json_option
def bench_elastic(engine, benchmark, sf, clients, duration, idle, workloads, query_list, configs, interval, th_min, th_max, data_dir,
                  out_dir, seed, no_plot, topology_src, as_json):
    """N clients on one engine instance (DuckDB by default): throughput, latency, CPU-seconds, cores
    allocated and used over time, and the reaction to a load step, static (os: every core) and with
    the allocator (dense, sparse, adaptive). An instance that is a process tree (PostgreSQL's
    postmaster and its backends) is managed whole, processes born during the run included.

    \b
    tilewise bench elastic --sf 0.1 --clients 4 --duration 10
    tilewise bench elastic --engine postgres --sf 1 --workloads mixed --queries 1,3,5,6,10,12,14
    tilewise bench elastic --benchmark jcch --sf 0.1 --workloads mixed
    """
    from tilewise.elastic import experiment as ex
    from tilewise.results import report

    cfg = ex.Config(engine=engine, benchmark=benchmark, sf=sf, clients=clients, duration=duration, workloads=workloads, configs=configs,
                    queries=query_list, interval=interval, th_min=th_min, th_max=th_max, idle=idle, data_dir=data_dir,
                    out=out_dir, seed=seed, plots=not no_plot, topology_src=topology_src)
    doc = ex.run(cfg, Messages(quiet=as_json))
    if as_json:
        emit_json({k: v for k, v in doc.items() if k != "cases"} |
                  {"cases": [{k: v for k, v in c.items() if k != "raw"} for c in doc["cases"]]})
        return
    c = console(wide=True)
    report.render(doc, c)
    files = doc.get("files") or {}
    c.print(f"results: {files.get('json')}" + (f", plot: {doc['plots'][0]}" if doc.get("plots") else "")
            + f", daemon logs: {files.get('logs')}", markup=False)
