"""ClickHouse's rewrites of benchmark queries (its dialect hook, SPEC.dialect): literal edits, each of
which must match exactly as often as it says (engines/dialects.py). Every other query runs as the
benchmark wrote it. Settings come first (server.py); a rule is here only where no setting makes
ClickHouse answer the benchmark's text right, and each says why: ClickHouse's error or wrong answer
without it, against the DataFusion reference (tilewise's validator; chdb 4.4, ClickHouse 26.9).
"""

from __future__ import annotations

from tilewise.engines.dialects import Rewrites

dialect = Rewrites("clickhouse", __name__, {})
