"""DuckDB's types as its servers send them: answers leave a server as Arrow (engines/serve.py), and
DuckDB exports HUGEINT/UHUGEINT (16 bytes, e.g. a sum of BIGINTs) losslessly as Arrow's opaque
extension type; the client turns them back into Python ints, so the values equal what DuckDB's
fetchall() returns (Decimal, date, str, int, float)."""

from __future__ import annotations


def column_values(col) -> list:
    """Python values of one Arrow column of a DuckDB answer (contract.ArrowRows' column_values)."""
    t = col.type
    if getattr(t, "extension_name", "") == "arrow.opaque":
        name = getattr(t, "type_name", "")
        if name in ("hugeint", "uhugeint"):
            signed = name == "hugeint"
            return [None if b is None else int.from_bytes(b, "little", signed=signed)
                    for chunk in col.chunks for b in chunk.storage.to_pylist()]
    return col.to_pylist()
