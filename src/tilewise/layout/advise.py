"""Break-even and the recommendation, as pure functions of recorded measurements.

Input: the "layout" results document's ``layouts`` entries (per layout: per query the median time,
bytes read and CPU-seconds of its runs; the workload's total per run; what making the layout cost),
the as-is baseline's name, and optionally how many times the workload will run. The rules:

1. **The figure of merit** is the workload's time (the sum of the queries' medians); with
   ``expected_runs`` N it is what the layout costs over N runs: making it once plus N workloads
   (the thesis's question: does a transformation pay for itself before the workload stops running?).
2. **Files over the size bound** (200 MB, the thesis's finding) rule a transformed layout out while
   another transformed layout within the bound is left. The data as it is, the baseline, is never
   ruled out (its files are what they are) and does not count as that other layout: with only
   layouts over the bound measured, they stay in, and when one wins the reasons say its files are
   over the bound and how many files per table would keep them under it.
3. **The simplest of the fastest**: every layout within ``same`` (5 %) of the best figure, or, with
   three runs or more of each, whose workload times' 95 % interval overlaps the best's (the
   difference is noise; two runs give intervals too wide to say anything), is as good; of those
   the one that is cheapest to make and keep wins: one copy before two, unsorted before sorted, then
   the least time to make, then the fewest bytes.
4. **Break-even**: transformation time / (baseline workload time - layout workload time), in runs of
   the workload (never, when the layout is not faster); the same in CPU-seconds.

The reasons say which rule decided and give the figures against the baseline, so a user can
disagree with the weighting and see why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SAME = 0.05


@dataclass
class Recommendation:
    layout: str
    reasons: list[str] = field(default_factory=list)
    ranking: list[str] = field(default_factory=list)  # every layout, best figure first

    def to_json(self) -> dict:
        return {"layout": self.layout, "reasons": list(self.reasons), "ranking": list(self.ranking)}


def break_even(baseline_s: float | None, layout_s: float | None, cost: float | None) -> float | None:
    """Workload runs after which making the layout has paid for itself (None: never, it is not faster;
    0 when it cost nothing)."""
    if baseline_s is None or layout_s is None or cost is None:
        return None
    saving = baseline_s - layout_s
    if saving <= 0:
        return None
    return cost / saving


def workload_s(entry: dict) -> float | None:
    return (entry.get("workload") or {}).get("median_s")


def _cost(entry: dict, key: str = "time_s") -> float:
    return float(((entry.get("transform") or {}).get(key)) or 0.0)


def figure(entry: dict, expected_runs: float | None) -> float | None:
    w = workload_s(entry)
    if w is None:
        return None
    return w if expected_runs is None else _cost(entry) + expected_runs * w


def _largest(entry: dict) -> float:
    return float(entry.get("max_file_bytes") or 0)


def _ci(entry: dict) -> list[float] | None:
    return (entry.get("workload") or {}).get("ci95")


def _n(entry: dict) -> int:
    return len((entry.get("workload") or {}).get("runs_s") or ())


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
    return bool(a and b) and a[0] <= b[1] and b[0] <= a[1]


def _simplicity(entry: dict) -> tuple:
    spec = entry.get("spec") or {}
    return (int(spec.get("copies") or 1), 1 if spec.get("sort") else 0, _cost(entry),
            int((entry.get("transform") or {}).get("bytes_written") or 0))


def _pct(new: float, old: float) -> str:
    return f"{100.0 * (new - old) / old:+.0f} %" if old else "n/a"


def annotate(layouts: list[dict], baseline: str) -> None:
    """Fill each entry's break-even (time and CPU) against the baseline, in place."""
    base = next((e for e in layouts if e["name"] == baseline), None)
    bw = workload_s(base) if base else None
    bc = ((base or {}).get("workload") or {}).get("cpu_s")
    for e in layouts:
        if e["name"] == baseline:
            e["break_even_runs"] = e["break_even_cpu_runs"] = None
            continue
        e["break_even_runs"] = break_even(bw, workload_s(e), _cost(e))
        e["break_even_cpu_runs"] = break_even(bc, (e.get("workload") or {}).get("cpu_s"), _cost(e, "cpu_s"))


def recommend(layouts: list[dict], *, baseline: str, expected_runs: float | None = None, max_file_bytes: float = 200e6,
              same: float = SAME) -> Recommendation:
    """The layout to use, with its reasons (see the module doc); layouts without measurements are skipped."""
    measured = [e for e in layouts if figure(e, expected_runs) is not None]
    if not measured:
        return Recommendation(baseline, ["nothing was measured: keep the data as it is"])
    reasons: list[str] = []
    fits = [e for e in measured if e["name"] == baseline or _largest(e) <= max_file_bytes]
    over = [e for e in measured if e not in fits]
    if over and any(e["name"] != baseline for e in fits):
        reasons.append(f"left out: {', '.join(e['name'] for e in over)} (files over {max_file_bytes / 1e6:.0f} MB)")
        pool = fits
    else:
        pool = measured
    ranked = sorted(pool, key=lambda e: (figure(e, expected_runs), _simplicity(e)))
    best = ranked[0]
    bf = figure(best, expected_runs)
    near = [e for e in ranked if figure(e, expected_runs) <= bf * (1 + same)
            or (expected_runs is None and min(_n(e), _n(best)) >= 3 and _overlap(_ci(e), _ci(best)))]
    pick = min(near, key=_simplicity)
    what = (f"over {expected_runs:g} runs (making it once, then {expected_runs:g} workloads)" if expected_runs is not None
            else "per workload run")
    if pick is best:
        reasons.append(f"{pick['name']} has the lowest time {what}: {figure(pick, expected_runs):.3f} s")
    else:
        reasons.append(f"{pick['name']} is as fast as the fastest, {best['name']} ({figure(pick, expected_runs):.3f} s "
                       f"vs {bf:.3f} s {what}: within {same * 100:.0f} % or within the noise of the runs), and simpler "
                       f"to make and keep: {_simpler(pick, best)}")
    if pick in over:
        k = math.ceil(_largest(pick) / max_file_bytes)
        reasons.append(f"its largest file is {_largest(pick) / 1e6:.0f} MB, over the {max_file_bytes / 1e6:.0f} MB bound, "
                       f"and no layout within the bound was measured: at least {k} files per table would keep "
                       f"each file under it (measure it with --layouts parquet-{k})")
    base = next((e for e in measured if e["name"] == baseline), None)
    if base is not None and pick is not base:
        bw, pw = workload_s(base), workload_s(pick)
        bb, pb = (base.get("workload") or {}).get("bytes_read"), (pick.get("workload") or {}).get("bytes_read")
        bc, pc = (base.get("workload") or {}).get("cpu_s"), (pick.get("workload") or {}).get("cpu_s")
        parts = [f"workload time {_pct(pw, bw)}"]
        if bb is not None and pb is not None:
            parts.append(f"bytes read {_pct(pb, bb)}")
        if bc is not None and pc is not None:
            parts.append(f"CPU-seconds {_pct(pc, bc)}")
        reasons.append(f"against {baseline} as it is: " + ", ".join(parts))
        be = break_even(bw, pw, _cost(pick))
        reasons.append(f"making it took {_cost(pick):.2f} s ({_cost(pick, 'cpu_s'):.2f} CPU-s): "
                       + (f"it pays for itself after {be:.1f} workload run(s)" if be is not None
                          else "it never pays for itself in time (it is not faster)"))
    elif base is not None:
        reasons.append(f"no transformation pays for itself {what}: keep the data as it is")
    reasons += _sorting_notes(measured)
    return Recommendation(pick["name"], reasons, [e["name"] for e in sorted(
        measured, key=lambda e: (figure(e, expected_runs), _simplicity(e)))])


def _simpler(pick: dict, best: dict) -> str:
    """What makes pick simpler than best, by the order of _simplicity."""
    a, b = _simplicity(pick), _simplicity(best)
    if a[0] < b[0]:
        return f"{a[0]} cop{'y' if a[0] == 1 else 'ies'} of the data instead of {b[0]}"
    if a[1] < b[1]:
        return "no sort"
    if a[2] < b[2]:
        return f"{a[2]:.2f} s to make instead of {b[2]:.2f} s"
    return f"{a[3] / 1e6:.2f} MB written instead of {b[3] / 1e6:.2f} MB"


def _sorting_notes(layouts: list[dict]) -> list[str]:
    """What sorting did: the queries it sped up most, and the whole workload (the thesis's point:
    large gains on a few queries, little on the whole, unless a second copy keeps the others fast)."""
    out = []
    by = {e["name"]: e for e in layouts}
    for e in layouts:
        spec = e.get("spec") or {}
        if not spec.get("sort") or spec.get("copies", 1) != 1:
            continue
        base = by.get(e["name"].split("-sorted-")[0])
        if base is None:
            continue
        gains = []
        for q, v in (e.get("queries") or {}).items():
            b = ((base.get("queries") or {}).get(q) or {}).get("median_s")
            if b and v.get("median_s") is not None:
                gains.append((v["median_s"] / b - 1, q))
        if not gains:
            continue
        gains.sort()
        top = ", ".join(f"{q} {g * 100:+.0f} %" for g, q in gains[:3])
        out.append(f"sorting on {spec['sort']} ({e['name']} vs {base['name']}): {top}; whole workload "
                   f"{_pct(workload_s(e), workload_s(base))}")
    return out
