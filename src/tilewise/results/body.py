"""Typed views of results documents: one dataclass per JSON object, read from JSON and written back
without loss.

A result kind declares what its documents hold as dataclasses deriving from ``Record``::

    @dataclass
    class Query(Record):
        times_s: list[float] = field(default_factory=list)
        median_s: float | None = None

    q = Query.from_json({"times_s": [1.0], "median_s": 1.0, "rows": 4})
    q.median_s, q.extra            # 1.0, {"rows": 4}
    q.to_json()                    # {"times_s": [1.0], "median_s": 1.0, "rows": 4}

Fields are converted by their annotations: a ``Record`` from an object, ``list[T]``, ``dict[str, T]``
and ``T | None`` recursively; anything else is taken as it is. Every field has a default, so a
document an older tilewise wrote (with fewer keys) reads; keys a kind does not declare are kept in
``extra``, and a declared key the source did not have is not written back, so
``from_json(d).to_json() == d`` for every document (the tests check it on the checked-in files).
A value of the wrong shape (a list where an object belongs) is a one-line error naming its place.

Why not a library: pydantic and cattrs validate or drop unknown keys; a results file must keep
what a newer tilewise added, and these views must never rewrite what a harness wrote.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Self, get_args, get_origin, get_type_hints

from tilewise.errors import UsageError

_OWN = ("extra", "absent")


@dataclasses.dataclass
class Record:
    extra: dict = dataclasses.field(default_factory=dict, kw_only=True, repr=False, compare=False)
    absent: frozenset = dataclasses.field(default=frozenset(), kw_only=True, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict | None, where: str = "document") -> Self:
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise UsageError(f"{where} is not a JSON object (found {type(d).__name__})",
                             "is the file a tilewise results document?")
        kw, absent = {}, set()
        for name, hint in _fields(cls):
            if name in d:
                kw[name] = _read(hint, d[name], f"{where}.{name}")
            else:
                absent.add(name)
        known = {n for n, _ in _fields(cls)}
        return cls(**kw, extra={k: v for k, v in d.items() if k not in known}, absent=frozenset(absent))

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if f.name in _OWN:
                continue
            v = getattr(self, f.name)
            if f.name in self.absent and v == _default(f):
                continue  # not in the source and not set since: stays out
            out[f.name] = _write(v)
        out.update(self.extra)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A key the kind does not declare (kept in extra), as dict.get."""
        return self.extra.get(key, default)


@cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.name not in _OWN)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _read(hint: Any, v: Any, where: str) -> Any:
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if v is None:
            return None
        inner = [a for a in get_args(hint) if a is not type(None)]
        return _read(inner[0], v, where) if len(inner) == 1 else v
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_json(v, where)
    if origin is list:
        if not isinstance(v, list):
            raise UsageError(f"{where} is not a list (found {type(v).__name__})")
        (arg,) = get_args(hint) or (Any,)
        return [_read(arg, x, f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise UsageError(f"{where} is not a JSON object (found {type(v).__name__})")
        args = get_args(hint)
        arg = args[1] if len(args) == 2 else Any
        return {k: _read(arg, x, f"{where}.{k}") for k, x in v.items()}
    return v


def _write(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, list):
        return [_write(x) for x in v]
    if isinstance(v, dict):
        return {k: _write(x) for k, x in v.items()}
    return v
