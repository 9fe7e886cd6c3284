"""`tilewise bench elastic`: TPC-H Q6 / mixed clients on DuckDB, with and without the elastic allocator."""

from __future__ import annotations

from pathlib import Path

import click

from tilewise.cli.common import console, emit_json, json_option, topology_option
from tilewise.errors import UsageError
from tilewise.fsutil import ensure_writable_dir


@click.command("elastic")
@click.option("--sf", default="0.1", show_default=True, help="TPC-H scale factor.")
@click.option("--clients", "-c", type=int, default=4, show_default=True, help="Concurrent clients (threads in the DuckDB process).")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds each case runs its clients.")
@click.option("--workloads", default="q6,mixed", show_default=True, help="q6 (every client loops Q6), mixed (random of the 22).")
@click.option("--configs", default="os,dense,sparse,adaptive", show_default=True,
              help="os = no allocator (all cores); dense/sparse/adaptive = the elastic daemon in that mode.")
@click.option("--interval", type=float, default=0.1, show_default=True, help="Daemon tick (s).")
@click.option("--th-min", type=float, default=10.0, show_default=True)
@click.option("--th-max", type=float, default=70.0, show_default=True)
@click.option("--data-dir", default=None, metavar="DIR", help="TPC-H Parquet cache (default: ~/.cache/tilewise/tpch).")
@click.option("--out", "out_dir", default="results/elastic", show_default=True, metavar="DIR",
              help="results.json, elastic.png and logs/<case>.jsonl go here.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the mixed stream.")
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
    from tilewise.bench import results as bres
    from tilewise.data import tpch as tpch_data
    from tilewise.elastic import experiment as ex

    if clients < 1:
        raise UsageError("--clients must be at least 1")
    if duration <= 0 or interval <= 0:
        raise UsageError("--duration and --interval must be positive")
    wl = ex.check_choice(workloads, ex.WORKLOADS, "workload")
    cf = ex.check_choice(configs, ex.CONFIGS, "config")
    sf_v = tpch_data.check_sf(sf)
    t = topology.load(topology_src)
    if not topology.is_live(t):
        raise UsageError("bench elastic runs processes: it needs this machine's topology", "drop --topology")
    out = ensure_writable_dir(out_dir)
    say = console(stderr=True)
    data = tpch_data.ensure_data(sf_v, data_dir)
    threads = len(__import__("os").sched_getaffinity(0))
    doc = {"format": ex.FORMAT,
           "environment": bres.environment(t, engine="duckdb", engine_version=_duckdb_version(), allocator="system"),
           "params": {"sf": sf_v, "clients": clients, "duration_s": duration, "interval_s": interval,
                      "th_min": th_min, "th_max": th_max, "duckdb_threads": threads, "seed": seed,
                      "workloads": wl, "configs": cf},
           "notes": _notes(t), "cases": []}
    for w in wl:
        tables, queries = ex.tables_for(w, data), ex.queries_for(w)
        for c in cf:
            if not as_json:
                say.print(f"{w} / {c}: {clients} clients for {duration:g} s ...", markup=False)
            case = ex.run_case(config=c, workload=w, tables=tables, queries=queries, clients=clients, duration=duration,
                               interval=interval, topo=t, th_min=th_min, th_max=th_max, threads=threads,
                               log_path=out / "logs" / f"{w}-{c}.jsonl", seed=seed)
            doc["cases"].append(case)
            ex.write_atomic(out / "results.json", doc)  # a late failure loses nothing
    if not no_plot:
        doc["plot"] = str(ex.plot(doc, out / "elastic.png"))
        ex.write_atomic(out / "results.json", doc)
    if as_json:
        emit_json({k: v for k, v in doc.items() if k != "cases"} |
                  {"cases": [{k: v for k, v in c.items() if k != "raw"} for c in doc["cases"]]})
        return
    _table(doc, out)


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


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _table(doc: dict, out: Path) -> None:
    from rich.table import Table

    c = console()
    c.width = max(c.width, 140)
    tab = Table(show_edge=False, pad_edge=False)
    for col in ("workload", "config", "queries", "q/s", "p50 ms", "p95 ms", "CPU s", "CPU s/q", "cores mean",
                "core-s", "tick ms", "daemon %"):
        tab.add_column(col, justify="right" if col not in ("workload", "config") else "left")
    for r in doc["cases"]:
        dm = r["daemon"] or {}
        tab.add_row(r["workload"], r["config"], str(r["queries_done"]), f"{r['throughput_qps']:.1f}",
                    _f(r["latency_ms"]["p50"], ".1f"), _f(r["latency_ms"]["p95"], ".1f"), f"{r['cpu_s']:.2f}",
                    _f(r["cpu_s_per_query"], ".4f"), f"{r['cores_mean']:.2f}/{r['cores_total']}",
                    f"{r['core_seconds_allocated']:.1f}",
                    str((dm.get("tick_cpu_ms") or {}).get("mean", "-")), str(dm.get("daemon_cpu_pct_of_core", "-")))
    c.print(tab)
    for n in doc["notes"]:
        c.print(f"note: {n}", markup=False)
    c.print(f"results: {out / 'results.json'}" + (f", plot: {doc['plot']}" if doc.get("plot") else "")
            + f", daemon logs: {out / 'logs'}", markup=False)
