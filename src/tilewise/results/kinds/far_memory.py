"""The results kind `workload.far_memory` (`tilewise workload W1-W4 --mem-variants`, tune.far_memory):
the far-memory study of one workload in one tile: each memory variant's placement, timed runs and
binding read back, its slowdown against near memory with a 95 % interval and the verdict (the same
table as `bench tpch --mem-variants`); its typed body, metrics (one per variant: its timed runs),
table and CSV."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from tilewise.results import document
from tilewise.results.body import Record
from tilewise.results.document import metric
from tilewise.results.kinds import Kind
from tilewise.results.tables import csv_text, far_memory, footer

FILES = ("far_memory.csv",)


@dataclass
class Variant(Record):
    """One memory variant of the tile: its placement, timed runs and their bindings read back."""

    title: str = ""
    mem_policy: str = ""
    mem_nodes: list[int] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)  # node -> weight (weighted interleave)
    mem_reason: str = ""
    binding: dict = field(default_factory=dict)
    weights_set: list[str] = field(default_factory=list)  # what the change-and-undo layer set
    times_s: list[float | None] = field(default_factory=list)
    warmup_s: list[float | None] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # the workload's own result of each timed run
    verification: list[dict | None] = field(default_factory=list)


@dataclass
class FarMemoryDoc(document.Document):
    workload: str = "W"
    deployment: str = ""
    description: str = ""
    cpus: list[int] = field(default_factory=list)
    variants: dict[str, Variant] = field(default_factory=dict)
    far_memory: dict | None = None  # bench.far_memory's summary: slowdowns, intervals, verdicts
    wrong_answers: list[str] = field(default_factory=list)
    emulated: str | None = None


def metrics(doc: FarMemoryDoc) -> list[dict]:
    """One metric per variant: its timed runs."""
    return [metric(f"{doc.workload}/{name}/time", [x for x in v.times_s if x is not None], unit="s",
                   workload=doc.workload, variant=name)
            for name, v in doc.variants.items()]


def _verified(rec: Variant) -> str:
    vs = [v for v in rec.verification if v]
    if not vs:
        return "-"
    mem = {((v.get("checks") or {}).get("memory") or {}).get("got") for v in vs}
    ok = all(v.get("ok") for v in vs)
    return ("verified: " if ok else "NOT verified: ") + ", ".join(sorted(m for m in mem if m))


def render(doc: FarMemoryDoc, out) -> None:
    from rich.table import Table

    p = doc.params
    out.print(f"[bold]{doc.workload}[/bold] {doc.description}: far-memory study in tile "
              f"{p.get('policy')} #{p.get('instance')} (CPUs {','.join(map(str, doc.cpus))}), "
              f"{p.get('warmup')} warm-up + {p.get('runs')} timed run(s) per variant")
    t = Table()
    for col in ("variant", "memory", "median s", "runs s", "binding read back"):
        t.add_column(col, overflow="fold")
    for name, rec in doc.variants.items():
        mem = rec.mem_policy + ":" + ",".join(map(str, rec.mem_nodes))
        if rec.weights:
            mem += " weights " + ":".join(str(w) for _, w in sorted(rec.weights.items(), key=lambda x: int(x[0])))
        ts = [x for x in rec.times_s if x is not None]
        t.add_row(name, mem, f"{median(ts):.4f}" if ts else "-", " ".join(f"{x:.4f}" for x in ts), _verified(rec))
    out.print(t)
    for name, rec in doc.variants.items():
        for line in rec.weights_set:
            out.print(f"  {name}: {line}", markup=False)
    far_memory(doc.far_memory or {}, out)
    for w in doc.wrong_answers:
        out.print(f"[red]WRONG ANSWER[/red] {w}")
    footer(doc, out)


def csv_files(doc: FarMemoryDoc) -> dict[str, str]:
    study = next(iter(((doc.far_memory or {}).get("deployments") or {}).values()), {})
    rows = []
    for name, rec in doc.variants.items():
        q = ((study.get(name) or {}).get("queries") or {}).get(doc.workload) or {}
        ci = q.get("ci95") or [None, None]
        rows.append([doc.workload, name, rec.mem_policy, " ".join(map(str, rec.mem_nodes)),
                     " ".join(f"{n}={w}" for n, w in rec.weights.items()),
                     " ".join(f"{x:.6f}" for x in rec.times_s if x is not None),
                     q.get("slowdown"), ci[0], ci[1], q.get("verdict")])
    return {"far_memory.csv": csv_text(["workload", "variant", "mem_policy", "mem_nodes", "weights", "times_s",
                                        "slowdown", "ci95_low", "ci95_high", "verdict"], rows)}


KIND = Kind("workload.far_memory", FarMemoryDoc, metrics=metrics, render=render, csv=csv_files, files=FILES)
