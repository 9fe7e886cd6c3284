"""The envelope every results document shares, typed: ``Document`` (each kind's document derives
from it), its ``meta``, ``environment`` and ``metrics``; ``metric`` makes a metric entry, and
``legacy_envelope`` wraps the body of an older format in the current envelope. The kinds
(results.kinds) build on this module; the loader (results.model) on the kinds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tilewise.results.body import Record

FORMAT = "tilewise-results"
VERSION = 2
RESERVED = ("format", "version", "kind", "meta", "interrupted", "complete", "environment", "params", "metrics",
            "warnings")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())



# ---- the envelope, typed (each kind's document derives from Document) ---------------------------

@dataclass
class Meta(Record):
    command: str | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    tilewise_version: str | None = None
    git_commit: str | None = None
    started: str | None = None
    finished: str | None = None
    upgraded_from: str | None = None


@dataclass
class Metric(Record):
    name: str = ""
    unit: str = ""
    better: str = "lower"
    values: list[float] = field(default_factory=list)
    warmups: list[float] = field(default_factory=list)
    labels: dict = field(default_factory=dict)


@dataclass
class SystemCheck(Record):
    warnings: list[str] = field(default_factory=list)


@dataclass
class Environment(Record):
    system_check: SystemCheck | None = None
    engines: dict = field(default_factory=dict)


@dataclass
class Document(Record):
    format: str = FORMAT
    version: int = VERSION
    kind: str = ""
    meta: Meta = field(default_factory=Meta)
    interrupted: bool = False
    complete: bool = False
    environment: Environment = field(default_factory=Environment)
    params: dict = field(default_factory=dict)
    metrics: list[Metric] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def system_warnings(self) -> list[str]:
        check = self.environment.system_check
        return check.warnings if check else []


def metric(name: str, values: Sequence[float], *, unit: str, better: str = "lower",
           warmups: Sequence[float] = (), **labels) -> dict:
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    return {"name": name, "unit": unit, "better": better, "values": [v for v in values if v is not None],
            "warmups": [v for v in warmups if v is not None], "labels": labels}


def legacy_meta(doc: dict, started: str | None = None, finished: str | None = None) -> dict:
    """meta of a document converted from an older format (its command line is unknown)."""
    env = doc.get("environment") or {}
    return {"command": None, "argv": None, "cwd": None, "tilewise_version": env.get("tilewise_version"),
            "git_commit": env.get("git_commit"), "started": started or env.get("time"), "finished": finished,
            "upgraded_from": doc.get("format") + (f" version {doc['version']}" if "version" in doc else "")}


def legacy_envelope(doc: dict, kind: str, params: dict, body: dict, *, complete: bool, interrupted: bool = False,
                    started: str | None = None, finished: str | None = None, warnings: list | None = None) -> dict:
    """A current document of `kind` around the body of an older format (the loader derives its
    metrics)."""
    env = dict(doc.get("environment") or {})
    env.setdefault("engines", {})
    out = {"format": FORMAT, "version": VERSION, "kind": kind, "meta": legacy_meta(doc, started, finished),
           "interrupted": interrupted, "complete": complete, "environment": env, "params": params,
           "metrics": [], "warnings": list(warnings or [])}
    out.update({k: v for k, v in body.items() if k not in RESERVED})
    return out
