"""Result kinds: each kind of results document is one module here, exporting one ``Kind``.

A kind owns everything about its documents: the typed body (dataclasses deriving from
``document.Document``, read with ``Kind.view``), the metrics derived from it, its tables, CSV files and
plots, the files it may write into an output folder, the older formats it upgrades, and any
comparison of its own (TPC-H next to JCC-H). ``results.report`` only dispatches to the kind and
compares runs through the kind-independent metrics.

The registry below is the one place kinds are listed (by module path: listing imports nothing);
a package outside the tree adds a kind through the ``tilewise.results`` entry-point group, as
engines and benchmarks do (``tilewise.registry``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewise.registry import Registry


@dataclass(frozen=True)
class Kind:
    name: str
    document: type  # a document.Document subclass: the typed view of the whole document
    # the kind-independent metrics, from the typed document (None: the document carries its own)
    metrics: Callable[[Any], list[dict]] | None = None
    # derived figures stored beside the raw values as doc["summary"] when the document is written
    summary: Callable[[Any], dict] | None = None
    render: Callable[[Any, Any], None] | None = None  # (typed document, rich console)
    csv: Callable[[Any], dict[str, str]] | None = None  # file name -> text
    plots: Callable[[Any, Path], list[Path]] | None = None
    # every file the kind may write beside its JSON (one the current document does not produce is
    # removed, so a folder never mixes two runs); a function of the typed document where it depends on it
    files: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ("metrics.csv",)
    # older formats it reads: (format, version or None for any) -> the current document
    legacy: dict[tuple[str, int | None], Callable[[dict], dict]] = field(default_factory=dict)
    # a document of the current format as read (e.g. a log's state from its last line)
    current: Callable[[dict], dict] | None = None
    # a comparison of the kind's own over several runs [(label, doc)], or None where it does not apply
    compare: Callable[[list[tuple[str, dict]]], Any] | None = None
    # kinds this one was called before: old name -> the upgrade of such a document (its kind set to
    # this one); listed in RENAMED below too, so that loading finds it without importing every kind
    renamed: dict[str, Callable[[dict], dict]] = field(default_factory=dict)

    def view(self, doc: dict) -> Any:
        """The typed document (every key kept: view(doc).to_json() == doc)."""
        return self.document.from_json(doc, "results document")

    def owned(self, doc: dict) -> tuple[str, ...]:
        return self.files(self.view(doc)) if callable(self.files) else self.files


_K = "tilewise.results.kinds"
REGISTRY = Registry("results kind", "tilewise.results", {
    "benchmark": f"{_K}.benchmark",
    "elastic": f"{_K}.elastic",
    "elastic.log": f"{_K}.elastic_log",
    "elastic.tick": f"{_K}.elastic_tick",
    "probe.latency": f"{_K}.pairs:LATENCY",
    "probe.bandwidth": f"{_K}.pairs:BANDWIDTH",
    "probe.stream": f"{_K}.stream",
    "probe.memory": f"{_K}.memory",
    "probe.exchange": f"{_K}.exchange",
    "workload": f"{_K}.workload",
    "tune": f"{_K}.tune",
    "tune.engine": f"{_K}.tune_engine",
    "overhead": f"{_K}.overhead",
    "workload.tensor": f"{_K}.tensor",
    "probe.gpu": f"{_K}.gpu",
    "workload.far_memory": f"{_K}.far_memory",
    "layout": f"{_K}.layout",
}, attr="KIND")


# old kind name -> the kind it is now (whose Kind.renamed upgrades its documents)
RENAMED = {"tpch": "benchmark"}


def rename(doc: dict) -> dict:
    """A document of a kind that was renamed, as the kind it is now (others as they are)."""
    new = RENAMED.get(doc.get("kind")) if isinstance(doc.get("kind"), str) else None
    if new is None:
        return doc
    k = get(new)
    return k.renamed[doc["kind"]](doc) if k is not None else doc


def names() -> list[str]:
    return REGISTRY.names()


def get(name: str | None) -> Kind | None:
    """The kind of that name, None for an unknown one."""
    if not isinstance(name, str) or name not in names():
        return None
    return REGISTRY.get(name)


def all_kinds() -> list[Kind]:
    return list(REGISTRY)


def legacy_reader(fmt: str, version: int | None) -> Callable[[dict], dict] | None:
    for k in all_kinds():
        up = k.legacy.get((fmt, version)) or k.legacy.get((fmt, None))
        if up is not None:
            return up
    return None


def legacy_formats() -> list[str]:
    return list(dict.fromkeys(f for k in all_kinds() for f, _ in k.legacy))
