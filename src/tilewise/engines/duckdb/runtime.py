"""The DuckDB runtime: engines.replicas with DuckDB's server module and its refresh functions."""

from __future__ import annotations

from tilewise.data import refresh
from tilewise.engines.duckdb import SPEC, types
from tilewise.engines.replicas import ReplicaServers


class DuckDBServers(ReplicaServers):
    spec = SPEC
    server_module = "tilewise.engines.duckdb.server"
    workdir = True  # DuckDB's spill files (temp_directory) live in the deployment's own directory, not in ./.tmp
    column_values = staticmethod(types.column_values)  # HUGEINT back to int

    def refresh_statements(self, function: str, rset) -> list[str]:
        return refresh.statements(function, rset, self.dataset)
