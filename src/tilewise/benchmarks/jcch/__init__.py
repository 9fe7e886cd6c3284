"""JCC-H: TPC-H with join-crossing correlations and skew (docs/jcch.md), as a benchmark package
(tilewise.benchmarks.spec's contract, exported as SPEC).

- data.py: the generator (TPC-H tables rewritten by the rules of rules.py), check.py: the
  specification's invariants and statistical targets;
- queries.py: qgen's "skewed" and "normal" parameters of the 22 TPC-H templates, drawn per stream;
- refresh.py: TPC-H's refresh functions with JCC-H's rule for a new line's part and supplier.

Everything else is TPC-H's (tilewise.benchmarks.tpch): the query texts and stream orders, the
reference-answer rules and the metrics.
"""

from __future__ import annotations

from tilewise.benchmarks import tpch
from tilewise.benchmarks.jcch import data, queries, refresh
from tilewise.benchmarks.spec import Benchmark

SPEC = Benchmark(
    name="jcch", title=data.TITLE, about="JCC-H, TPC-H with skewed data and join-crossing correlations",
    data=data.DATA, catalog=tpch.queries.CATALOG, metrics=tpch.metrics.METRICS, params=queries.PARAMS,
    refresh=refresh.REFRESH, reference_sql=tpch.reference.reference_sql, docs="docs/jcch.md",
)
