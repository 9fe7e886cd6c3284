"""The results kind `workload.far_memory` (`tilewise workload W1-W4 --mem-variants`, tune.far_memory):
the far-memory study of one workload in one tile: each memory variant's placement, timed runs and
binding read back, its slowdown against near memory with a 95 % interval and the verdict (the same
table as `bench tpch --mem-variants`). The metrics (one per variant: its timed runs) are written by
the producer."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from tilewise.results.kinds import Kind
from tilewise.results.tables import csv_text, far_memory

FILES = ("far_memory.csv",)


def _verified(rec: dict) -> str:
    vs = [v for v in rec.get("verification") or [] if v]
    if not vs:
        return "-"
    mem = {((v.get("checks") or {}).get("memory") or {}).get("got") for v in vs}
    ok = all(v.get("ok") for v in vs)
    return ("verified: " if ok else "NOT verified: ") + ", ".join(sorted(m for m in mem if m))


def render(doc: dict, out) -> None:
    from rich.table import Table

    p = doc.get("params") or {}
    out.print(f"[bold]{doc.get('workload')}[/bold] {doc.get('description', '')}: far-memory study in tile "
              f"{p.get('policy')} #{p.get('instance')} (CPUs {','.join(map(str, doc.get('cpus') or []))}), "
              f"{p.get('warmup')} warm-up + {p.get('runs')} timed run(s) per variant")
    t = Table()
    for col in ("variant", "memory", "median s", "runs s", "binding read back"):
        t.add_column(col, overflow="fold")
    for name, rec in (doc.get("variants") or {}).items():
        mem = rec.get("mem_policy", "") + ":" + ",".join(map(str, rec.get("mem_nodes") or []))
        if rec.get("weights"):
            mem += " weights " + ":".join(str(w) for _, w in sorted(rec["weights"].items(), key=lambda x: int(x[0])))
        ts = [x for x in rec.get("times_s") or [] if x is not None]
        t.add_row(name, mem, f"{median(ts):.4f}" if ts else "-", " ".join(f"{x:.4f}" for x in ts), _verified(rec))
    out.print(t)
    for name, rec in (doc.get("variants") or {}).items():
        for line in rec.get("weights_set") or []:
            out.print(f"  {name}: {line}", markup=False)
    far_memory(doc.get("far_memory") or {}, out)
    for w in doc.get("wrong_answers") or []:
        out.print(f"[red]WRONG ANSWER[/red] {w}")


def csv_files(doc: dict) -> dict[str, str]:
    study = next(iter(((doc.get("far_memory") or {}).get("deployments") or {}).values()), {})
    rows = []
    for name, rec in (doc.get("variants") or {}).items():
        q = ((study.get(name) or {}).get("queries") or {}).get(doc.get("workload")) or {}
        ci = q.get("ci95") or [None, None]
        rows.append([doc.get("workload"), name, rec.get("mem_policy"), " ".join(map(str, rec.get("mem_nodes") or [])),
                     " ".join(f"{n}={w}" for n, w in (rec.get("weights") or {}).items()),
                     " ".join(f"{x:.6f}" for x in rec.get("times_s") or [] if x is not None),
                     q.get("slowdown"), ci[0], ci[1], q.get("verdict")])
    return {"far_memory.csv": csv_text(["workload", "variant", "mem_policy", "mem_nodes", "weights", "times_s",
                                        "slowdown", "ci95_low", "ci95_high", "verdict"], rows)}


def plots(doc: dict, out_dir: Path) -> list[Path]:
    return []


KIND = Kind.plain("workload.far_memory", render, csv_files, plots, FILES)
