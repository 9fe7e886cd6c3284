"""`tilewise up / status / down`: a bound cluster that outlives the command.

Exit codes: 0 ok; 1 error; 2 bad usage; 3 (`status` only) the cluster is unhealthy (a crashed or
unbound instance); 130 interrupted (everything `up` had started was stopped).
"""

from __future__ import annotations

import sys
import time

import click

from tilewise import allocators, cpulist, launch, topology
from tilewise.cli.common import console, emit_json, json_option, topology_option
from tilewise.cli.plan import make_plan, plan_options
from tilewise.errors import UsageError

name_option = click.option("--name", default="default", show_default=True, help="Cluster name (several may run).")


@click.command("up")
@click.option("--engine", "-e", default="spark", show_default=True, help="spark (duckdb is embedded: see --help).")
@topology_option
@plan_options
@name_option
@click.option("--allocator", default="system", show_default=True,
              help=f"Preload an allocator into workers and executors: {', '.join(allocators.names())}.")
@click.option("--sf", default=None, help="Also make sure TPC-H data at this scale factor exists; print how to read it.")
@click.option("--data-dir", default=None, metavar="DIR", help="TPC-H data directory (default: the user cache).")
@click.option("--worker-memory", default=None, metavar="SIZE",
              help="Memory per worker, e.g. 8g (default: half of its NUMA node's memory, split between the "
                   "instances on that node, at most 31g).")
@click.option("--join", "join", default=None, metavar="URL",
              help="Start only the bound workers and register them with this master (spark://HOST:PORT).")
@click.option("--host", default=None, metavar="ADDR",
              help="Address the processes bind to (default 127.0.0.1; with --join, the one that reaches the master).")
@json_option
def up_cmd(engine, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, name,
           allocator, sf, data_dir, worker_memory, join, host, as_json):
    """Start a bound cluster (one Spark worker per plan instance) that keeps running; print how to connect.

    duckdb is not supported here: it is embedded, there is no server to keep running; use
    `tilewise exec` (a bound program) or `tilewise bench tpch --engine duckdb`.
    """
    from tilewise import cluster
    from tilewise.engines import spark_cluster as sc

    cluster.check_name(name)
    allocators.get(allocator)
    engine = engine.lower()
    if engine not in ("spark", "duckdb"):
        raise UsageError(f"unknown engine {engine!r}", "choose spark (duckdb is embedded: use tilewise exec)")
    per_mb = sc.parse_size_mb(worker_memory) if worker_memory else None
    t = topology.load(topology_src)
    p = make_plan(t, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed)
    launch.ensure_runnable(p)
    if per_mb:
        memory = {i.id: per_mb for i in p.instances}
    else:
        memory = sc.worker_memory_mb(p, {n.id: n.memory_bytes for n in t.numa_nodes})
    err = console(stderr=True)
    log = (lambda msg: err.print(f"tilewise: {msg}", markup=False)) if not as_json else None
    data = {}
    if sf is not None:
        from tilewise.data import tpch as tpch_data
        from tilewise.engines.spark import find_tables

        d = tpch_data.ensure_data(sf, data_dir, log=log)
        data = {"sf": float(sf), "dir": str(d), "tables": find_tables(d)}
    t0 = time.monotonic()
    st = cluster.up(p, engine=engine, name=name, allocator=allocator, worker_memory_mb=memory, join=join,
                    host=host, data=data, log=log)
    doc = cluster.status(st)
    doc["startup_s"] = round(time.monotonic() - t0, 2)
    doc["connect"] = connect_hints(st)
    if as_json:
        emit_json(doc)
        return
    print_status(doc)
    out = console()
    out.print(f"started in {doc['startup_s']:.1f} s; it keeps running until `tilewise down --name {name}`", markup=False)
    for line in doc["connect"]:
        out.print(line, markup=False)


def connect_hints(st) -> list[str]:
    url = st.master_url
    if st.joined:
        return [f"workers joined {url}; submit jobs to that master as usual"]
    cores = sum(len(i["cpus"]) for i in st.plan.get("instances", []))
    lines = [
        f"master: {url} (loopback only; UI off)",
        f"connect: pyspark --master {url} --conf spark.sql.shuffle.partitions={cores}",
        f"   or:   SparkSession.builder.master('{url}').config('spark.driver.host', '127.0.0.1').getOrCreate()",
        "each worker runs one executor with all of its cores (leave spark.executor.cores unset); "
        "executors inherit the worker's binding",
        f"more workers from other machines: tilewise up --engine spark --policy P --join spark://<this host>:{url.rsplit(':', 1)[1]} "
        "(start this master with --host <routable address> for that)",
    ]
    if st.data:
        lines.append(f"TPC-H SF {st.data['sf']:g}: spark.read.parquet('{st.data['dir']}/lineitem.parquet') (and the 7 others)")
    return lines


def print_status(doc: dict) -> None:
    from rich.table import Table

    out = console()
    health = "healthy" if doc["healthy"] else "UNHEALTHY"
    out.print(f"cluster {doc['name']} ({doc['engine']}, policy {doc['policy']}): {health}; master {doc['master_url']}",
              markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for col in ("process", "pid", "cpus", "memory", "heap", "executors", "binding", "health"):
        table.add_column(col, overflow="fold")
    for m in doc["members"]:
        who = m["role"] if m["instance"] is None else f"{m['role']} {m['instance']}"
        mem = m["mem_policy"] + (f" {cpulist.format(m['mem_nodes'])}" if m["mem_nodes"] and
                                 m["mem_policy"] not in ("first-touch", "local") else "")
        execs = ",".join(str(e["pid"]) for e in m["executors"]) or "-"
        binding = ("-" if not m.get("alive") else
                   {True: "verified", False: "MISMATCH", None: "not checkable"}[m["binding_verified"]])
        heal = "ok" if m["healthy"] else ("UNHEALTHY" if m.get("alive") else "DEAD")
        table.add_row(who, str(m["pid"]), m["cpus"], mem, f"{m['memory_mb']} MiB" if m["memory_mb"] else "-",
                      execs, binding, heal)
    out.print(table)
    for pr in doc["problems"]:
        out.print(f"problem: {pr}", markup=False)


def _load(name: str):
    from tilewise import cluster

    st = cluster.load(cluster.check_name(name))
    if st is None:
        others = cluster.names()
        hint = f"running: {', '.join(others)} (use --name)" if others else "start one with `tilewise up --engine spark --policy P`"
        raise UsageError(f"no cluster named {name!r} is recorded in {cluster.state_dir()}", hint)
    return st


@click.command("status")
@name_option
@json_option
def status_cmd(name, as_json):
    """Show each instance of a cluster: pid, cpus, memory nodes, binding read back from /proc, health.

    Exit code 3 when an instance crashed or lost its binding.
    """
    from tilewise import cluster

    doc = cluster.status(_load(name))
    if as_json:
        emit_json(doc)
    else:
        print_status(doc)
    if not doc["healthy"]:
        sys.exit(3)


@click.command("down")
@name_option
@json_option
def down_cmd(name, as_json):
    """Stop a cluster: master, workers, executors; nothing is left running. Removes its state and logs."""
    from tilewise import cluster

    st = _load(name)
    doc = cluster.down(st)
    if as_json:
        emit_json(doc)
        return
    console().print(f"cluster {name} stopped ({len(doc['stopped_pids'])} process(es)); none left", markup=False)
