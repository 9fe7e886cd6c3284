"""The results model: one versioned document for every benchmark, probe, workload and tuner run.

A results document (JSON) is::

    {"format": "tilewise-results", "version": 2, "kind": "benchmark" | "elastic" | "elastic.log" |
     "elastic.tick" | "probe.latency" | "probe.bandwidth" | "probe.stream" | "workload" | "tune" |
     "overhead" | "workload.tensor" | "probe.gpu" | "workload.far_memory" | "layout",
     "meta": {"command", "argv", "cwd", "tilewise_version", "git_commit", "started", "finished"},
     "interrupted": false, "complete": true,
     "environment": {... environment.capture(): machine, kernel, topology (with its document),
                     OS switches, "engines": {name: version}, "system_check": {... "warnings"}},
     "params": {what was asked},
     "metrics": [{"name", "unit", "better": "lower"|"higher", "values": [raw, one per run],
                  "warmups": [raw], "labels": {...}}],
     "warnings": [...],
     ... the kind's own body (raw values kept: per-run times, per-pair samples, daemon logs) }

``metrics`` is the kind-independent view `tilewise report` compares; it is derived from the body
when the document is written (``with_metrics``), so it can never disagree with it. Each kind is one
module of ``results.kinds`` (its typed body, metrics, tables, CSV, plots and the older formats it
reads) on the envelope they share (``results.document``); this module makes documents and loads
them, dispatching to their kinds.

Loading upgrades older documents, as pyperf does: ``tilewise-tpch-results/1``,
``tilewise-elastic-bench/1``, ``tilewise.probe/1``, ``tilewise-tune-results`` version 1,
``tilewise-elastic-tick/1`` and the JSON-lines ``tilewise-elastic`` log version 1 load as version 2;
a newer or unknown format is a one-line error. A document that grows while it is measured (the
elastic daemon's log) is JSON lines: the envelope on the first line, one record per line after it
(``output.LineWriter``); ``load`` reads both shapes. Pure data: no console, no files other than
``load``'s read.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from tilewise import userfiles
from tilewise.environment import capture
from tilewise.errors import UsageError
from tilewise.results import kinds
from tilewise.results.document import FORMAT, VERSION, metric, now  # noqa: F401 - metric: the harnesses' API


class NotResults(UsageError):
    """The input is not a results document this tilewise reads (unknown format, version or kind)."""


def command_line(argv: Sequence[str] | None = None) -> tuple[str, list[str]]:
    """("tilewise bench tpch --sf 1", argv): the command as a user would type it again."""
    args = list(sys.argv if argv is None else argv)
    shown = ["tilewise", *args[1:]] if args and Path(args[0]).name in ("tilewise", "__main__.py") else args
    return shlex.join(shown), args


def new(kind: str, *, topo, params: dict, engines: dict[str, str] | None = None, system_check: dict | None = None,
        argv: Sequence[str] | None = None, environment: dict | None = None, **env_extra) -> dict:
    """A fresh document of `kind`: meta (command line, tilewise version and commit, start time) and
    the environment (topology included) filled in; the caller adds its body and metrics."""
    if kind not in kinds.names():
        raise ValueError(f"unknown results kind {kind!r}; add its module to results.kinds")

    env = environment if environment is not None else capture(topo, **env_extra)
    env["engines"] = dict(engines or {})
    if system_check is not None:
        env["system_check"] = system_check
    cmd, args = command_line(argv)
    return {
        "format": FORMAT, "version": VERSION, "kind": kind,
        "meta": {"command": cmd, "argv": args, "cwd": os.getcwd(), "tilewise_version": env.get("tilewise_version"),
                 "git_commit": env.get("git_commit"), "started": now(), "finished": None},
        "interrupted": False, "complete": False,
        "environment": env, "params": params, "metrics": [], "warnings": [],
    }


def finish(doc: dict, *, complete: bool, interrupted: bool = False) -> dict:
    doc["meta"]["finished"] = now()
    doc["complete"] = bool(complete)
    doc["interrupted"] = bool(interrupted)
    return doc


def stopped(doc: dict, exc: BaseException) -> dict:
    """Record why a run ended early: Ctrl-C or SIGTERM (any BaseException that is not an
    Exception) is "interrupted"; an error is kept in doc["error"]."""
    if isinstance(exc, Exception):
        doc["error"] = str(exc) or type(exc).__name__
        return finish(doc, complete=False)
    return finish(doc, complete=False, interrupted=True)


def with_metrics(doc: dict, view=None) -> dict:
    """Fill doc["metrics"] from the body (kinds without metrics of their own keep what they carry);
    view: the document's typed view when the caller has it already."""
    k = kinds.get(doc.get("kind"))
    if k is not None and k.metrics is not None:
        doc["metrics"] = [m for m in k.metrics(view if view is not None else k.view(doc)) if m["values"]]
    return doc


def metrics_by_name(doc: dict) -> dict[str, dict]:
    return {m["name"]: m for m in doc.get("metrics", [])}


# ---- loading and upgrading -------------------------------------------------------------------

def upgrade(doc: dict, source: str = "document") -> dict:
    """The document in the current version (old formats are converted; this one is returned as is)."""
    if not isinstance(doc, dict):
        raise NotResults(f"{source} is not a results document (a JSON object is expected)")
    fmt, ver = doc.get("format"), doc.get("version")
    if fmt == FORMAT:
        if not isinstance(ver, int):
            raise NotResults(f"{source}: {FORMAT} document without a version number")
        if ver > VERSION:
            raise NotResults(f"{source} is {FORMAT} version {ver}, newer than this tilewise reads ({VERSION})",
                             "upgrade tilewise to read it")
        if ver < VERSION:  # future: chain v2 -> v3 ... here
            raise NotResults(f"{source}: {FORMAT} version {ver} is not readable (this tilewise reads {VERSION})")
        doc = kinds.rename(doc)  # a kind renamed since (tpch -> benchmark)
        k = kinds.get(doc.get("kind"))
        if k is None:
            raise NotResults(f"{source}: unknown results kind {doc.get('kind')!r}", "upgrade tilewise to read it")
        return k.current(doc) if k.current else doc
    up = kinds.legacy_reader(fmt, ver) if isinstance(fmt, str) else None
    if up is None:
        raise NotResults(f"{source} has result format {fmt!r}" + (f" version {ver}" if ver is not None else "")
                         + f"; this tilewise reads {FORMAT} version {VERSION} and the older formats "
                         + ", ".join(kinds.legacy_formats()))
    doc = up(doc)
    k = kinds.get(doc["kind"])
    return k.current(doc) if k.current else with_metrics(doc)


def load(path: str | os.PathLike, *, name: str = "results.json") -> dict:
    """Read a results document (a file, or a folder holding `name`) and upgrade it. A JSON-lines
    file (a log written as it grew) is its first line with the later lines as doc["records"]."""
    p = Path(path)
    if p.is_dir():
        cands = [p / name] + sorted(p.glob("*.json"))
        p = next((c for c in cands if c.is_file() and _looks_like_results(c)), p / name)
    data = userfiles.read_bytes(p, "results", "give a results folder or results.json")
    try:
        text = userfiles.decode(data, p)
    except UsageError:
        raise NotResults(f"{p} is not a results document (not text)") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise UsageError(f"results {p}: nests deeper than {userfiles.MAX_DEPTH} levels",
                         "is it a file tilewise wrote?") from None
    except ValueError as e:
        doc = _json_lines(text, p, e)
    if userfiles.depth(doc) > userfiles.MAX_DEPTH:
        raise UsageError(f"results {p}: nests deeper than {userfiles.MAX_DEPTH} levels", "is it a file tilewise wrote?")
    doc = upgrade(doc, str(p))
    kinds.get(doc["kind"]).document.from_json(doc, str(p))  # every value of its kind's type, or the one that is not
    return doc


def _json_lines(text: str, p: Path, first_error: ValueError) -> dict:
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    try:
        head = json.loads(lines[0][1]) if lines else None
    except (ValueError, RecursionError):
        head = None
    if not isinstance(head, dict):
        raise UsageError(f"{p} is not valid JSON: {first_error}") from None
    records, warnings = [], []
    for k, (i, line) in enumerate(lines[1:], 2):
        try:
            records.append(userfiles.parse_json(line, p, line=i))
        except UsageError:
            if k == len(lines):  # a last line cut short: the writer was killed mid-line; the rest is whole
                warnings.append(f"{p}:{i}: the last line is cut short (the writer stopped while writing it); "
                                "it is left out")
                break
            raise UsageError(f"{p}:{i}: not a JSON line", "is it a file tilewise wrote?") from None
    head["records"] = records
    if warnings:
        head["warnings"] = list(head.get("warnings") or []) + warnings
    return head


def _looks_like_results(p: Path) -> bool:
    try:
        with open(p, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return '"format"' in head
