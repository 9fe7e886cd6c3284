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
and ``T | None`` recursively; a number, text or true/false field is checked to hold one (or null);
anything else is taken as it is. Every field has a default, so a
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
from collections.abc import Callable
from functools import cache
from typing import Any, Self, get_args, get_origin, get_type_hints

from tilewise.errors import UsageError

_OWN = ("extra", "absent")
_NONE: frozenset = frozenset()


@dataclasses.dataclass
class Record:
    extra: dict = dataclasses.field(default_factory=dict, kw_only=True, repr=False, compare=False)
    absent: frozenset = dataclasses.field(default=frozenset(), kw_only=True, repr=False, compare=False)

    @classmethod
    def new(cls, *, extra: dict | None = None, **given: Any) -> Self:
        """A record as a producer writes it: the fields given (a misspelt name is a TypeError, never a
        key that goes silently into extra) and `extra`, the keys its producer names at run time (a
        benchmark's own figures); to_json() writes just those, and fields set later."""
        return cls(**given, extra=dict(extra or {}), absent=_names(cls).difference(given))

    @classmethod
    def from_json(cls, d: dict | None, where: str = "document") -> Self:
        try:
            return cls._read(d)
        except _Shape as e:
            place = "".join(e.path).lstrip(".")
            raise UsageError(f"{where}: {place} is not {e.want} (found {e.found})" if place else
                             f"{where} is not {e.want} (found {e.found})",
                             "is the file a tilewise results document?") from None

    @classmethod
    def _read(cls, d: dict | None) -> Self:
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise _Shape("a JSON object", d)
        kw = {}
        fields = _fields(cls)
        for name, conv in fields:
            if name in d:
                if conv is None:
                    kw[name] = d[name]
                    continue
                try:
                    kw[name] = conv(d[name])
                except _Shape as e:
                    e.path.insert(0, f".{name}")
                    raise
        names = _names(cls)
        extra = {k: v for k, v in d.items() if k not in names} if len(kw) < len(d) else {}
        return cls(**kw, extra=extra, absent=names.difference(d) if len(kw) < len(names) else _NONE)

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


class _Shape(Exception):
    """A value of the wrong shape; its place is filled in on the way out (free when all is well)."""

    def __init__(self, want: str, value: Any) -> None:
        super().__init__(want)
        self.want, self.path = want, []
        self.found = f"{type(value).__name__} {_shown(value)}" if isinstance(value, (str, int, float)) else type(value).__name__


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 32 else text[:29] + "..."


@cache
def _fields(cls: type) -> tuple[tuple[str, Callable | None], ...]:
    """(name, converter or None to take the value as it is) per declared field."""
    hints = get_type_hints(cls)
    return tuple((f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls) if f.name not in _OWN)


@cache
def _names(cls: type) -> frozenset:
    return frozenset(n for n, _ in _fields(cls))


@cache
def _converter(hint: Any) -> Callable | None:
    """How a JSON value becomes a value of `hint`; None: as it is."""
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in get_args(hint) if a is not type(None)]
        conv = _converter(inner[0]) if len(inner) == 1 else None
        return None if conv is None else (lambda v: None if v is None else conv(v))
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint._read
    if origin is list:
        (arg,) = get_args(hint) or (Any,)
        return _list(_converter(arg))
    if origin is dict:
        args = get_args(hint)
        return _dict(_converter(args[1]) if len(args) == 2 else None)
    if hint in _SCALARS:
        return _scalar(*_SCALARS[hint])
    return None


# a scalar field's JSON types (true/false is no number); null reads as an unset value
_SCALARS = {float: ((int, float), "a number"), int: ((int,), "a whole number"), str: ((str,), "text"),
            bool: ((bool,), "true or false")}


def _scalar(types_: tuple, want: str) -> Callable:
    number = bool not in types_

    def read(v: Any) -> Any:
        if v is None or (isinstance(v, types_) and not (number and isinstance(v, bool))):
            return v
        raise _Shape(want, v)
    return read


def _list(conv: Callable | None) -> Callable:
    def read(v: Any) -> list:
        if not isinstance(v, list):
            raise _Shape("a list", v)
        if conv is None:
            return list(v)
        try:
            return [conv(x) for x in v]
        except _Shape as e:
            e.path.insert(0, f"[{_failing(conv, v)}]")
            raise
    return read


def _dict(conv: Callable | None) -> Callable:
    def read(v: Any) -> dict:
        if not isinstance(v, dict):
            raise _Shape("a JSON object", v)
        if conv is None:
            return dict(v)
        try:
            return {k: conv(x) for k, x in v.items()}
        except _Shape as e:
            e.path.insert(0, f".{_failing(conv, v)}")
            raise
    return read


def _failing(conv: Callable, items: list | dict) -> object:
    """Which element (index or key) a converter refuses (only looked for on an error)."""
    for k, x in (items.items() if isinstance(items, dict) else enumerate(items)):
        try:
            conv(x)
        except _Shape:
            return k
    return "?"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _write(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, list):
        return [_write(x) for x in v]
    if isinstance(v, dict):
        return {k: _write(x) for k, x in v.items()}
    return v
