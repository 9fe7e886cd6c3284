"""`tilewise up / join / status / query / down`: a bound cluster of any registered engine that
outlives the command; `join` adds this host's bound workers to a coordinator on another host.

Exit codes: 0 ok; 1 error; 2 bad usage; 3 (`status` only) the cluster is unhealthy (a crashed or
unbound instance); 130 interrupted (everything `up` had started was stopped).
"""

from __future__ import annotations

import sys

import click

from tilewise import allocators, benchmarks, cpulist, engines, signals, verification
from tilewise.cli import modes
from tilewise.cli.common import ADDRESS, INDEX, SECONDS, Messages, console, emit_json, json_option, topology_option
from tilewise.cli.engines import (EngineChoice, LazyHelpOption, coordinator_help, engine_summaries, exchange_help,
                                   memory_help)
from tilewise.cli.plan import make_plan, plan_options
from tilewise.errors import TilewiseError, UsageError

name_option = click.option("--name", default="default", show_default=True, help="Cluster name (several may run).")


def _worker_options(f):
    opts = [
        topology_option,
        plan_options,
        name_option,
        click.option("--allocator", default="system", show_default=True,
                     help=f"Preload an allocator into every instance: {', '.join(allocators.names())}."),
        click.option("--worker-memory", default=None, metavar="SIZE", cls=LazyHelpOption,
                     help_text=lambda: memory_help("Memory per worker, e.g. 8g")),
        click.option("--host", default=None, type=ADDRESS,
                     help="Address the processes bind to and advertise (default 127.0.0.1; with join, the one "
                          "that reaches the coordinator)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@modes.declare(
    modes.Mode("--sf (a benchmark's data)", lambda a: a["sf"] is not None, ("benchmark", "data_dir", "raw_format"),
               hint="add --sf N, e.g. --sf 1"),
    modes.Mode("--crack", lambda a: a["crack_layout"] is not None, ("layout_dir", "crack_pause")),
)
@click.command("up")
@click.option("--engine", "-e", default=engines.DEFAULT_UP, show_default=True, type=EngineChoice(),
              cls=LazyHelpOption, help_text=engine_summaries)
@_worker_options
@click.option("--sf", default=None, help="Serve the benchmark's data (--benchmark) at this scale factor (generated if "
              "needed): loaded into every instance, or registered for the cluster's queries (`tilewise query`; the "
              "connect hints say how else).")
@click.option("--benchmark", "-b", "benchmark", default=None, metavar="NAME", cls=LazyHelpOption,
              help_text=lambda: f"With --sf: whose data ({', '.join(benchmarks.names())}; default tpch).")
@click.option("--data-dir", default=None, metavar="DIR", help="The benchmark's data directory (default: the user cache).")
@click.option("--raw", "raw_format", type=click.Choice(["csv", "tbl"]), default=None,
              help="With --sf: serve the benchmark's tables as text (TPC-H: as tpchgen-cli writes them), read in place.")
@click.option("--data", "data_path", default=None, metavar="DIR",
              help="Serve a directory of raw tables (<table>.csv/.tbl/.json/.parquet or a folder of them), read in "
                   "place (engines that read files: `tilewise engines list`).")
@click.option("--crack", "crack_layout", default=None, metavar="LAYOUT",
              help="Transform the raw tables in the background into LAYOUT (parquet-K[-rgN][-sorted-COL], or auto) on "
                   "the cores the deployment leaves idle; each table switches to its copy once it is complete and "
                   "checked (`tilewise status` shows the progress).")
@click.option("--layout-dir", default=None, metavar="DIR",
              help="Where --crack writes the copies (default: <data>/layouts when writable, else the cache).")
@click.option("--crack-pause", type=SECONDS, default=None, hidden=True,
              help="Test hook: the cracker sleeps this long after each file it writes.")
@click.option("--coordinator-memory", default=None, metavar="SIZE", cls=LazyHelpOption, help_text=coordinator_help)
@click.option("--exchange", default=None, metavar="NAME", cls=LazyHelpOption, help_text=exchange_help)
@click.option("--join", "join", default=None, metavar="URL", hidden=True,
              help="Same as `tilewise join --coordinator URL` (kept for scripts written for Spark).")
@json_option
def up_cmd(engine, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, name,
           allocator, worker_memory, host, sf, benchmark, data_dir, raw_format, data_path, crack_layout, layout_dir,
           crack_pause, coordinator_memory, exchange, join, as_json):
    """Start a bound cluster that keeps running; print how to connect.

    One bound worker per plan instance (the engine's worker or server: --engine), verified from
    /proc, plus the engine's coordinator or master where it has one. Stop it with `tilewise down`.
    """
    bench = benchmarks.get(benchmark or "tpch") if sf is not None else None
    if bench is not None:
        sf = bench.data.check_sf(sf)
    if data_path and sf is not None:
        raise UsageError("--data and --sf both name the data to serve", "give one of them")
    if crack_layout and not (data_path or raw_format):
        raise UsageError("--crack transforms raw tables: start on them with --data DIR or --sf N --raw csv",
                         "e.g. tilewise up --engine duckdb --sf 1 --raw csv --crack auto")
    raw = {"format": raw_format, "data": data_path, "crack": crack_layout, "layout_dir": layout_dir,
           "pause": crack_pause, "benchmark": bench, "exchange": exchange}
    _start(engine, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, name,
           allocator, worker_memory, host, sf, data_dir, coordinator_memory, join, as_json, raw)


@click.command("join")
@click.option("--engine", "-e", required=True, type=EngineChoice(lambda s: s.capabilities.join),
              help="The engine of the cluster to join (engines whose workers can join from other hosts).")
@click.option("--coordinator", required=True, metavar="HOST:PORT", cls=LazyHelpOption,
              help_text=lambda: "The coordinator or master ({}) started by `tilewise up` on another host.".format(
                  ", ".join(s.title for s in engines.specs(lambda s: s.capabilities.join))))
@_worker_options
@json_option
def join_cmd(engine, coordinator, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set,
             skewed, name, allocator, worker_memory, host, as_json):
    """Start bound workers on this host for a cluster whose coordinator runs on another host.

    This host plans and binds its own workers with the given policy (use the same policy on every
    host); they register with the coordinator. Stop them with `tilewise down --name N` here; the
    data set must be at the same path on every host.
    """
    _start(engine, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, name,
           allocator, worker_memory, host, None, None, None, coordinator, as_json)


def _start(engine, topology_src, policy, instances, mem, mem_nodes, smt, engine_threads, working_set, skewed, name,
           allocator, worker_memory, host, sf, data_dir, coordinator_memory, join, as_json, raw=None):
    from tilewise import cluster

    raw = raw or {}
    spec = engines.get(engine)
    if host is not None:
        from tilewise.engines.procgroup import check_bindable

        check_bindable(host)
    if raw.get("crack") and not spec.capabilities.switch:
        raise UsageError(f"{spec.title} cannot switch a table to another copy while it runs: --crack does not apply",
                         f"use --engine {' or '.join(s.name for s in engines.specs(lambda s: s.capabilities.switch))}")

    def dataset(log):  # --sf: the benchmark's (its Parquet, or --raw its text), generated if needed; --data: raw tables
        if sf is not None:
            data = raw["benchmark"].data
            ds = (data.raw(sf, raw["format"], data_dir, log=log) if raw.get("format")
                  else data.dataset(sf, data_dir, log=log))
        else:
            from tilewise.data import raw as rawdata

            ds = rawdata.dataset(raw["data"])
        spec.check_reads(ds)
        if raw.get("crack"):  # a layout cracking cannot make is refused before anything starts
            from tilewise.layout import crack

            crack.target(raw["crack"], ds.table_sources(), 1)
            if raw.get("layout_dir"):  # the store must take a file before anything starts (made, or removed on failure)
                from tilewise import fsutil

                fsutil.ensure_writable_dir(raw["layout_dir"], "--layout-dir")
        return ds

    def background(st, log):  # --crack: the transformation beside the deployment, once it answers
        from tilewise.layout import crack

        crack.start(st, raw["crack"], layout_dir=raw.get("layout_dir"), pause_s=raw.get("pause") or 0.0, log=log)

    cfg = cluster.Config(engine, lambda t: make_plan(t, policy, instances, mem, mem_nodes, smt, engine_threads,
                                                     working_set, skewed),
                         topology_src, name, allocator, worker_memory, coordinator_memory, host,
                         dataset if sf is not None or raw.get("data") else None, join,
                         background if raw.get("crack") else None, exchange=raw.get("exchange"))
    doc = cluster.start(cfg, None if as_json else Messages(prefix="tilewise: "))
    with signals.deferred():  # it is up: what says so is said whole (a Ctrl-C now comes after it)
        if as_json:
            emit_json(doc)
            return
        print_status(doc)
        out = console()
        out.print(f"started in {doc['startup_s']:.1f} s; it keeps running until `tilewise down --name {name}`",
                  markup=False)
        for line in doc["connect"]:
            out.print(line, markup=False)


def print_status(doc: dict) -> None:
    from rich.table import Table

    out = console()
    health = "healthy" if doc["healthy"] else "UNHEALTHY"
    where = (f"{_endpoint_label(doc['engine'])} {doc['endpoint']}" if doc["endpoint"] else
             "no endpoint recorded (its start did not finish)")
    joined = " (workers joined from this host)" if doc.get("joined") else ""
    out.print(f"cluster {doc['name']} ({doc['engine']}, policy {doc['policy']}): {health}; {where}{joined}",
              markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for col in ("process", "pid", "cpus (P#)", "memory (P#)", "heap/limit", "executors", "binding", "health"):
        table.add_column(col, overflow="fold")
    for m in doc["members"]:
        who = m["role"] if m["instance"] is None else f"{m['role']} {m['instance']}"
        mem = m["mem_policy"] + (f" {cpulist.format(m['mem_nodes'])}" if m["mem_nodes"] and
                                 m["mem_policy"] not in ("first-touch", "local") else "")
        execs = ",".join(str(e["pid"]) for e in m["executors"]) or "-"
        verdict = verification.VERDICT_TEXT[m["binding_verified"]]
        binding = "-" if not m.get("alive") else verdict.upper() if m["binding_verified"] is False else verdict
        heal = "ok" if m["healthy"] else ("UNHEALTHY" if m.get("alive") else "DEAD")
        table.add_row(who, str(m["pid"]), m["cpus"], mem, f"{m['memory_mb']} MiB" if m["memory_mb"] else "-",
                      execs, binding, heal)
    out.print(table)
    for pr in doc["problems"]:
        out.print(f"problem: {pr}", markup=False)
    ck = (doc.get("data") or {}).get("crack")
    if ck:
        done = sum(1 for t in ck["tables"].values() if t.get("state") == "switched")
        out.print(f"cracking into {ck['layout']}: {ck.get('state')}, {done} of {len(ck['tables'])} tables switched"
                  + (f"; error: {ck['error']}" if ck.get("error") else ""), markup=False)
        for t, v in ck["tables"].items():
            cost = v.get("cost") or {}
            extra = f", made in {cost['time_s']:.2f} s" if cost.get("time_s") is not None else ""
            out.print(f"  {t}: {v.get('state')} ({v.get('copy')}{extra})", markup=False)


def _endpoint_label(engine: str) -> str:
    try:
        return engines.get(engine).endpoint_label
    except TilewiseError:  # a cluster of an engine no longer installed: still shown
        return "at"


def _load(name: str):
    from tilewise import cluster

    st = cluster.load(cluster.check_name(name))
    if st is None:
        left = cluster.unrecorded(name)
        if left:
            raise TilewiseError(f"cluster {name!r} has no state file in {cluster.state_dir()}, but {len(left)} of its "
                                f"processes still run (pids {', '.join(map(str, left[:8]))})",
                                f"stop them with `tilewise down --name {name}`")
        others = cluster.names()
        hint = f"running: {', '.join(others)} (use --name)" if others else "start one with `tilewise up --engine E --policy P`"
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
    """Stop a cluster: every process it started (workers, executors, coordinator/master, servers); nothing
    is left running. Removes its state and logs. On a host that joined workers, stops only those."""
    from tilewise import cluster

    if cluster.load(cluster.check_name(name)) is None and cluster.unrecorded(name):
        doc = cluster.down_unrecorded(name)  # its state file is gone: its processes say they are its
    else:
        doc = cluster.down(_load(name))
    if as_json:
        emit_json(doc)
        return
    console().print(f"cluster {name} stopped ({len(doc['stopped_pids'])} process(es)); none left", markup=False)


@click.command("query")
@name_option
@click.option("--instance", "-i", type=INDEX, default=None, cls=LazyHelpOption, help_text=lambda: _instance_help())
@click.option("--timeout", "timeout_s", type=SECONDS, default=None, metavar="S", help="Give up after S seconds.")
@click.option("--file", "-f", "sql_file", default=None, metavar="FILE",
              help="Read the statement from FILE ('-': standard input) instead of the argument.")
@click.argument("sql", required=False)
@json_option
def query_cmd(name, instance, timeout_s, sql_file, sql, as_json):
    """Run one SQL statement on a running cluster (any engine) and print the result.

    Example: tilewise query --name tpch "SELECT count(*) FROM lineitem"; a statement that starts
    with a `--` comment goes after `--` or in a file: tilewise query --name tpch -f q01.sql
    """
    from tilewise import cluster

    if (sql is None) == (sql_file is None):
        raise UsageError("give one SQL statement: as the argument or with --file", "e.g. tilewise query \"SELECT 1\"")
    if sql_file is not None:
        from tilewise import userfiles

        hint = "give a file of SQL text, or '-' for standard input"
        sql = (userfiles.decode(click.get_binary_stream("stdin").read(), "standard input", "--file", hint)
               if sql_file == "-" else userfiles.read_text(sql_file, "--file", hint, devices=True))
    sql = sql.strip().rstrip(";").strip()
    if not sql:
        raise UsageError("the SQL statement is empty")
    st = _load(name)
    cols, rows, elapsed, inst = cluster.query(st, sql, instance=instance, timeout_s=timeout_s)
    if as_json:
        emit_json({"cluster": name, "engine": st.engine, "instance": inst, "elapsed_s": elapsed, "columns": cols,
                   "rows": [[_jsonable(v) for v in r] for r in rows]})
        return
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for c in cols:
        table.add_column(str(c), overflow="fold")
    for r in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in r))
    out = console()
    out.print(table)
    where = f"instance {inst}" if inst is not None and inst >= 0 else "the cluster"
    out.print(f"{len(rows)} row(s) in {elapsed:.3f} s on {where}", markup=False)


def _instance_help() -> str:
    reps = [s.name for s in engines.specs(lambda s: s.capabilities.replicas)]
    whole = [s.name for s in engines.specs(lambda s: not s.capabilities.replicas)]
    return (f"{', '.join(reps)}: which instance answers (default: the least busy, 0 when idle); "
            f"{', '.join(whole)} run every query on the whole cluster.")


def _jsonable(v):
    import datetime as dt
    from decimal import Decimal

    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v
