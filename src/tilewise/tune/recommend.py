"""Which configuration to recommend after a sweep of a running engine, and why: pure rules over the
measured per-query latencies (tested without any engine).

Paper 003 reports its TPC-H results on two servers as per-query latency changes against the
default (Fig. 8): MonetDB gained 2-43 % (14.5 % on average) from turning AutoNUMA and THP off, while
PostgreSQL gained 3 % on average with five queries slower. A tool has to tell these apart, so the
rules are:

1. A configuration with a failed run, or an answer that differs from the reference, is rejected.
2. Without an interval (fewer than two measured runs per query) nothing can be told from noise:
   rejected, "measure with --repeat 2 or more".
3. On a machine with one NUMA node, a configuration that differs from the default only in its
   memory policy or AutoNUMA is rejected: it places every page exactly as the default does, so a
   difference is noise (paper 003's memory and AutoNUMA effects need several nodes).
4. Its mean latency change over the queries (geometric mean of the per-query ratios, with a 95 %
   interval from the measurement noise: results.stats.mean_ratio_ci) must be a gain whose whole
   interval lies below 1 and whose size is at least ``min_gain`` (default 2 %): else "no
   significant gain".
5. No query may be significantly slower by more than ``max_slowdown`` (default 5 %: the lower end
   of its interval above 1.05); a query slower within that is said, not disqualifying.
6. Of the configurations that qualify, the largest mean gain wins; one whose gain interval
   overlaps the winner's and that changes fewer knobs (a restart, root for an OS switch) is
   preferred, and the reason says so. When none qualifies, the default stays, with each
   candidate's reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tilewise.results import stats as S
from tilewise.tune.knobs import Config

MIN_GAIN = 0.02
MAX_SLOWDOWN = 0.05


@dataclass(frozen=True)
class Candidate:
    """One configuration's measurements: per query, the measured latencies (seconds)."""

    label: str
    config: Config
    times: Mapping[str, Sequence[float]]
    failed: str | None = None  # why a run failed or an answer was wrong (the first one)


@dataclass(frozen=True)
class Facts:
    numa_nodes: int = 1
    min_gain: float = MIN_GAIN
    max_slowdown: float = MAX_SLOWDOWN
    cautions: tuple[str, ...] = ()  # what made the timings unstable (the system check): said with the advice


@dataclass
class Verdict:
    label: str
    verdict: str  # recommended | qualifies | rejected
    reason: str
    gain: float | None = None  # 1 - mean ratio (0.12: 12 % less latency)
    knobs: int = 0  # how many knobs differ from the default

    def to_json(self) -> dict:
        return {"label": self.label, "verdict": self.verdict, "reason": self.reason, "gain": self.gain,
                "knobs": self.knobs}


@dataclass
class Recommendation:
    label: str  # the configuration recommended (the default's label when nothing beats it)
    config: Config
    changed: bool  # False: keep the default
    reasons: list[str]
    verdicts: list[Verdict]

    def to_json(self) -> dict:
        return {"label": self.label, "config": self.config.to_json(), "changed": self.changed,
                "reasons": self.reasons, "verdicts": [v.to_json() for v in self.verdicts]}


def pct(ratio: float) -> str:
    """A latency ratio as a change: 0.88 -> '-12.0 %' (faster), 1.05 -> '+5.0 %'."""
    return f"{(ratio - 1) * 100:+.1f} %"


def interval(ci: Sequence[float] | None) -> str:
    return f"[{(ci[0] - 1) * 100:+.1f}, {(ci[1] - 1) * 100:+.1f}] %" if ci else "[no interval]"


def knobs_changed(c: Config) -> list[str]:
    """What differs from the default, and what it takes: a restart (allocator, memory policy,
    placement) or root (THP, AutoNUMA)."""
    out = []
    if c.allocator != "system":
        out.append(f"allocator {c.allocator} (LD_PRELOAD, a restart)")
    if c.mem != "first-touch":
        out.append(f"memory policy {c.mem_label()} (a restart)")
    if c.placement != "none":
        out.append(f"placement {c.placement} (a restart)")
    if c.thp is not None:
        out.append(f"THP {c.thp} (root, no restart)")
    if c.autonuma is not None:
        out.append(f"AutoNUMA {'on' if c.autonuma == '1' else 'off'} (root, no restart)")
    return out


def recommend(default: Candidate, candidates: Sequence[Candidate], facts: Facts = Facts()) -> Recommendation:
    """The rules of the module docstring, applied to every candidate against the default."""
    verdicts: list[Verdict] = []
    qualified: list[tuple[Verdict, dict]] = []
    notes: list[str] = [f"caution: {w}" for w in facts.cautions]
    if facts.numa_nodes < 2:
        notes.append("one NUMA node: memory policies and AutoNUMA place pages as the default does here; "
                     "their effects need a machine with several nodes")
    for c in candidates:
        k = len(knobs_changed(c.config))
        if c.failed:
            verdicts.append(Verdict(c.label, "rejected", f"failed: {c.failed}", knobs=k))
            continue
        if default.failed:
            verdicts.append(Verdict(c.label, "rejected", f"the default failed ({default.failed}): nothing to compare with",
                                    knobs=k))
            continue
        if facts.numa_nodes < 2 and _numa_only(c.config):
            verdicts.append(Verdict(c.label, "rejected", "it differs from the default only in memory policy or AutoNUMA, "
                                    "which place every page as the default does on one NUMA node: a difference is noise",
                                    knobs=k))
            continue
        ch = S.compare_set(dict(default.times), dict(c.times))
        m = ch["mean"]
        if m is None or m["ci95"] is None:
            verdicts.append(Verdict(c.label, "rejected", "no confidence interval (one run per query): measure with "
                                    "--repeat 2 or more", None if m is None else 1 - m["ratio"], k))
            continue
        gain = 1 - m["ratio"]
        summary = f"mean latency {pct(m['ratio'])} {interval(m['ci95'])} over {m['n']} queries"
        too_slow = [q for q in ch["slower"] if ch["per_query"][q]["ci95"][0] > 1 + facts.max_slowdown]
        if too_slow:
            worst = max(too_slow, key=lambda q: ch["per_query"][q]["ratio"])
            r = ch["per_query"][worst]
            verdicts.append(Verdict(c.label, "rejected", f"{summary}, but {len(too_slow)} query(ies) more than "
                                    f"{facts.max_slowdown:.0%} slower (worst {worst}: {pct(r['ratio'])} {interval(r['ci95'])})",
                                    gain, k))
            continue
        if m["ci95"][1] >= 1 or gain < facts.min_gain:
            why = ("slower on average" if m["ci95"][0] > 1 else "the interval includes no change" if m["ci95"][1] >= 1
                   else f"below the {facts.min_gain:.0%} worth a change")
            verdicts.append(Verdict(c.label, "rejected", f"no significant gain: {summary} ({why})", gain, k))
            continue
        extra = f"; {len(ch['faster'])} faster, {len(ch['slower'])} slower (95 % CI)" if ch['faster'] or ch['slower'] else ""
        if ch["slower"]:
            extra += f", slower within {facts.max_slowdown:.0%}: {', '.join(ch['slower'])}"
        v = Verdict(c.label, "qualifies", summary + extra, gain, k)
        verdicts.append(v)
        qualified.append((v, ch))
    if not qualified:
        reasons = ["keep the default: no configuration is significantly faster without a query much slower", *notes]
        best = max((v for v in verdicts if v.gain is not None), key=lambda v: v.gain, default=None)
        if best is not None:
            reasons.append(f"closest: {best.label}: {best.reason}")
        return Recommendation(default.label, default.config, False, reasons, verdicts)
    top_v, top_ch = max(qualified, key=lambda vc: (vc[0].gain, -vc[0].knobs))
    chosen_v, chosen_ch = top_v, top_ch
    simpler = [(v, ch) for v, ch in qualified if v.knobs < top_v.knobs and _overlap(ch["mean"]["ci95"], top_ch["mean"]["ci95"])]
    reasons = []
    if simpler:
        chosen_v, chosen_ch = max(simpler, key=lambda vc: (-vc[0].knobs, vc[0].gain))
        reasons.append(f"{top_v.label} gains more on average ({pct(top_ch['mean']['ratio'])}) but within the noise of "
                       f"{chosen_v.label}, which changes fewer knobs")
    chosen_v.verdict = "recommended"
    cfg = next(c.config for c in candidates if c.label == chosen_v.label)
    reasons.insert(0, f"{chosen_v.label}: {chosen_v.reason}")
    needs = knobs_changed(cfg)
    reasons.append("it changes: " + "; ".join(needs))
    others = [v.label for v, _ in qualified if v is not chosen_v]
    if others:
        reasons.append(f"also significantly faster: {', '.join(others)}")
    return Recommendation(chosen_v.label, cfg, True, reasons + notes, verdicts)


def _numa_only(c: Config) -> bool:
    """Differs from the default only in the memory policy and/or AutoNUMA."""
    return ((c.mem != "first-touch" or c.autonuma is not None) and c.allocator == "system"
            and c.placement == "none" and c.thp is None)


def _overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]
