"""`tilewise tune`: find the best application-agnostic configuration (allocator, memory policy,
thread placement, OS switches) for a workload or an arbitrary command on this machine."""

from __future__ import annotations

import click

from tilewise.cli.common import AT_LEAST_1, INDEX, SECONDS, conflicts, console, emit_json, json_option
from tilewise.cli.workload import make_params, os_options, workload_options
from tilewise.errors import UsageError
from tilewise.tune import workloads as wl


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
    from tilewise.tune import session

    if restore:
        conflicts("--restore", ("workload_name", "dataset", "records", "groups", "zipf_exponent", "ratio", "ops", "slots",
                                "threads", "seed", "paper_scale", "alloc_list", "mem_list", "placements", "repeat",
                                "warmup", "out_dir", "apply_os", "thp", "autonuma", "timeout"),
                  "--restore only undoes what a crashed run left, then exits")
        if command:
            raise UsageError("--restore takes no command", "run `tilewise tune --restore` alone")
        from tilewise.cli.restore import restore_report

        return restore_report(as_json)
    w = wl.canonical(workload_name) if workload_name else None
    if w:
        params = make_params(w, dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed, paper_scale)
    elif any(v is not None for v in (dataset, records, groups, zipf_exponent, ratio, ops, slots, threads, seed)) or paper_scale:
        raise UsageError("workload options (--records, --threads, ...) apply to --workload, not to a command")
    else:
        params = None
    cfg = session.Config(workload=w, params=params, command=tuple(command), allocators=alloc_list, mem=mem_list,
                         placements=placements, repeat=repeat, warmup=warmup, out=out_dir, apply_os=apply_os, thp=thp,
                         autonuma=autonuma, os_root=os_root, timeout=timeout)
    session.run(cfg, _Reporter(as_json))


class _Reporter:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.err = console(stderr=True)

    def message(self, text: str) -> None:
        if not self.as_json:
            self.err.print(text, markup=False)

    def done(self, doc: dict) -> None:
        if self.as_json:
            return emit_json(doc)
        from tilewise.results import report

        out = console(wide=True)
        report.render(doc, out)
        for k, p in doc["files"].items():
            out.print(f"wrote {k}: {p}", markup=False)
