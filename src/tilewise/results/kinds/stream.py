"""The ``probe.stream`` result kind (`probe stream`): STREAM copy/scale/add/triad as bound processes
per deployment layout and array size, aggregate GB/s (best and median repetition, median over
runs), optionally next to likwid-bench; its table, CSV and plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

KERNELS = ("copy", "scale", "add", "triad")


@dataclass
class Kernel(Record):
    best_gbs: float | None = None
    median_gbs: float | None = None


@dataclass
class Case(Record):
    policy: str = ""
    size_bytes: int = 0
    instances: int = 1
    kernels: dict[str, Kernel] = field(default_factory=dict)  # medians over runs
    runs: list[dict[str, Kernel]] = field(default_factory=list)  # each run's figures


@dataclass
class Likwid(Record):
    size_bytes: int = 0
    gbs: float | None = None
    command: str | None = None
    error: str | None = None


@dataclass
class StreamDoc(document.Document):
    cpus: list[int] = field(default_factory=list)
    ntimes: int = 0
    runs: int = 1
    cases: list[Case] = field(default_factory=list)
    likwid: list[Likwid] = field(default_factory=list)


def metrics(doc: StreamDoc) -> list[dict]:
    out = []
    for c in doc.cases:
        for k in KERNELS:
            vals = [r[k].best_gbs for r in c.runs if k in r]
            if vals:
                out.append(document.metric(f"{c.policy}/{c.size_bytes}/{k}", vals, unit="GB/s", better="higher",
                                        policy=c.policy, size_bytes=c.size_bytes, kernel=k))
    return out


def render(doc: StreamDoc, out) -> None:
    out.print(f"[bold]STREAM[/bold] aggregate GB/s (best of {doc.ntimes - 1} repetitions after a warm-up"
              + (f", median over {doc.runs} runs" if doc.runs > 1 else "") + f"; CPUs {cpulist.format(doc.cpus)})")
    if not doc.cases:
        out.print("no cases measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
    else:
        table = T.table(None, ("policy", "processes", "array size", *KERNELS), left=["policy"])
        for c in doc.cases:
            table.add_row(c.policy, str(c.instances), T.human_bytes(c.size_bytes),
                          *(f"{c.kernels[k].best_gbs:.2f}" for k in KERNELS))
        out.print(table)
    if doc.likwid:
        out.print("[bold]reference: likwid-bench[/bold] (same number of threads, node domain; likwid reports the "
                  "mean over its run, tilewise the best and median repetition)")
        lt = T.table(None, ("array size", "tilewise wim copy best", "median", "likwid-bench", "best/likwid"))
        for lk in doc.likwid:
            ours = next((c.kernels["copy"] for c in doc.cases if c.policy == "wim" and c.size_bytes == lk.size_bytes),
                        None)
            best = f"{ours.best_gbs:.2f}" if ours else "(wim not run)"
            med = f"{ours.median_gbs:.2f}" if ours else "-"
            if lk.gbs is not None:
                ratio = f"{ours.best_gbs / lk.gbs:.3f}" if ours else "-"
                lt.add_row(T.human_bytes(lk.size_bytes), best, med, f"{lk.gbs:.2f}", ratio)
            else:
                lt.add_row(T.human_bytes(lk.size_bytes), best, med, "not measured", "-")
        out.print(lt)
        for lk in doc.likwid:
            if lk.command is not None:
                out.print(f"  likwid: {lk.command}", markup=False)
            if lk.error is not None:
                out.print(f"  likwid-bench failed: {lk.error}", markup=False)
    T.footer(doc, out)


def csv_files(doc: StreamDoc) -> dict[str, str]:
    if not doc.cases:
        return {}
    header = ["policy", "instances", "size_bytes", *(f"{k}_best_gbs" for k in KERNELS),
              *(f"{k}_median_gbs" for k in KERNELS)]
    rows = [[c.policy, c.instances, c.size_bytes, *(f"{c.kernels[k].best_gbs:.3f}" for k in KERNELS),
             *(f"{c.kernels[k].median_gbs:.3f}" for k in KERNELS)] for c in doc.cases]
    return {"stream.csv": T.csv_text(header, rows)}


def plots(doc: StreamDoc, out_dir: Path) -> list[Path]:
    if not doc.complete or not doc.cases:
        return []
    return [plot(doc, out_dir / "stream.png")]


def plot(doc: StreamDoc, path: Path) -> Path:
    """copy and triad GB/s over the array size, one line per layout."""
    plt = P.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, k in zip(axes, ("copy", "triad")):
        for pol in dict.fromkeys(c.policy for c in doc.cases):
            cs = sorted((c for c in doc.cases if c.policy == pol), key=lambda c: c.size_bytes)
            n = cs[0].instances
            ax.plot([c.size_bytes / 1e6 for c in cs], [c.kernels[k].best_gbs for c in cs],
                    marker="o", label=f"{pol} ({n} process{'es' if n > 1 else ''})")
        ax.set_xscale("log")
        ax.set_xlabel("array size (MB, one array over all processes)")
        ax.set_ylabel("aggregate GB/s (best repetition, median of runs)")
        ax.set_title(f"STREAM {k}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return P.save(fig, path)


KIND = Kind(name="probe.stream", document=StreamDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=("stream.csv", "stream.png"))
