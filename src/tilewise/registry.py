"""Registries of extension points (engines, benchmarks): the one place their names are listed.

A registry maps a name to a spec object that its own package exports (``SPEC`` by default). The
built-in entries are listed here by module path, so listing names imports nothing; packages
outside the tree add entries through a Python entry-point group (``tilewise.engines``,
``tilewise.benchmarks``), whose value is ``module`` or ``module:ATTRIBUTE``. A built-in name cannot
be taken over by an entry point: a clash is reported when that entry is used.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from tilewise.errors import TilewiseError, UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "module" or "module:ATTRIBUTE"
    origin: str  # "built-in" or "entry point <group> of <distribution>"


class Registry(Generic[T]):
    def __init__(self, kind: str, group: str, builtin: dict[str, str], attr: str = "SPEC") -> None:
        self.kind = kind  # "engine", "benchmark": for messages
        self.group = group
        self.builtin = dict(builtin)
        self.attr = attr
        self._loaded: dict[str, T] = {}
        self._entries: list[Entry] | None = None

    def entries(self) -> list[Entry]:
        """Built-in entries first (in their listed order), then entry points sorted by name. The
        installed packages' entry points are read once per registry (that takes tens of ms, and a
        registry is consulted for every document, query or command line)."""
        if self._entries is None:
            self._entries = self._read_entries()
        return self._entries

    def refresh(self) -> None:
        """Forget what was read and loaded (after installing or removing a plug-in in-process)."""
        self._entries = None
        self._loaded.clear()

    def _read_entries(self) -> list[Entry]:
        out = [Entry(n, t, "built-in") for n, t in self.builtin.items()]
        seen = set(self.builtin)
        external = []
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            who = getattr(dist, "name", None) or "an installed package"
            if ep.name in seen:
                continue  # a built-in name is never taken over (see get())
            seen.add(ep.name)
            external.append(Entry(ep.name, ep.value, f"entry point {self.group} of {who}"))
        return out + sorted(external, key=lambda e: e.name)

    def names(self) -> list[str]:
        return [e.name for e in self.entries()]

    def entry(self, name: str) -> Entry:
        key = (name or "").strip().lower()
        for e in self.entries():
            if e.name == key:
                return e
        raise UsageError(f"unknown {self.kind} {name!r}", f"choose one of {', '.join(self.names())}")

    def get(self, name: str) -> T:
        """The spec registered under name (its module imported on first use)."""
        e = self.entry(name)
        if e.name not in self._loaded:
            self._loaded[e.name] = self._load(e)
        return self._loaded[e.name]

    def __iter__(self) -> Iterator[T]:
        return (self.get(n) for n in self.names())

    def _load(self, e: Entry) -> T:
        module, _, attr = e.target.partition(":")
        try:
            mod = importlib.import_module(module.strip())
        except Exception as ex:  # noqa: BLE001 - a broken plug-in is one line, not a traceback
            raise TilewiseError(f"the {self.kind} {e.name!r} ({e.origin}) cannot be imported: "
                                f"{type(ex).__name__}: {ex}",
                                f"fix or uninstall the package that provides {module.strip()}") from None
        spec = getattr(mod, (attr or self.attr).strip(), None)
        if spec is None:
            raise TilewiseError(f"the {self.kind} {e.name!r} ({e.origin}) has no {attr or self.attr} in {module}",
                                f"export the {self.kind}'s spec as {module}.{attr or self.attr}")
        spec_name = getattr(spec, "name", e.name)
        if spec_name != e.name:
            raise TilewiseError(f"the {self.kind} registered as {e.name!r} ({e.origin}) calls itself {spec_name!r}",
                                "register it under the name its spec gives")
        return spec
