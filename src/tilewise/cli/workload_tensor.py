"""The options `tilewise workload T1|T2|T3` adds (the thesis's tensor operators), and the run.

`workload` parses the options it shares with W1-W4 (sizes, allocator, memory policy, placement,
OS switches, --out, --json) and hands a T workload here; this module turns the tensor options into
`tilewise.tensor.run.Params`, resolves the device and the tile, runs, and renders.
"""

from __future__ import annotations

import click

from tilewise.cli.common import AT_LEAST_1, INDEX, NON_NEGATIVE, Number, parse_size

TENSOR_OPTIONS = ("device", "rename", "bincount_memory", "scale", "iterations", "tolerance", "damping", "dtype",
                  "variants", "runs", "warmup", "policy", "instance_id")


def tensor_options(f):
    opts = [
        click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda[:N|:UUID]",
                     help="T1-T3: where the tensor program runs (cuda: the GPU's process sees only that GPU)."),
        click.option("--variants", "variants_text", default=None, metavar="LIST",
                     help="T1-T3: what to run, e.g. eager,compiled,native,duckdb (T3: eager,compiled,scipy; "
                          "GPU: cudf, cugraph); default all that apply."),
        click.option("--rename", "rename_method", default="auto", show_default=True, metavar="auto|none|offset|dense",
                     help="T1/T2: tuple renaming before bincount (offset: keys - min; dense: rank among distinct keys)."),
        click.option("--bincount-memory", "bincount_memory_text", default=None, metavar="SIZE",
                     help="T1/T2: most memory bincount's counters may take (default a quarter of what is free)."),
        click.option("--scale", type=Number(min=0, min_open=True, max=64), default=None,
                     help="T3: graph size as a factor of LiveJournal's 4.85M nodes / 69M edges (default 0.01)."),
        click.option("--iterations", type=AT_LEAST_1, default=None, help="T3: PageRank iterations at most (default 50)."),
        click.option("--tolerance", type=NON_NEGATIVE, default=None,
                     help="T3: stop when the L1 change of the ranks falls below this (default 0: run all iterations)."),
        click.option("--damping", type=Number(min=0, max=1, min_open=True, max_open=True), default=None,
                     help="T3: damping factor (default 0.85)."),
        click.option("--dtype", default=None, metavar="float64|float32", help="T3: rank type (default float64)."),
        click.option("--runs", type=AT_LEAST_1, default=3, show_default=True, help="T1-T3: timed runs per variant."),
        click.option("--warmup", type=INDEX, default=1, show_default=True, help="T1-T3: untimed runs per variant first."),
        click.option("--policy", default=None, metavar="POLICY",
                     help="T1-T3: run inside one tile of this plan (win: a NUMA node; see tilewise plan)."),
        click.option("--instance", "-i", "instance_id", type=INDEX, default=None, help="T1-T3: which tile of --policy (default 0)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_params(w, dataset, records, groups, zipf_exponent, ratio, threads, seed, paper_scale, device, variants_text,
                rename_method, bincount_memory_text, scale, iterations, tolerance, damping, dtype, runs, warmup):
    from tilewise.errors import UsageError
    from tilewise.tensor import run as tr

    if paper_scale:
        from tilewise.cli.common import conflicts

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


def tile(t, policy: str | None, instance_id: int | None, uses_gpu: bool = False):
    """(plan, instance) to run in, or None. uses_gpu (--device cuda): auto plans GPU tiles."""
    from tilewise.cli.plan import make_plan
    from tilewise.errors import UsageError

    if policy is None:
        if instance_id is not None:
            raise UsageError("--instance needs --policy", "e.g. --policy win --instance 1")
        return None
    p = make_plan(t, policy.strip().lower(), None, None, None, False, uses_gpu=uses_gpu)
    i = instance_id or 0
    if not 0 <= i < len(p.instances):
        raise UsageError(f"instance {i} does not exist: the {p.policy} plan has {len(p.instances)}",
                         f"use --instance 0..{len(p.instances) - 1}")
    return p, p.instances[i]


def resolve_gpu(device: str, inst=None):
    """None for cpu; the GPU (devices.PciDevice) for cuda[:N|:UUID], or one Error line. In a GPU
    tile (inst.gpu) `cuda` is the tile's GPU, and another one is refused."""
    if device == "cpu":
        return None
    from tilewise import devices
    from tilewise.errors import UsageError

    found = devices.discover()
    if inst is None or not inst.gpu:
        return devices.resolve_cuda(device, found)
    mine = devices.resolve_cuda(f"cuda:{inst.gpu_uuid}" if inst.gpu_uuid else device, found)
    if mine.address != inst.gpu:
        raise UsageError(f"tile {inst.id} is GPU {inst.gpu}, which CUDA does not list here ({mine.address} is)",
                         "plan on this machine (leave --topology out)")
    if device != "cuda" and devices.resolve_cuda(device, found).address != mine.address:
        raise UsageError(f"--device {device} is not tile {inst.id}'s GPU ({mine.label()})",
                         "use --device cuda inside a GPU tile (the tile chooses the GPU)")
    return mine


def run_cmd(p, cfg, t, sw, desired, apply_os, policy, instance_id, timeout, dry_run, out_dir, topology_src, as_json,
            null_ctx):
    """Run (or with dry_run show) a tensor workload under cfg, in a tile when --policy is given."""
    import os

    from tilewise import cpulist
    from tilewise.cli.common import console, emit_json
    from tilewise.errors import TilewiseError
    from tilewise.tensor import DESCRIPTIONS, run as tr
    from tilewise.tune import knobs

    picked = tile(t, policy, instance_id, uses_gpu=p.device != "cpu")
    cpus = None
    if picked is not None:
        plan, inst = picked
        cpus = tuple(inst.cpus)
        if cfg.mem == "first-touch" and not cfg.mem_nodes:  # the tile's memory unless --mem says otherwise
            cfg = knobs.Config(cfg.allocator, inst.mem_policy, tuple(inst.mem_nodes), cfg.placement, cfg.thp, cfg.autonuma)
    gpu = resolve_gpu(p.device, picked[1] if picked else None)
    if dry_run:
        d = p.resolved()
        allowed = set(cpus) if cpus else (None if topology_src else set(os.sched_getaffinity(0)))
        pin = knobs.thread_order(t, cfg.placement, d["threads"] or len(allowed or t.pus), allowed)
        doc = {"workload": p.workload, "params": d, "config": cfg.to_json(), "pin": pin,
               "tile": picked[1].to_json() if picked else None, "gpu": gpu.to_json() if gpu else None,
               "worker": tr.worker("SPEC.json", pin, gpu.uuid if gpu else None)[0], "estimated_bytes": tr.estimate_bytes(d)}
        if as_json:
            emit_json(doc)
        else:
            out = console()
            out.print(f"{p.workload}: {DESCRIPTIONS[p.workload]}", markup=False)
            out.print(f"config: {cfg.label()}" + (f", tile {picked[0].policy} #{picked[1].id} CPUs {cpulist.format(picked[1].cpus)}"
                                                   if picked else ""), markup=False)
            out.print(f"variants: {', '.join(d['variants'])} on {p.device}", markup=False)
            out.print(f"thread CPUs: {pin if pin else 'none (OS schedules)'}", markup=False)
        return
    from tilewise.environment import system_check
    from tilewise.results import model, report
    from tilewise.results.kinds import tensor as tensor_kind
    from tilewise.results.output import Writer

    writer = Writer(out_dir) if out_dir else Writer(None)
    doc = model.new("workload.tensor", topo=t, system_check=system_check(numa_nodes=len(t.cpu_nodes)),
                    params={"workload": p.workload, **p.to_json(), "config": cfg.to_json(), "timeout_s": timeout,
                            "policy": policy, "instance": instance_id})
    tr.preflight(p)
    err = console(stderr=True)
    if not as_json:
        err.print(f"{p.workload}: {DESCRIPTIONS[p.workload]} on {p.device}"
                  + ("; the first compiled run compiles (tens of seconds the first time, cached after)"
                     if "compiled" in p.resolved()["variants"] else ""), markup=False)
    ctx = sw.applied(desired) if apply_os else null_ctx()
    with ctx as changes:
        run_state = sw.state()
        body = tr.run(p, cfg, t, timeout=timeout, cpus=cpus, gpu=gpu,
                      on_message=None if as_json else (lambda m: err.print(m, markup=False)))
    body.pop("params", None)
    doc.update(body)
    doc.update({"config": cfg.to_json(), "label": cfg.label(), "tile": picked[1].to_json() if picked else None,
                "os_switches": {k: v.to_json() for k, v in run_state.items()},
                "os_changed": [c.to_json() for c in changes], "os_restored": bool(changes)})
    doc["params"]["resolved"] = p.resolved()
    doc["metrics"] = tensor_kind.metrics(doc)
    wrong = tr.wrong_answers(doc)
    model.finish(doc, complete=not wrong)
    writer.write(doc)
    if as_json:
        emit_json(doc)
    else:
        report.render(doc, console(wide=True))
        if writer.json_path:
            console().print(f"wrote {writer.json_path}", markup=False)
    if wrong:
        raise TilewiseError(f"{p.workload}: wrong answer(s): {'; '.join(wrong)}",
                            "the figures are kept in the results; report this as a bug")
