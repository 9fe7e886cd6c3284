"""TPC-H's metrics (TPC-H 5.4): Power@Size, Throughput@Size and QphH@Size, the minimum number of
query streams per scale factor (5.3.4), and what the figures lack when a run measured less than the
specification asks (no refresh functions, a subset of the queries). JCC-H uses them too."""

from __future__ import annotations

import math

from tilewise.benchmarks.spec import Measured, Metrics

# TPC-H 5.3.4: the minimum number of query streams of the throughput test per scale factor
SPEC_MIN_STREAMS = ((100000, 11), (30000, 10), (10000, 9), (3000, 8), (1000, 7), (300, 6), (100, 5), (30, 4),
                    (10, 3), (1, 2))


def min_streams(sf: float) -> int:
    for size, n in SPEC_MIN_STREAMS:
        if sf >= size:
            return n
    return 2


def power_at_size(sf: float, query_s: list[float], refresh_s: list[float]) -> float | None:
    """TPC-H 5.4.1: 3600 x SF / the geometric mean of the power test's query and refresh timing
    intervals. Intervals shorter than the longest / 1000 count as the longest / 1000."""
    xs = [x for x in list(query_s) + list(refresh_s) if x is not None]
    if not xs or not all(x > 0 for x in xs):
        return None
    floor = max(xs) / 1000.0
    xs = [max(x, floor) for x in xs]
    return 3600.0 * sf / math.exp(sum(math.log(x) for x in xs) / len(xs))


def throughput_at_size(sf: float, streams: int, queries_per_stream: int, interval_s: float) -> float | None:
    """TPC-H 5.4.2: S x 22 x 3600 / Ts x SF (with the queries actually run per stream)."""
    if not interval_s or interval_s <= 0:
        return None
    return streams * queries_per_stream * 3600.0 / interval_s * sf


def qphh_at_size(power: float | None, throughput: float | None) -> float | None:
    if not power or not throughput:
        return None
    return math.sqrt(power * throughput)


class _Metrics(Metrics):
    names = (("power_at_size", "Power@Size"), ("throughput_at_size", "Throughput@Size"), ("qphh_at_size", "QphH@Size"))

    def min_streams(self, sf: float) -> int:
        return min_streams(sf)

    def figures(self, m: Measured) -> dict[str, float | None]:
        power = power_at_size(m.sf, m.power_s, m.power_refresh_s) if m.power_s is not None else None
        throughput = throughput_at_size(m.sf, m.streams, m.queries, m.interval_s) if m.interval_s is not None else None
        return {"power_at_size": power, "throughput_at_size": throughput, "qphh_at_size": qphh_at_size(power, throughput)}

    def notes(self, *, queries: int, total_queries: int, refresh_reason: str | None) -> list[str]:
        out = []
        if refresh_reason:
            out.append(f"without refresh functions ({refresh_reason}): Power@Size has no RF1/RF2 intervals and the "
                       "throughput test has no refresh stream; the figures are not comparable with "
                       "published TPC-H results")
        if queries < total_queries:
            out.append(f"{queries} of the {total_queries} queries: the TPC-H metrics are computed over these only "
                       "and are not comparable with full runs")
        return out


METRICS = _Metrics()
