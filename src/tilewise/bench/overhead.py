"""What tilewise adds to DuckDB's own time on a benchmark (TPC-H by default, --benchmark any
registered one), with a confidence interval (issue 14).

A round is two passes over the same data, the same SQL in the same order and the same CPUs (so
the same thread count), each in a fresh process:

- plain: ``python -m tilewise.bench.plain_duckdb`` (no tilewise in the loop);
- tilewise: ``tilewise bench <benchmark> --engine duckdb --policies wim --tests power`` (a single
  power-style stream; ``--streams 1`` for a tilewise without ``--tests``; no refresh functions, which the plain pass does not run), through the whole
  harness: plan, the DuckDB runtime's bound server, validation.

Each pass does a warm-up and R timed runs; its figure is the median of its runs' wall times (one
run = every query once). Passes alternate ABBA (plain first in even rounds, tilewise first in odd
ones), or in a seeded random order, so drift of the machine hits both sides alike.

Statistics: per round the ratio tilewise / plain; the estimate is the geometric mean of the
ratios, with a 95 % Student-t interval computed on their logarithms (rounds are the independent
samples: n = rounds, df = n - 1). The goal (ratio <= 1.05; stretch <= 1.02) is "shown met" when
the whole interval is below it, "shown missed" when the whole interval is above it, and "not
decided" otherwise (more rounds narrow the interval). Per query: the mean over rounds of the
difference of the two passes' medians, with its t interval, in milliseconds. And the time outside
the queries: per run, wall time minus the sum of the per-query times, which is where harness cost
(IPC, result transfer, bookkeeping) shows, since each side times its queries the same way.

--tilewise-src DIR runs the tilewise pass from another source tree (PYTHONPATH), e.g. an older
commit exported with ``git archive``, to measure the harness before a change with the same plain
baseline; --plain-fetch rows makes the plain pass fetch with fetchall() as older workers did (by
default it fetches exactly as the current server does: engines.duckdb.server.fetch_answer).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tilewise import cpulist, launch, topology
from tilewise import plan as planner
from tilewise import benchmarks
from tilewise.engines.duckdb import SPEC as DUCKDB
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json
from tilewise.results import model, output, stats

GOAL = 0.05
STRETCH = 0.02
SIDES = ("plain", "tilewise")


@dataclass
class Config:
    sf: float = 1.0
    rounds: int = 6
    runs: int = 3
    benchmark: str = "tpch"  # whose data and queries (tilewise.benchmarks)
    queries: list | None = None  # the benchmark's query ids (None: all of them)
    order: str = "abba"  # abba | random
    seed: int = 1
    out: str | Path = "overhead-results"
    data_dir: str | Path | None = None
    tilewise_src: str | None = None
    plain_fetch: str = "worker"
    timeout_s: float | None = None  # per pass


class Reporter:
    def message(self, text: str) -> None: ...
    def pass_done(self, rnd: int, side: str, total_s: float) -> None: ...


# ---- pure parts ------------------------------------------------------------------------------

def schedule(rounds: int, order: str, seed: int = 1) -> list[tuple[str, str]]:
    """The order of the two passes in each round: ABBA, or a seeded coin per round."""
    if order == "abba":
        return [SIDES if r % 2 == 0 else SIDES[::-1] for r in range(rounds)]
    if order == "random":
        rng = random.Random(seed)
        return [tuple(rng.sample(SIDES, 2)) for _ in range(rounds)]
    raise UsageError(f"unknown order {order!r}", "use --order abba or --order random")


def verdict(ci: list[float] | None, goal: float) -> str:
    """Is the overhead at most `goal` (0.05 = 5 %)? Decided only when the interval is on one side."""
    if not ci:
        return "not decided"
    if ci[1] <= 1 + goal:
        return "shown met"
    if ci[0] > 1 + goal:
        return "shown missed"
    return "not decided"


def pass_figures(queries: dict[str, list[float]], walls: list[float]) -> dict:
    """One pass: its total (median run wall), per-query medians, and per run the wall time spent
    outside the queries (wall minus the sum of that run's query times)."""
    runs = len(walls)
    outside = [walls[r] - sum(ts[r] for ts in queries.values() if r < len(ts)) for r in range(runs)]
    return {"total_s": statistics.median(walls), "run_wall_s": list(walls),
            "query_median_s": {q: statistics.median(ts) for q, ts in queries.items() if ts},
            "outside_queries_s": outside, "outside_median_s": statistics.median(outside) if outside else None}


def summarise(rounds: list[dict]) -> dict:
    """Everything the report says, from the rounds that have both passes."""
    done = [r for r in rounds if all(r.get(s) for s in SIDES)]
    if not done:
        return {"rounds": 0}
    plain = [r["plain"]["total_s"] for r in done]
    tw = [r["tilewise"]["total_s"] for r in done]
    rc = stats.paired_ratio_ci(plain, tw)
    qs = [q for q in done[0]["plain"]["query_median_s"] if q in done[0]["tilewise"]["query_median_s"]]
    per_q = {}
    for q in qs:
        d = [(r["tilewise"]["query_median_s"][q] - r["plain"]["query_median_s"][q]) * 1e3 for r in done]
        per_q[q] = {"plain_ms": statistics.median(r["plain"]["query_median_s"][q] * 1e3 for r in done),
                    "tilewise_ms": statistics.median(r["tilewise"]["query_median_s"][q] * 1e3 for r in done),
                    "diff_ms": stats.paired_diff_ci(d)}
    outside = [(r["tilewise"]["outside_median_s"] - r["plain"]["outside_median_s"]) * 1e3 for r in done]
    return {
        "rounds": len(done), "ratio": rc,
        "goal": {"max_ratio": 1 + GOAL, "verdict": verdict(rc["ci95"], GOAL)},
        "stretch": {"max_ratio": 1 + STRETCH, "verdict": verdict(rc["ci95"], STRETCH)},
        "plain_total_s": statistics.median(plain), "tilewise_total_s": statistics.median(tw),
        "outside_queries_ms": {"plain": statistics.median(r["plain"]["outside_median_s"] * 1e3 for r in done),
                               "tilewise": statistics.median(r["tilewise"]["outside_median_s"] * 1e3 for r in done),
                               "diff": stats.paired_diff_ci(outside)},
        "queries": per_q,
    }


# ---- the passes ------------------------------------------------------------------------------

# what the tilewise pass's power test runs, in its order, as the tilewise tree under test has it
# (--tilewise-src): the benchmark's stream 0 with its default parameters and seed
_SQL_SNIPPET = r"""
import json, sys
from tilewise import benchmarks
name, sf, qs = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
b = benchmarks.get(name)
qset = b.query_set(None, seed=0, sf=sf)
ids = b.catalog.stream_order(0, b.catalog.parse(",".join(map(str, qs)) if qs else None))
print(json.dumps([{"query": q, "sql": qset.sql(q, 0)} for q in ids]))
"""


def _env(src: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run(argv: list[str], env: dict, timeout: float | None, what: str) -> str:
    """Run a pass in its own session; stop the whole tree on any way out (Ctrl-C included)."""
    try:  # own group, journaled start, the whole tree stopped on any way out (Ctrl-C included)
        proc = launch.run(argv, env=env, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        raise TilewiseError(f"{what} took longer than {timeout:g} s", "raise --timeout or use a smaller --sf") from None
    out, err = proc.stdout, proc.stderr
    if proc.returncode != 0:
        last = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        raise TilewiseError(f"{what} failed (exit {proc.returncode}): {last[-1] if last else 'no message'}")
    return out


def pass_flags(env: dict, benchmark: str) -> list[str]:
    """Flags for one power-style stream without refresh functions, where this tilewise has them."""
    text = _run([sys.executable, "-m", "tilewise", "bench", benchmark, "--help"], env, 60,
                f"tilewise bench {benchmark} --help")
    # the power test alone where it can be chosen (--streams then does not apply), else one stream
    flags = ["--tests", "power"] if "--tests" in text else ["--streams", "1"]
    if "--no-refresh" in text:
        flags += ["--no-refresh"]
    return flags


def _tilewise_figures(doc: dict) -> dict:
    pol = (doc.get("policies") or {}).get("wim")
    if not pol or not pol.get("run_wall_s"):
        raise TilewiseError("the tilewise pass wrote no timed runs for wim")
    qs = {q: r["times_s"] for q, r in pol["queries"].items() if r.get("times_s")}
    return pass_figures(qs, pol["run_wall_s"])


def run(cfg: Config, rep: Reporter | None = None) -> dict:
    rep = rep or Reporter()
    if cfg.rounds < 2:
        raise UsageError(f"--rounds must be >= 2 for an interval, got {cfg.rounds}")
    if cfg.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {cfg.runs}")
    if cfg.plain_fetch not in ("worker", "rows"):
        raise UsageError(f"--plain-fetch must be worker or rows, not {cfg.plain_fetch!r}")
    if cfg.tilewise_src and not (Path(cfg.tilewise_src) / "tilewise" / "__init__.py").is_file():
        raise UsageError(f"--tilewise-src {cfg.tilewise_src} holds no tilewise package",
                         "give a source tree's src/ folder, e.g. from git archive COMMIT src | tar -x -C DIR")
    order = schedule(cfg.rounds, cfg.order, cfg.seed)
    writer = output.Writer(cfg.out, plots=False)  # a bad --out fails before anything runs
    out = writer.dir
    topo = topology.load(None)
    cpus = cpulist.format(planner.plan(topo, "wim").instances[0].cpus)  # the tilewise worker's CPUs
    bench = benchmarks.get(cfg.benchmark)
    dataset = bench.dataset(cfg.sf, cfg.data_dir, log=rep.message)
    tw_env, plain_env = _env(cfg.tilewise_src), _env(None)
    flags = pass_flags(tw_env, bench.name)
    sql = json.loads(_run([sys.executable, "-c", _SQL_SNIPPET, bench.name, f"{dataset.sf:g}", json.dumps(cfg.queries)],
                          tw_env, 60, "listing the SQL"))
    sql_file = out / "queries.json"
    atomic_write_json(sql_file, sql)
    doc = model.new("overhead", topo=topo, engines={DUCKDB.name: _duckdb_version()}, params={
        "benchmark": bench.name, "sf": cfg.sf, "rounds": cfg.rounds, "runs": cfg.runs, "queries": [q["query"] for q in sql], "order": cfg.order,
        "seed": cfg.seed, "cpus": cpus, "plain_fetch": cfg.plain_fetch, "tilewise_src": cfg.tilewise_src,
        "tilewise_flags": ["--engine", DUCKDB.name, "--policies", "wim", *flags],
        "schedule": [list(o) for o in order]})
    doc["rounds"] = []
    doc["summary"] = {}
    try:
        for i, sides in enumerate(order):
            rnd: dict = {"round": i, "order": list(sides)}
            doc["rounds"].append(rnd)
            for side in sides:
                if side == "plain":
                    text = _run([sys.executable, "-m", "tilewise.bench.plain_duckdb", "--sf", f"{cfg.sf:g}",
                                 "--runs", str(cfg.runs), "--data", str(dataset.dir), "--tables",
                                 ",".join(dataset.table_names), "--sql", str(sql_file),
                                 "--fetch", cfg.plain_fetch, "--cpus", cpus, "--json"], plain_env, cfg.timeout_s,
                                f"round {i} plain pass")
                    raw = json.loads(text)
                    rnd["plain"] = pass_figures(raw["queries"], raw["run_wall_s"]) | {
                        "threads": raw["threads"], "run_cpu_s": raw["run_cpu_s"], "load_s": raw["load_s"]}
                else:
                    pdir = out / "passes" / f"round{i:02d}-tilewise"
                    _run([sys.executable, "-m", "tilewise", "bench", bench.name, "--engine", DUCKDB.name,
                          "--policies", "wim", *flags, "--runs", str(cfg.runs), "--sf", f"{cfg.sf:g}",
                          "--queries", ",".join(str(q["query"]) for q in sql), "--data-dir", str(dataset.dir.parent),
                          *(["--data-seed", str(dataset.seed)] if dataset.seed is not None else []),
                          "--out", str(pdir), "--no-plots", "--json"], tw_env, cfg.timeout_s, f"round {i} tilewise pass")
                    tdoc = json.loads((pdir / "results.json").read_text())
                    rnd["tilewise"] = _tilewise_figures(tdoc) | {
                        "threads": next((x.get("threads") for x in tdoc["policies"]["wim"].get("instances", [])), None),
                        "results": str(pdir / "results.json")}
                rep.pass_done(i, side, rnd[side]["total_s"])
            doc["summary"] = summarise(doc["rounds"])
            writer.write(doc)  # after every round: a late failure loses nothing
        _check_threads(doc)
        model.finish(doc, complete=True)
    except BaseException as e:
        model.stopped(doc, e)
        raise
    finally:
        doc["summary"] = summarise(doc["rounds"])
        writer.write(doc)
    return doc


def _check_threads(doc: dict) -> None:
    seen = {(s, r[s].get("threads")) for r in doc["rounds"] for s in SIDES if r.get(s)}
    threads = {t for _, t in seen if t is not None}
    if len(threads) > 1:
        doc["warnings"].append(f"the passes ran with different thread counts ({sorted(seen)}): not the same work")


def _duckdb_version() -> str:
    return "missing" if DUCKDB.missing() else DUCKDB.version()
