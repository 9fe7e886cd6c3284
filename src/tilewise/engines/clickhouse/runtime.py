"""The ClickHouse runtime: engines.replicas with the chdb server module and its refresh functions."""

from __future__ import annotations

from tilewise.data import refresh
from tilewise.engines.clickhouse import SPEC
from tilewise.engines.clickhouse.server import parquet_source
from tilewise.engines.replicas import ReplicaServers


class ClickHouseServers(ReplicaServers):
    spec = SPEC
    server_module = "tilewise.engines.clickhouse.server"
    workdir = True  # chdb's database directory (metadata, spill files) lives in the deployment's own

    def refresh_statements(self, function: str, rset) -> list[str]:
        return refresh.statements(function, rset, self.dataset, source=parquet_source)
