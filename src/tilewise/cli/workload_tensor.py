"""The options `tilewise workload T1|T2|T3` adds (the thesis's tensor operators), and the run.

`workload` parses the options it shares with W1-W4 (sizes, allocator, memory policy, placement,
OS switches, --out, --json) and hands a T workload here; this module turns the tensor options into
`tilewise.tensor.run.Params`, calls the use case (tilewise.tensor.session) and renders.
"""

from __future__ import annotations

from pathlib import Path

import click

from tilewise.cli.common import (AT_LEAST_1, INDEX, NON_NEGATIVE, Messages, Number, conflicts, console, emit_json,
                                 parse_size)
from tilewise.errors import UsageError

def tensor_options(f):
    opts = [
        click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda[:N|:UUID]",
                     help="Where the tensor program runs (cuda: the GPU's process sees only that GPU)."),
        click.option("--variants", "variants_text", default=None, metavar="LIST",
                     help="What to run, e.g. eager,compiled,native,duckdb (T3: eager,compiled,scipy; "
                          "GPU: cudf, cugraph); default all that apply."),
        click.option("--rename", "rename_method", default="auto", show_default=True, metavar="auto|none|offset|dense",
                     help="Tuple renaming before bincount (offset: keys - min; dense: rank among distinct keys)."),
        click.option("--bincount-memory", "bincount_memory_text", default=None, metavar="SIZE",
                     help="Most memory bincount's counters may take (default a quarter of what is free)."),
        click.option("--scale", type=Number(min=0, min_open=True, max=64), default=None,
                     help="Graph size as a factor of LiveJournal's 4.85M nodes / 69M edges (default 0.01)."),
        click.option("--iterations", type=AT_LEAST_1, default=None, help="PageRank iterations at most (default 50)."),
        click.option("--tolerance", type=NON_NEGATIVE, default=None,
                     help="Stop when the L1 change of the ranks falls below this (default 0: run all iterations)."),
        click.option("--damping", type=Number(min=0, max=1, min_open=True, max_open=True), default=None,
                     help="Damping factor (default 0.85)."),
        click.option("--dtype", default=None, metavar="float64|float32", help="Rank type (default float64)."),
        click.option("--runs", type=AT_LEAST_1, default=3, show_default=True, help="Timed runs per variant."),
        click.option("--warmup", type=INDEX, default=1, show_default=True, help="Untimed runs per variant first."),
        click.option("--policy", default=None, metavar="POLICY",
                     help="Run inside one tile of this plan (win: a NUMA node; see tilewise plan)."),
        click.option("--instance", "-i", "instance_id", type=INDEX, default=None, help="Which tile of --policy (default 0)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_params(w, dataset, records, groups, zipf_exponent, ratio, threads, seed, paper_scale, device, variants_text,
                rename_method, bincount_memory_text, scale, iterations, tolerance, damping, dtype, runs, warmup):
    from tilewise.tensor import run as tr

    if paper_scale:
        conflicts("--paper-scale", ("records", "scale"), "--paper-scale sets the thesis's sizes; give either")
        for k, v in tr.PAPER_SCALE[w].items():
            if k == "records" and records is None:
                records = v
            if k == "scale" and scale is None:
                scale = v
    variants = tr.parse_variants(variants_text, w) if variants_text else None
    mem = parse_size(bincount_memory_text, "--bincount-memory", minimum=8) if bincount_memory_text else None
    if mem is not None and w == "T3":
        raise UsageError("--bincount-memory applies to T1 and T2 (bincount), not T3")
    p = tr.Params(w, dataset, records, groups, zipf_exponent, ratio, scale, iterations, tolerance, damping, dtype,
                  threads, seed, device.strip().lower() if device.strip().lower() in ("cpu", "cuda") else device.strip(),
                  rename_method.strip().lower(), mem, variants, runs, warmup)
    tr.validate(p)
    return p


class _Reporter(Messages):
    def __init__(self, as_json: bool, out_dir: str | None) -> None:
        super().__init__(quiet=as_json)
        self.as_json, self.out_dir = as_json, out_dir

    def done(self, doc: dict) -> None:
        from tilewise.results import report

        if self.as_json:
            return emit_json(doc)
        report.render(doc, console(wide=True))
        if self.out_dir:
            console().print(f"wrote {Path(self.out_dir) / 'results.json'}", markup=False)


def run(p, knobs, policy, instance_id, timeout, dry_run, out_dir, topology_src, as_json) -> None:
    """Run (or with dry_run show) a tensor workload (tensor.session), in a tile when --policy is given."""
    from tilewise.cli.plan import make_plan
    from tilewise.tensor import session

    plan = (lambda t, gpu: make_plan(t, policy.strip().lower(), None, None, None, False, uses_gpu=gpu)) if policy \
        else None
    cfg = session.Config(p, knobs, plan=plan, policy=policy, instance=instance_id, timeout=timeout, out=out_dir,
                         topology_src=topology_src)
    rep = _Reporter(as_json, out_dir)
    if dry_run:
        return _show_dry_run(*session.describe(cfg, rep), p, as_json)
    session.run(cfg, rep)


def _show_dry_run(doc: dict, plan, p, as_json: bool) -> None:
    from tilewise import cpulist
    from tilewise.tensor import DESCRIPTIONS
    from tilewise.tune import knobs

    if as_json:
        return emit_json(doc)
    out = console()
    tile = doc["tile"]
    out.print(f"{p.workload}: {DESCRIPTIONS[p.workload]}", markup=False)
    out.print(f"config: {knobs.Config.from_json(doc['config']).label()}"
              + (f", tile {plan.policy} #{tile['id']} CPUs {cpulist.format(tile['cpus'])}" if tile else ""), markup=False)
    out.print(f"variants: {', '.join(doc['params']['variants'])} on {p.device}", markup=False)
    out.print(f"thread CPUs: {doc['pin'] if doc['pin'] else 'none (OS schedules)'}", markup=False)
