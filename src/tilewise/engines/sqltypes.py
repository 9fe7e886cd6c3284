"""Parquet (Arrow) column types -> the SQL type each engine declares for them (Spark DDL, Trino DDL)."""

from __future__ import annotations

# arrow type name -> (trino, spark)
_PLAIN = {
    "int64": ("bigint", "BIGINT"), "int32": ("integer", "INT"), "int16": ("smallint", "SMALLINT"),
    "int8": ("tinyint", "TINYINT"), "double": ("double", "DOUBLE"), "float": ("real", "FLOAT"),
    "bool": ("boolean", "BOOLEAN"), "date32[day]": ("date", "DATE"), "string": ("varchar", "STRING"),
    "large_string": ("varchar", "STRING"), "string_view": ("varchar", "STRING"),
}
DIALECTS = ("trino", "spark")


def sql_type(t, dialect: str) -> str | None:
    """The dialect's type for Arrow type t; None when there is no plain mapping."""
    import pyarrow as pa

    col = DIALECTS.index(dialect)
    if pa.types.is_decimal(t):
        return f"{('decimal', 'DECIMAL')[col]}({t.precision},{t.scale})"
    pair = _PLAIN.get(str(t))
    return pair[col] if pair else None


def parquet_schema(path, dialect: str) -> list[tuple[str, str | None]]:
    """(column, type or None) for the Parquet file at path."""
    import pyarrow.parquet as pq

    return [(f.name, sql_type(f.type, dialect)) for f in pq.read_schema(path)]
