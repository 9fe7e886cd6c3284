"""One `tilewise tune` sweep, as a use case: ``run(config, reporter) -> results document``.

The grid (allocators x memory policies x placements x OS switch states) is checked whole before
the first run (a missing allocator, a bad policy or placement, and the OS-switch admission: every
switch file writable, else one line and nothing changed). With --apply-os the switches stay locked
for the whole sweep (a second --apply-os run refuses, naming this one); each OS state is applied,
its cases run, and it is restored before the next. The results document is rewritten after each
run (a late failure loses nothing); the winner is written as a configuration file (tuned.json)
with the command lines that reproduce it. Every configuration failing is an error (after the
document is written), and leaves no journal behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass

from tilewise import allocators, topology
from tilewise.environment import system_check
from tilewise.errors import UsageError
from tilewise.results.output import Writer
from tilewise.tune import knobs, sweep
from tilewise.tune import workloads as wl
from tilewise.tune.os_switches import SWITCHES, OsSwitches


@dataclass
class Config:
    workload: str | None = None  # W1..W4, alloc; or a command
    params: wl.Params | None = None
    command: tuple[str, ...] = ()
    allocators: str | None = None  # comma list; None: every one installed
    mem: str = "first-touch,interleave"
    placements: str = "none"
    repeat: int = 3
    warmup: int = 0
    out: str = "tune-results"
    apply_os: bool = False
    thp: str | None = None
    autonuma: str | None = None
    os_root: str = "/"
    timeout: float = 600


class Reporter:
    def message(self, text: str) -> None: ...  # the sweep's progress lines
    def done(self, doc: dict) -> None: ...  # the results document, also when every configuration failed


@dataclass
class Grid:
    allocs: list[str]
    mems: list
    places: list[str]
    thps: list[str] | None
    autonuma: list[str] | None
    cases: list


def grid(cfg: Config, t) -> Grid:
    """The grid, checked whole before the first run (a missing allocator fails now, not in the middle)."""
    allocs = [allocators.get(a).name for a in knobs.split_list(cfg.allocators)] if cfg.allocators \
        else list(allocators.available())
    for a in allocs:
        allocators.find_library(a)
    mems = [knobs.parse_mem(m, t) for m in knobs.split_list(cfg.mem)]
    places = knobs.split_list(cfg.placements)
    for p in places:
        if p not in knobs.PLACEMENTS:
            raise UsageError(f"unknown placement {p!r}", f"choose from {', '.join(knobs.PLACEMENTS)}")
    if cfg.command and places != ["none"]:
        raise UsageError("placement inside an arbitrary command is not possible", "use --placements none with -- CMD")
    thps = [SWITCHES["thp"].normalise(x) for x in knobs.split_list(cfg.thp)] if cfg.thp else None
    ans = [SWITCHES["autonuma"].normalise(x) for x in knobs.split_list(cfg.autonuma)] if cfg.autonuma else None
    if (thps or ans) and not cfg.apply_os:
        raise UsageError("--thp/--autonuma change the OS and need --apply-os (as root)")
    if cfg.apply_os and not (thps or ans):
        raise UsageError("--apply-os needs --thp and/or --autonuma values to try")
    if not allocs or not mems or not places:
        raise UsageError("the grid is empty", "give at least one allocator, memory policy and placement")
    return Grid(allocs, mems, places, thps, ans, sweep.build_grid(allocs, mems, places, thps, ans))


def run(cfg: Config, reporter: Reporter | None = None) -> dict:
    """The sweep; returns the results document (files, reproduce lines), also given to
    reporter.done. Raises UsageError after that when every configuration failed."""
    rep = reporter or Reporter()
    if bool(cfg.workload) == bool(cfg.command):
        raise UsageError("give either --workload W or a command after --", "e.g. tilewise tune -w W1, or tilewise tune -- ./engine args")
    t = topology.load(None)
    g = grid(cfg, t)
    osw = OsSwitches(cfg.os_root)
    keys = [k for k, vals in (("thp", g.thps), ("autonuma", g.autonuma)) if vals]
    if cfg.apply_os:
        osw.check_permission(keys)  # admission: before the first file is written or run started
    writer = Writer(cfg.out, plots=False)  # checked before the first run
    state = osw.state()
    w = cfg.workload
    target = {"workload": w, "params": cfg.params.to_json()} if w else {"command": list(cfg.command)}
    grid_spec = {"allocators": g.allocs, "mem": [knobs.Config(mem=m, mem_nodes=n).mem_label() for m, n in g.mems],
                 "placements": g.places, "thp": g.thps, "autonuma": g.autonuma, "cases": len(g.cases)}
    base = sweep.new_doc(t, state, target=target, grid_spec=grid_spec, repeat=cfg.repeat, warmup=cfg.warmup,
                         system_check=system_check(numa_nodes=len(t.cpu_nodes)))

    def runner(c):
        if w:
            r = wl.run_workload(w, cfg.params, c, t, timeout=cfg.timeout)
            res = r.result
            return float(res["time_s"]), {"checksum": res.get("checksum"), "max_rss_bytes": res.get("max_rss_bytes"),
                                          "wall_s": r.wall_s, "allocator_verified": r.allocator_verified,
                                          "memory_overhead": res.get("memory_overhead")}
        r = wl.run_command(list(cfg.command), c, timeout=cfg.timeout)
        return r.wall_s, {"allocator_verified": r.allocator_verified}

    stack = contextlib.ExitStack()
    if cfg.apply_os:
        stack.enter_context(osw.controlling(keys, "tune --apply-os"))
    with stack:
        rep.message(f"tilewise tune: grid search, {len(g.cases)} configurations x {cfg.repeat} runs; OS: "
                    + ", ".join(f"{k} {v.shown}" for k, v in state.items()))
        sw = sweep.run_sweep(g.cases, runner, repeat=cfg.repeat, warmup=cfg.warmup,
                             os_apply=(lambda d: osw.applied(d, "tune --apply-os")) if cfg.apply_os else None,
                             progress=lambda line: rep.message("  " + line),
                             after_run=lambda s: writer.write(sweep.results_doc(s, base)))
    doc = sweep.results_doc(sw, base)
    writer.write(doc, plots=True)
    paths = {"json": str(writer.json_path)}
    if (writer.dir / "results.csv").exists():
        paths["csv"] = str(writer.dir / "results.csv")
    if writer.plot_paths:
        paths["plot"] = str(writer.plot_paths[0])
    best = sw.best()
    repro = {}
    if best:
        tuned_path = os.path.join(cfg.out, "tuned.json")
        measured = {"median_s": best.median, "spread": best.spread, "default_median_s": sw.default.median,
                    "speedup_over_default": sw.speedup(), "repeat": cfg.repeat}
        knobs.save_config(tuned_path, knobs.TunedFile(best.config, target, measured, t.fingerprint()))
        paths["config"] = tuned_path
        repro = reproduce(best.config, w, cfg.params, cfg.command, tuned_path, t)
    doc["files"] = paths
    doc["reproduce"] = repro
    writer.write(doc, plots=True)
    rep.done(doc)
    if best is None:
        raise UsageError("every configuration failed", "see the failures above and in results.json")
    return doc


def reproduce(cfg, w, params, command, tuned_path, topo) -> dict:
    """The command lines (and environment) that run the winner again, with and without tilewise."""
    if w:
        args = ["tilewise", "workload", w]
        for k, v in params.to_json().items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        args += ["--allocator", cfg.allocator, "--mem", cfg.mem_label(), "--placement", cfg.placement]
        pin = knobs.thread_order(topo, cfg.placement, wl.effective_threads(params), set(os.sched_getaffinity(0)))
        native = wl.argv(w, params, pin)
        env = cfg.reproduce_env(native)
    else:
        args = ["tilewise", "exec", "--policy", "wim", "--config", tuned_path, "--", *command]
        env = cfg.reproduce_env(list(command))
    out = {"tilewise": shlex.join(args), "environment": env,
           "exec": f"tilewise exec --policy wim --config {shlex.quote(tuned_path)} -- CMD"}
    if cfg.os_desired():
        out["os"] = ("as root, before the run: " + "; ".join(
            f"echo {v} > /sys/kernel/mm/transparent_hugepage/enabled" if k == "thp" else f"echo {v} > /proc/sys/kernel/numa_balancing"
            for k, v in cfg.os_desired().items()))
    return out
