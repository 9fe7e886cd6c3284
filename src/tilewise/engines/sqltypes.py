"""Parquet (Arrow) column types -> the SQL type an engine declares for them. Each engine passes its
own names (engines/spark, engines/trino); the mapping logic is here once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TypeNames:
    """An engine's SQL type names for the plain Arrow types, and its decimal type's name."""

    plain: dict[str, str]  # arrow type name ("int64", "date32[day]", "string_view", ...) -> SQL type
    decimal: str  # "decimal" -> decimal(15,2)


def sql_type(t, names: TypeNames) -> str | None:
    """The engine's type for Arrow type t; None when there is no plain mapping."""
    import pyarrow as pa

    if pa.types.is_decimal(t):
        return f"{names.decimal}({t.precision},{t.scale})"
    return names.plain.get(str(t))


def parquet_schema(path, names: TypeNames) -> list[tuple[str, str | None]]:
    """(column, type or None) for the Parquet file at path."""
    import pyarrow.parquet as pq

    return [(f.name, sql_type(f.type, names)) for f in pq.read_schema(path)]
