"""Statistics of repeated measurements, as pyperf and hyperfine report them: the one place tilewise
computes them (the harnesses, the elastic daemon, the probes and the tuner call these; the
reporting module and the result kinds only show what they give).

``summarize(values)`` gives n, min/median/max, mean, the sample standard deviation (None with
fewer than two values: one run has no spread), a 95 % confidence interval of the mean (Student's
t; None with fewer than two values; cut at 0 for non-negative quantities) and the outliers (modified z-score of Iglewicz and Hoaglin,
|z| > 3.5, from the median absolute deviation; none are flagged with fewer than four values);
``summarize(values, percentiles=(95, 99))`` adds "p95" and "p99" (``percentile``).
``ratio_ci(a, b)`` is the 95 % interval of the ratio of the geometric means of two samples
(Welch's t on the logarithms), for before/after comparisons; ``mean_ratio_ci`` the mean of such
ratios over the queries of a workload (the tuner's "average latency change").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95
OUTLIER_Z = 3.5
MIN_FOR_OUTLIERS = 4

# two-sided 95 % quantiles of Student's t, t(0.975, df) for df = 1..30, then sparse to infinity
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_T975_TAIL = ((40, 2.021), (60, 2.000), (120, 1.980))
_Z975 = 1.960


def t975(df: float) -> float:
    """t(0.975, df); a fractional df (Welch) is rounded down, which widens the interval (conservative)."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    d = int(math.floor(df))
    if d <= len(_T975):
        return _T975[d - 1]
    prev_t = _T975[-1]
    for k, t in _T975_TAIL:
        if d < k:
            return prev_t  # the value at the next lower tabulated df: never narrower than the truth
        prev_t = t
    return _Z975 if d > 1000 else prev_t


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean_ci(values: Sequence[float]) -> tuple[float, float] | None:
    xs = _finite(values)
    if len(xs) < 2:
        return None
    m = statistics.fmean(xs)
    half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return (m - half, m + half)


def outliers(values: Sequence[float]) -> list[int]:
    """Indexes of outliers: |0.6745 (x - median) / MAD| > 3.5. With MAD 0, the mean absolute
    deviation stands in (scaled by 1.2533); when that is 0 too, nothing is an outlier."""
    xs = _finite(values)
    if len(xs) < MIN_FOR_OUTLIERS or len(xs) != len(values):
        return []
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    if mad > 0:
        scores = [0.6745 * (x - med) / mad for x in xs]
    else:
        meanad = statistics.fmean(abs(x - med) for x in xs)
        if meanad == 0:
            return []
        scores = [(x - med) / (1.253314 * meanad) for x in xs]
    return [i for i, z in enumerate(scores) if abs(z) > OUTLIER_Z]


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0 <= p <= 100) by rank: the sorted values' element at index
    floor(p / 100 x n), the last one past the end. So p50 is the upper median, and p99 of fewer
    than 100 values is the largest (a tail figure never hides the worst tick). None without values."""
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is between 0 and 100, not {p}")
    xs = sorted(_finite(values))
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summarize(values: Sequence[float], *, percentiles: Sequence[float] = ()) -> dict:
    """n, min, median, max, mean, stdev, ci95 [low, high], rel_spread, outliers (indexes), and
    "p<P>" for each of `percentiles` (e.g. percentiles=(99,) adds "p99")."""
    xs = _finite(values)
    pct = {f"p{p:g}": percentile(xs, p) for p in percentiles}
    if not xs:
        return {"n": 0, "min": None, "median": None, "max": None, "mean": None, "stdev": None, "ci95": None,
                "rel_spread": None, "outliers": [], **pct}
    med = statistics.median(xs)
    ci = mean_ci(xs)
    if ci and min(xs) >= 0:
        ci = (max(0.0, ci[0]), ci[1])  # times, rates, sizes: an interval below zero means nothing
    return {
        "n": len(xs),
        "min": min(xs),
        "median": med,
        "max": max(xs),
        "mean": statistics.fmean(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else None,
        "ci95": list(ci) if ci else None,
        "rel_spread": ((max(xs) - min(xs)) / med if med else None) if len(xs) > 1 else None,
        "outliers": outliers(xs),
        **pct,
    }


def query_stats(times: Sequence[float]) -> dict:
    """The statistics a harness stores beside a query's raw times, with the unit in the key
    (median_s, ci95_s, ...; stdev_s None with one run)."""
    s = summarize(times)
    return {"n": s["n"], "median_s": s["median"], "min_s": s["min"], "max_s": s["max"], "mean_s": s["mean"],
            "stdev_s": s["stdev"], "ci95_s": s["ci95"], "rel_spread": s["rel_spread"], "outliers": s["outliers"]}


def rounded(s: dict, keys: Sequence[str], digits: int = 4) -> dict:
    """Some figures of a summary, rounded for a log or a table (None stays None)."""
    return {k: (None if s.get(k) is None else round(s[k], digits)) for k in keys}


def geomean(xs: Sequence[float | None]) -> float | None:
    ys = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not ys:
        return None
    return math.exp(sum(math.log(y) for y in ys) / len(ys))


def _log_diff(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean log b - mean log a, its variance, Welch's degrees of freedom); the variance and df are
    None-like (nan) unless both samples have two or more positive values; None without values."""
    la = [math.log(x) for x in _finite(a) if x > 0]
    lb = [math.log(x) for x in _finite(b) if x > 0]
    if not la or not lb:
        return None
    diff = statistics.fmean(lb) - statistics.fmean(la)
    if len(la) < 2 or len(lb) < 2:
        return diff, math.nan, math.nan
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    if va + vb == 0:
        return diff, 0.0, math.inf
    df = (va + vb) ** 2 / ((va * va) / (len(la) - 1) + (vb * vb) / (len(lb) - 1))
    return diff, va + vb, df


def _interval(diff: float, var: float, df: float) -> list[float] | None:
    if math.isnan(var):
        return None
    half = t975(max(1.0, df)) * math.sqrt(var) if var > 0 else 0.0
    return [math.exp(diff - half), math.exp(diff + half)]


def ratio_ci(a: Sequence[float], b: Sequence[float]) -> dict | None:
    """b relative to a: the ratio of geometric means gm(b)/gm(a) with a 95 % interval (Welch's t on
    log values). The interval is None unless both samples have two or more positive values."""
    d = _log_diff(a, b)
    if d is None:
        return None
    return {"ratio": math.exp(d[0]), "ci95": _interval(*d)}


def paired_diff_ci(xs: Sequence[float]) -> dict:
    """The mean of paired differences (or log ratios) and its 95 % t interval, never cut at 0."""
    ci = mean_ci(xs)
    return {"mean": summarize(xs)["mean"], "ci95": list(ci) if ci else None}


def paired_ratio_ci(a: Sequence[float], b: Sequence[float]) -> dict:
    """b relative to a where a[i] and b[i] were measured in the same round (one replication each, as
    the overhead benchmark's ABBA rounds): the geometric mean of the per-round ratios b[i]/a[i], with a
    95 % Student-t interval on their logarithms (df = n - 1). ratio_ci is the unpaired twin."""
    if len(a) != len(b) or not a:
        raise ValueError("need the same number (>= 1) of figures on both sides")
    logs = [math.log(y / x) for x, y in zip(a, b)]
    d = paired_diff_ci(logs)
    return {"n": len(logs), "ratios": [math.exp(x) for x in logs], "ratio": math.exp(d["mean"]),
            "ci95": [math.exp(x) for x in d["ci95"]] if d["ci95"] else None,
            "method": "geometric mean of per-round ratios; 95 % Student-t interval on their logarithms (df = n - 1)"}


def mean_ratio_ci(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict | None:
    """The mean change over several quantities measured before (a) and after (b) in rounds, e.g. the
    queries of a workload under two configurations, each list in round order (run r of every
    quantity belongs to round r): the geometric mean of the per-quantity ratios gm(b_i)/gm(a_i),
    with a 95 % interval over the rounds. A round is one replication: the runs of one round share
    what the machine was doing then (a burst of other work slows all of them), so the quantities
    of a round are not independent samples; each round's mean log time over the quantities is one
    observation, and the interval is Welch's t on those (n = the rounds of each sample). The
    quantities themselves are the workload, not a sample of queries: their differences from one
    another are not noise. The interval is None with fewer than two complete rounds on a side."""
    parts = [_log_diff(a, b) for a, b in pairs]
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    diff = sum(p[0] for p in parts) / len(parts)
    out = {"ratio": math.exp(diff), "ci95": None, "n": len(parts)}
    ra, rb = _round_means([a for a, _ in pairs]), _round_means([b for _, b in pairs])
    if len(ra) < 2 or len(rb) < 2:
        return out
    va, vb = statistics.variance(ra) / len(ra), statistics.variance(rb) / len(rb)
    if va + vb == 0:
        out["ci95"] = [out["ratio"], out["ratio"]]
        return out
    df = (va + vb) ** 2 / ((va * va) / (len(ra) - 1) + (vb * vb) / (len(rb) - 1))
    out["ci95"] = _interval(diff, va + vb, df)
    return out


def _round_means(samples: Sequence[Sequence[float]]) -> list[float]:
    """Per round (the r-th value of every sample), the mean log value over the samples; only rounds
    every sample has a positive value for."""
    logs = [[math.log(x) if x is not None and x > 0 and math.isfinite(x) else None for x in s] for s in samples]
    rounds = min((len(s) for s in logs), default=0)
    out = []
    for r in range(rounds):
        vals = [s[r] for s in logs]
        if all(v is not None for v in vals):
            out.append(statistics.fmean(vals))
    return out


def compare_set(before: dict[str, Sequence[float]], after: dict[str, Sequence[float]]) -> dict:
    """A set of quantities (the queries of a workload) after against before: per quantity the
    ratio_ci, their mean_ratio_ci, and which ones are significantly faster (interval below 1) or
    slower (above 1). Quantities are those of `before`."""
    per = {k: ratio_ci(v, after.get(k, ())) for k, v in before.items()}
    mean = mean_ratio_ci([(v, after.get(k, ())) for k, v in before.items()])
    faster = [k for k, r in per.items() if r and r["ci95"] and r["ci95"][1] < 1]
    slower = [k for k, r in per.items() if r and r["ci95"] and r["ci95"][0] > 1]
    return {"per_query": per, "mean": mean, "faster": faster, "slower": slower}
