"""PostgreSQL: one bound PostgreSQL server per plan instance (Debian's postgresql package), each
holding its own copy of the data set (replicas: a query runs on one instance, routed to the least
busy one, as DuckDB's are).

The runtime (runtime.PostgresServers) serves `bench tpch`/`bench tpcds`/`bench elastic` and
`up/status/query/down`; the data set is loaded with COPY once per data set and cached (load.py);
each server's settings come from its instance (settings.py); the binaries and the user the servers
run as come from home.py. PostgreSQL writes its tables, so the refresh functions run on every
replica. Its memory knob sizes shared_buffers and work_mem. Where PostgreSQL's SQL differs from a
benchmark's text, dialect.py rewrites it (documented per query). docs/postgres.md has the whole story.
"""

from __future__ import annotations

from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines.memory import MemoryKnob
from tilewise.engines.postgres import env, home
from tilewise.engines.postgres.dialect import dialect
from tilewise.engines.postgres.settings import MEMORY_FRACTION, MEMORY_MIN_MB


def missing() -> str | None:
    return home.missing()


def version() -> str:
    return f"postgresql {home.server_version()}"


SPEC = EngineSpec(
    name="postgres",
    title="PostgreSQL",
    summary="one PostgreSQL server per instance, each with its own copy of the data (replicas)",
    runtime="tilewise.engines.postgres.runtime:PostgresServers",
    capabilities=Capabilities(
        replicas=True, refresh=True, join=False,
        memory=MemoryKnob("PostgreSQL's memory (shared_buffers a quarter, work_mem from the rest)",
                          minimum_mb=MEMORY_MIN_MB, fraction=MEMORY_FRACTION, cap_mb=1 << 30)),
    missing=missing,
    version=version,
    part=home.PART,
    install=home.install_step,
    install_help=home.PART.size,
    dialect=dialect,  # dialect.py: its rewrites of benchmark queries
    endpoint_label="files in",
    env=env.ALL,
)
