"""The tuner's search: an exhaustive grid over the knobs, repeated, interleaved.

Search strategy: a full grid (allocators x memory policies x placements x OS switch states). The
space of paper 003 is small (5 x 5 x 3 x 6) and its effects interact (tbbmalloc helps most with
interleave), so a greedy one-knob-at-a-time search can miss the winner; the grid is exhaustive and
its cost is chosen by the user through the lists. Runs are interleaved (repeat r runs every case
once before repeat r+1) so a drift of the machine spreads over all cases instead of biasing one.
OS switch states are the outer loop: each state is applied once (journaled), all its cases run,
then it is restored.

The default configuration (system allocator, first-touch, no placement, OS untouched) is always in
the grid: the speedup is reported against it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from tilewise import allocators
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import model
from tilewise.results import stats as S
from tilewise.tune.knobs import Config

UNSTABLE_SPREAD = 0.10  # (max - min) / median above this: warn


def build_grid(allocs: list[str], mems: list[tuple[str, tuple[int, ...]]], placements: list[str],
               thps: list[str] | None = None, autonumas: list[str] | None = None) -> list[Config]:
    """Every combination, default first, no duplicates, in a stable order."""
    grid = [Config()]
    for thp, an in itertools.product(thps or [None], autonumas or [None]):
        for a, (m, nodes), p in itertools.product(allocs, mems, placements):
            c = Config(a, m, nodes, p, thp, an)
            if c not in grid:
                grid.append(c)
    return grid


@dataclass
class Case:
    index: int
    config: Config
    times: list[float] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # raw per-run records
    failures: list[str] = field(default_factory=list)
    warmups: list[float] = field(default_factory=list)  # the unmeasured runs' times, kept

    @property
    def stats(self) -> dict:
        return S.summarize(self.times)

    @property
    def median(self) -> float | None:
        return self.stats["median"]

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the measured runs (0 with one run or a zero median)."""
        return (self.stats["rel_spread"] or 0.0) if self.times else None

    def summary(self) -> dict:
        s = self.stats
        return {"case": self.index, "label": self.config.label(), "config": self.config.to_json(),
                "runs": s["n"], "failures": self.failures, "median_s": s["median"], "min_s": s["min"],
                "max_s": s["max"], "spread": self.spread, "stdev_s": s["stdev"], "ci95_s": s["ci95"],
                "outliers": s["outliers"], "warmup_s": list(self.warmups)}


@dataclass
class Sweep:
    cases: list[Case]
    repeat: int
    warmup: int
    interrupted: bool = False

    @property
    def default(self) -> Case:
        return next(c for c in self.cases if c.config == Config())

    def best(self) -> Case | None:
        ok = [c for c in self.cases if c.times and not c.failures]
        return min(ok, key=lambda c: (c.median, c.index)) if ok else None

    def speedup(self) -> float | None:
        b, d = self.best(), self.default
        if b is None or not d.times or not b.median:
            return None
        return d.median / b.median

    def warnings(self) -> list[str]:
        out = []
        unstable = [c for c in self.cases if c.spread is not None and c.spread > UNSTABLE_SPREAD]
        if unstable:
            worst = max(unstable, key=lambda c: c.spread)
            out.append(f"{len(unstable)} configuration(s) vary by more than {UNSTABLE_SPREAD:.0%} between runs "
                       f"(worst {worst.config.label()}: {worst.spread:.0%}): use more --repeat and a quiet machine")
        failed = [c for c in self.cases if c.failures]
        for c in failed:
            out.append(f"{c.config.label()} failed: {c.failures[0]}")
        sums = {r.get("checksum") for c in self.cases for r in c.runs if r.get("checksum") is not None}
        if len(sums) > 1:
            out.append(f"the result checksums differ between configurations ({len(sums)} values): a configuration changed the answer")
        b = self.best()
        if b is not None and b.config != Config() and self.default.times and len(self.default.times) > 1:
            # does the winner beat the default by more than the noise?
            if max(b.times) >= min(self.default.times):
                out.append("the winner's runs overlap the default's: the difference may be noise")
        return out


Runner = Callable[[Config], tuple[float, dict]]


def run_sweep(grid: list[Config], runner: Runner, *, repeat: int = 3, warmup: int = 0,
              os_apply: Callable[[dict], object] | None = None,
              progress: Callable[[str], None] | None = None,
              after_run: Callable[[Sweep], None] | None = None) -> Sweep:
    """Run every config `repeat` times (interleaved); a failing run is recorded, not fatal.

    os_apply(desired) returns a context manager that applies OS switches for its block (and
    restores them); it is only called for configs that change OS switches.
    """
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if warmup < 0:
        raise UsageError("--warmup cannot be negative")
    cases = [Case(i, c) for i, c in enumerate(grid)]
    sw = Sweep(cases, repeat, warmup)
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(tuple(sorted(c.config.os_desired().items())), []).append(c)
    total = len(cases) * repeat
    done = 0
    try:
        for key, members in groups.items():
            desired = dict(key)
            if desired and os_apply is None:
                raise UsageError("the grid changes OS switches but --apply-os was not given")
            ctx = os_apply(desired) if desired else nullcontext()
            with ctx:
                for _ in range(warmup):
                    for c in members:
                        _one(c, runner, record=False)
                for r in range(repeat):
                    for c in members:
                        _one(c, runner, record=True, repeat_index=r)
                        done += 1
                        if progress:
                            last = f"{c.times[-1]:.3f} s" if c.runs and c.runs[-1].get("status") == "ok" else "failed"
                            progress(f"[{done}/{total}] {c.config.label()}: {last}")
                        if after_run:
                            after_run(sw)
    except BaseException:  # Ctrl-C, SIGTERM: keep what was measured, marked as interrupted
        sw.interrupted = True
        if after_run:
            try:
                after_run(sw)
            except Exception:  # noqa: BLE001 - the original exception matters more
                pass
        raise
    return sw


def _one(c: Case, runner: Runner, *, record: bool, repeat_index: int = 0) -> None:
    try:
        t, extra = runner(c.config)
    except TilewiseError as e:
        if record:
            c.failures.append(str(e))
            c.runs.append({"repeat": repeat_index, "status": "failed", "error": str(e)})
        return
    if not record:
        c.warmups.append(t)
    else:
        c.times.append(t)
        c.runs.append({"repeat": repeat_index, "status": "ok", "time_s": t, **extra})


# ---- outputs ---------------------------------------------------------------------------------------

def new_doc(topo, os_state: dict, *, target: dict, grid_spec: dict, repeat: int, warmup: int,
            system_check: dict | None = None) -> dict:
    """The results document of a sweep (results.model, kind "tune"), before any run."""
    doc = model.new("tune", topo=topo, system_check=system_check,
                    os_switches={k: v.to_json() for k, v in os_state.items()}, allocators=allocators.available(),
                    params={"target": target, "grid": grid_spec, "repeat": repeat, "warmup": warmup})
    doc.update({"search": "grid", "target": target, "grid": grid_spec, "repeat": repeat, "warmup": warmup})
    return doc


def results_doc(sw: Sweep, doc: dict) -> dict:
    """Fill the sweep's cases, default, best and warnings into its results document."""
    best = sw.best()
    doc.update({"cases": [dict(c.summary(), raw=c.runs) for c in sw.cases],
                "default": sw.default.summary(),
                "best": best.summary() if best else None,
                "speedup_over_default": sw.speedup(),
                "warnings": sw.warnings()})
    done = all(len(c.runs) == sw.repeat for c in sw.cases)
    model.finish(doc, complete=done and not sw.interrupted, interrupted=sw.interrupted)
    return doc


def load_results(path: str) -> dict:
    doc = model.load(path)
    if doc["kind"] != "tune":
        raise UsageError(f"{path} holds {doc['kind']} results, not a tuner's", "give the results.json of `tilewise tune`")
    return doc
