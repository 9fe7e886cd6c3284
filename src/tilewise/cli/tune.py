"""`tilewise tune`: find the best application-agnostic configuration (allocator, memory policy,
thread placement, OS switches) for a workload or an arbitrary command on this machine."""

from __future__ import annotations

import contextlib
import os
import shlex


import click

from tilewise import allocators, topology
from tilewise.cli.common import AT_LEAST_1, INDEX, SECONDS, conflicts, console, emit_json, json_option
from tilewise.cli.workload import make_params, os_options, workload_options
from tilewise.errors import UsageError


@click.command("tune", context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("--workload", "-w", "workload_name", metavar="W", help="W1, W2, W3, W4 or alloc (or give -- CMD ...).")
@workload_options
@click.option("--allocators", "alloc_list", default=None, metavar="LIST",
              help="Allocators to try (default: every one installed): system,jemalloc,tcmalloc,mimalloc,tbbmalloc.")
@click.option("--mem", "mem_list", default="first-touch,interleave", show_default=True, metavar="LIST",
              help="Memory policies: first-touch, interleave[:NODES], local, preferred[:N], membind[:NODES].")
@click.option("--placements", default="none", show_default=True, metavar="LIST", help="none, sparse, dense.")
@click.option("--repeat", "-r", type=AT_LEAST_1, default=3, show_default=True, help="Measured runs per configuration.")
@click.option("--warmup", type=INDEX, default=0, show_default=True, help="Unmeasured runs per configuration first.")
@click.option("--out", "out_dir", default="tune-results", show_default=True, metavar="DIR",
              help="results.json, results.csv, fig6.png, tuned.json go here.")
@os_options
@click.option("--restore", is_flag=True, help="Only undo what runs killed hard left changed (same as `tilewise restore`), then exit.")
@click.option("--timeout", type=SECONDS, default=600, show_default=True, help="Seconds per run before it is stopped.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def tune_cmd(workload_name, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale,
             alloc_list, mem_list, placements, repeat, warmup, out_dir, apply_os, thp, autonuma, os_root, restore,
             timeout, as_json, command):
    """Sweep a grid of configurations, repeat runs, report the best one with its speedup over the
    default (system allocator, first-touch, no placement) and the spread, write results and a plot,
    and write the winner as a configuration file (for `exec --config`, `workload --config`).

    Examples: `tilewise tune -w W1 --allocators system,tbbmalloc --repeat 5`;
    black-box: `tilewise tune --allocators system,jemalloc -- ./my_engine --query q1.sql`.
    """
    from tilewise.tune import knobs, sweep
    from tilewise.tune import workloads as wl
    from tilewise.tune.os_switches import SWITCHES, OsSwitches

    osw = OsSwitches(os_root)
    if restore:
        conflicts("--restore", ("workload_name", "dataset", "records", "groups", "zipf_exponent", "ratio", "ops", "slots",
                                "threads", "seed", "paper_scale", "alloc_list", "mem_list", "placements", "repeat",
                                "warmup", "out_dir", "apply_os", "thp", "autonuma", "timeout"),
                  "--restore only undoes what a crashed run left, then exits")
        if command:
            raise UsageError("--restore takes no command", "run `tilewise tune --restore` alone")
        from tilewise.cli.restore import restore_report

        restore_report(as_json)
        return
    if bool(workload_name) == bool(command):
        raise UsageError("give either --workload W or a command after --", "e.g. tilewise tune -w W1, or tilewise tune -- ./engine args")
    t = topology.load(None)
    w = wl.canonical(workload_name) if workload_name else None
    if w:
        params = make_params(w, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale)
    elif any(v is not None for v in (dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed)) or paper_scale:
        raise UsageError("workload options (--records, --threads, ...) apply to --workload, not to a command")
    else:
        params = None

    allocs = [allocators.get(a).name for a in knobs.split_list(alloc_list)] if alloc_list else list(allocators.available())
    for a in allocs:
        allocators.find_library(a)  # a missing one fails now, not in the middle of the sweep
    mems = [knobs.parse_mem(m, t) for m in knobs.split_list(mem_list)]
    places = knobs.split_list(placements)
    for p in places:
        if p not in knobs.PLACEMENTS:
            raise UsageError(f"unknown placement {p!r}", f"choose from {', '.join(knobs.PLACEMENTS)}")
    if command and places != ["none"]:
        raise UsageError("placement inside an arbitrary command is not possible", "use --placements none with -- CMD")
    thps = [SWITCHES["thp"].normalise(x) for x in knobs.split_list(thp)] if thp else None
    ans = [SWITCHES["autonuma"].normalise(x) for x in knobs.split_list(autonuma)] if autonuma else None
    if (thps or ans) and not apply_os:
        raise UsageError("--thp/--autonuma change the OS and need --apply-os (as root)")
    if apply_os:
        if not (thps or ans):
            raise UsageError("--apply-os needs --thp and/or --autonuma values to try")
        osw.check_permission()
    if not allocs or not mems or not places:
        raise UsageError("the grid is empty", "give at least one allocator, memory policy and placement")
    grid = sweep.build_grid(allocs, mems, places, thps, ans)

    from tilewise.environment import system_check
    from tilewise.results import report
    from tilewise.results.output import Writer

    writer = Writer(out_dir, plots=False)  # checked before the first run

    state = osw.state()
    target = {"workload": w, "params": params.to_json()} if w else {"command": list(command)}
    grid_spec = {"allocators": allocs, "mem": [knobs.Config(mem=m, mem_nodes=n).mem_label() for m, n in mems],
                 "placements": places, "thp": thps, "autonuma": ans, "cases": len(grid)}
    base = sweep.new_doc(t, state, target=target, grid_spec=grid_spec, repeat=repeat, warmup=warmup,
                         system_check=system_check(numa_nodes=len(t.cpu_nodes)))
    err = console(stderr=True)
    quiet = as_json

    def runner(cfg):
        if w:
            r = wl.run_workload(w, params, cfg, t, timeout=timeout)
            res = r.result
            return float(res["time_s"]), {"checksum": res.get("checksum"), "max_rss_bytes": res.get("max_rss_bytes"),
                                          "wall_s": r.wall_s, "allocator_verified": r.allocator_verified,
                                          "memory_overhead": res.get("memory_overhead")}
        r = wl.run_command(list(command), cfg, timeout=timeout)
        return r.wall_s, {"allocator_verified": r.allocator_verified}

    def save(sw_):
        writer.write(sweep.results_doc(sw_, base))

    # the switches stay locked for the whole sweep (a second --apply-os run refuses, naming this one);
    # each OS state is applied, its cases run, and it is restored before the next
    keys = [k for k, vals in (("thp", thps), ("autonuma", ans)) if vals]
    stack = contextlib.ExitStack()
    if apply_os:
        stack.enter_context(osw.controlling(keys, "tune --apply-os"))
    with stack:
        sw = _sweep(sweep, grid, runner, repeat, warmup, osw if apply_os else None, state, err, quiet, save)
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
        tuned_path = os.path.join(out_dir, "tuned.json")
        measured = {"median_s": best.median, "spread": best.spread, "default_median_s": sw.default.median,
                    "speedup_over_default": sw.speedup(), "repeat": repeat}
        knobs.save_config(tuned_path, knobs.TunedFile(best.config, target, measured, t.fingerprint()))
        paths["config"] = tuned_path
        repro = reproduce(best.config, w, params, command, tuned_path, t)
    doc["files"] = paths
    doc["reproduce"] = repro
    writer.write(doc, plots=True)
    if as_json:
        emit_json(doc)
    else:
        out = console(wide=True)
        report.render(doc, out)
        for k, p in doc["files"].items():
            out.print(f"wrote {k}: {p}", markup=False)
    if best is None:
        raise UsageError("every configuration failed", "see the failures above and in results.json")


def reproduce(cfg, w, params, command, tuned_path, topo) -> dict:
    from tilewise.tune import knobs
    from tilewise.tune import workloads as wl

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


def _sweep(sweep, grid, runner, repeat, warmup, osw, state, err, quiet, save):
    if not quiet:
        err.print(f"tilewise tune: grid search, {len(grid)} configurations x {repeat} runs; OS: "
                  + ", ".join(f"{k} {v.shown}" for k, v in state.items()), markup=False)
    return sweep.run_sweep(grid, runner, repeat=repeat, warmup=warmup,
                           os_apply=(lambda d: osw.applied(d, "tune --apply-os")) if osw else None,
                           progress=None if quiet else (lambda line: err.print("  " + line, markup=False)),
                           after_run=save)
