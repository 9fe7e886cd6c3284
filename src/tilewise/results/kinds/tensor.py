"""The results kind `workload.tensor` (`tilewise workload T1|T2|T3`): its table, CSV and plot.

Every variant's median time, its ratio to the tensor program run eagerly (and with the host-device
transfer on a GPU), whether its answer was checked against the exact reference, and the thesis's
figure beside it. The metrics (one per variant, its timed runs) are written by the producer
(metrics() below, called by the command) and kept as they are.
"""

from __future__ import annotations

from pathlib import Path

from tilewise.results import plots as P
from tilewise.results.document import metric
from tilewise.results.kinds import Kind
from tilewise.results.tables import csv_text

FILES = ("tensor.csv", "tensor.png")


def metrics(doc: dict) -> list[dict]:
    """One metric per variant: its timed runs (`tilewise report` compares them across runs)."""
    w = doc.get("workload", "T")
    return [metric(f"{w}/{v['name']}", v["times_s"], unit="s", workload=w, variant=v["name"], device=v.get("device"))
            for v in doc.get("variants", []) if v.get("times_s")]


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _thesis(row: dict) -> str:
    t = row.get("thesis")
    if not t:
        return ""
    r = t.get("ratio_to_eager")
    rng = "" if not r else (f"{r[0]:.2f}" if r[0] == r[1] else f"{r[0]:g}-{r[1]:g}") + ": "
    return rng + t["text"]


def render(doc: dict, out) -> None:
    from rich.table import Table

    out.print(f"[bold]{doc['workload']}[/bold] {doc.get('description', '')}")
    p = doc.get("params", {}).get("resolved") or doc.get("params", {})
    if doc["workload"] == "T3":
        shape = (f"R-MAT graph, {doc.get('nodes', 0):,} nodes, {doc.get('edges', 0):,} edges (LiveJournal x {p.get('scale')}), "
                 f"{p.get('iterations')} iterations max, tolerance {p.get('tolerance')}, {p.get('dtype')}")
    elif doc["workload"] == "T1":
        shape = f"{p.get('records', 0):,} keys, dataset {p.get('dataset')}"
    else:
        shape = f"|R| {p.get('records', 0):,}, |S| {p.get('records', 0) * p.get('ratio', 1):,}, dataset {p.get('dataset')}"
    out.print(f"  data       {shape} (generated in {doc.get('gen_s', 0):.2f} s, not timed)", markup=False)
    out.print(f"  device     {doc.get('device')}, {doc.get('threads')} thread(s)"
              + (f", OMP_PLACES {doc['omp_places']}" if doc.get("omp_places") else "")
              + (f", GPU {doc['gpu'].get('name')} {doc['gpu'].get('uuid') or ''}" if doc.get("gpu") else ""), markup=False)
    if doc.get("rename"):
        r = doc["rename"]
        out.print(f"  renaming   {r['method']}: {r['reason']}", markup=False)
    t = Table(title=None, show_lines=False)
    for col in ("variant", "engine", "device", "median s", "x eager", "x eager +transfer", "answer", "thesis (x eager)"):
        t.add_column(col, overflow="fold")
    by = {v["name"]: v for v in doc.get("variants", [])}
    for row in doc.get("summary", {}).get("rows", []):
        v = by.get(row["name"], {})
        if row.get("skipped"):
            t.add_row(row["name"], "-", "-", "-", "-", "-", f"skipped: {row['skipped']}", _thesis(row))
            continue
        answer = "checked" if row.get("checked") else f"WRONG: {v.get('check')}"
        extra = f" (+{v['compile_s']:.2f} s compile)" if v.get("compile_s") is not None else ""
        t.add_row(row["name"], str(row.get("engine") or ""), str(row.get("device") or ""),
                  f"{row['median_s']:.4f}{extra}" if row.get("median_s") is not None else "-",
                  _ratio(row.get("ratio_to_eager")), _ratio(row.get("ratio_to_eager_with_transfer")), answer,
                  _thesis(row))
    out.print(t)
    out.print(f"  checked    {'yes' if doc.get('checked') else 'NO'}: against {doc.get('check')}", markup=False)
    v = doc.get("verification") or {}
    if v:
        out.print(f"  binding    {v.get('summary') or v.get('state') or ''}".rstrip(), markup=False)


def tensor_csv(doc: dict) -> dict[str, str]:
    by = {v["name"]: v for v in doc.get("variants", [])}
    rows = []
    for row in doc.get("summary", {}).get("rows", []):
        v = by.get(row["name"], {})
        rows.append([doc["workload"], row["name"], row.get("engine"), row.get("device"), row.get("median_s"),
                     row.get("ratio_to_eager"), row.get("ratio_to_eager_with_transfer"), row.get("checked"),
                     " ".join(f"{x:.6f}" for x in v.get("times_s", [])), v.get("compile_s"), v.get("transfer_s"),
                     _thesis(row)])
    return {"tensor.csv": csv_text(["workload", "variant", "engine", "device", "median_s", "ratio_to_eager",
                                    "ratio_to_eager_with_transfer", "checked", "times_s", "compile_s", "transfer_s",
                                    "thesis"], rows)}


def tensor_plots(doc: dict, out_dir: Path) -> list[Path]:
    rows = [r for r in doc.get("summary", {}).get("rows", []) if r.get("median_s") is not None]
    if not rows:
        return []

    plt = P.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["name"] for r in rows]
    ax.bar(names, [r["median_s"] for r in rows], color=["#4c72b0" if r.get("checked") else "#c44e52" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("median time (s, log)")
    ax.set_title(f"{doc['workload']} on {doc.get('device')}: tensor program vs baselines")
    fig.tight_layout()
    return [P.save(fig, Path(out_dir) / "tensor.png", dpi=110)]


KIND = Kind.plain("workload.tensor", render, tensor_csv, tensor_plots, FILES)
