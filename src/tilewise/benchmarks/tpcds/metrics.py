"""TPC-DS's figures from what tilewise measures: the power test and one throughput test of the
queries, and what they lack against the specification's metric.

The specification's primary metric, QphDS@SF, is SF x Q / (T_PT x T_TT x T_DM x T_LD)^(1/4): it needs
the load test's time (T_LD), two throughput tests (T_TT = T_TT1 + T_TT2) and two runs of the data
maintenance functions between them (T_DM). tilewise runs the power test (stream 0) and one
throughput test (streams 1..S, the first throughput test's), and no data maintenance (docs/tpcds.md,
"Metrics"), so it never computes QphDS. What it reports is named for what it is:

- power test, queries per hour: 3600 x the statements run / the sum of their times in the power test;
- throughput test, queries per hour: 3600 x S x the statements run per stream / the throughput
  test's interval (first stream started to last stream done).
"""

from __future__ import annotations

from tilewise.benchmarks.spec import Measured, Metrics

# The specification's minimum number of query streams in a throughput test (Sq). TPC-DS 2.0 and later
# (4.0 here) ask for at least 4 at every scale factor (1.x had a table growing with the SF).
MIN_STREAMS = 4


def power_qph(query_s: list[float] | None) -> float | None:
    xs = [x for x in (query_s or []) if x is not None]
    total = sum(xs)
    return 3600.0 * len(xs) / total if xs and total > 0 else None


def throughput_qph(streams: int, queries_per_stream: int, interval_s: float | None) -> float | None:
    if not interval_s or interval_s <= 0 or queries_per_stream <= 0:
        return None
    return 3600.0 * streams * queries_per_stream / interval_s


class _Metrics(Metrics):
    names = (("power_qph", "power test queries/h"), ("throughput_qph", "throughput test queries/h"))

    def min_streams(self, sf: float) -> int:
        return MIN_STREAMS

    def figures(self, m: Measured) -> dict[str, float | None]:
        return {"power_qph": power_qph(m.power_s) if m.power_s is not None else None,
                "throughput_qph": throughput_qph(m.streams, m.queries, m.interval_s)}

    def notes(self, *, queries: int, total_queries: int, refresh_reason: str | None) -> list[str]:
        out = ["not QphDS@SF: the specification's metric also needs the load test's time, a second throughput "
               "test and the data maintenance functions, which this run did not measure; the figures are the power "
               "and throughput tests' queries per hour"]
        if queries < total_queries:
            out.append(f"{queries} of the {total_queries} TPC-DS statements: the figures are over these only")
        return out


METRICS = _Metrics()
