"""What every kind's tables and CSV files are made of: number formats, a rich table, note lines
and CSV text. Tables go to the console a caller passes in, never one of their own."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence


def fmt(x, spec: str = ".3f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def num(x) -> str:
    """A figure of any size with about four significant digits (the generic tables)."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    a = abs(x)
    return f"{x:.4g}" if a < 1e-3 or a >= 1e5 else (f"{x:.4f}" if a < 1 else f"{x:.3f}" if a < 100 else f"{x:.1f}")


def ci_half(ci: Sequence[float] | None) -> float | None:
    return None if not ci else (ci[1] - ci[0]) / 2


def human_bytes(n: int) -> str:
    """Decimal units, as STREAM sizes are given (4 MB = 4e6 bytes)."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n} B"


def binary_bytes(n: float) -> str:
    """Binary units, as memory is reported (max RSS)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def table(title: str | None = None, columns: Sequence[str] = (), *, left: Sequence[str] = ()):
    """A rich table in tilewise's style; `columns` right-aligned except those in `left`."""
    from rich.table import Table

    t = Table(title=title, show_edge=False, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def lines(out, prefix: str, texts: Sequence[str]) -> None:
    for line in texts:
        out.print(f"{prefix}{line}", markup=False, highlight=False)


def footer(doc, out, *, notes: Sequence[str] = ()) -> None:
    """The lines under a kind's tables: its notes, the document's warnings, the system check's."""
    lines(out, "note: ", notes)
    lines(out, "warning: ", doc.warnings)
    lines(out, "system: ", doc.system_warnings)


def csv_text(header: Sequence, rows: Sequence[Sequence]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def far_memory(study: dict, out) -> None:
    """The far-memory study (bench --mem-variants, workload --mem-variants; bench.far_memory's summary):
    per query (or workload), each variant's slowdown against near memory, and the verdicts."""
    for dep, variants in (study.get("deployments") or {}).items():
        out.print(f"[bold]{dep}[/bold]: slowdown against near memory (ratio of geometric means, 95 % interval)")
        t = table(None, ("query", *variants), left=["query"])
        for q in dict.fromkeys(q for rec in variants.values() for q in rec["queries"]):
            cells = []
            for rec in variants.values():
                r = rec["queries"].get(q) or {}
                ci = r.get("ci95")
                cells.append("-" if r.get("slowdown") is None else f"{r['slowdown']:.2f}x"
                             + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""))
            t.add_row(q, *cells)
        out.print(t)
        lines(out, "verdict: ", [rec["verdict"] for rec in variants.values()])
    if study:
        out.print(f"usable: the whole interval below {study['usable_below']:.2f}x near memory; hurts: above "
                  f"{study['hurts_above']:.2f}x (thesis 004, ch. 4: where the far tier can stand in for near memory)",
                  markup=False)
