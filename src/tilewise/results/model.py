"""The results model: one versioned document for every benchmark, probe, workload and tuner run.

A results document (JSON) is::

    {"format": "tilewise-results", "version": 2, "kind": "tpch" | "elastic" | "probe.latency" |
     "probe.bandwidth" | "probe.stream" | "workload" | "tune" | ... ,
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
when the document is written (``with_metrics``), so it can never disagree with it. Loading
upgrades older documents, as pyperf does: ``tilewise-tpch-results/1``, ``tilewise-elastic-bench/1``,
``tilewise.probe/1`` and ``tilewise-tune-results`` version 1 load as version 2; a newer or unknown
format is a one-line error. Pure data: no console, no files other than ``load``'s read.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tilewise.errors import UsageError

FORMAT = "tilewise-results"
VERSION = 2
KINDS = ("tpch", "elastic", "probe.latency", "probe.bandwidth", "probe.stream", "workload", "tune", "overhead")
RESERVED = ("format", "version", "kind", "meta", "interrupted", "complete", "environment", "params", "metrics",
            "warnings")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def command_line(argv: Sequence[str] | None = None) -> tuple[str, list[str]]:
    """("tilewise bench tpch --sf 1", argv): the command as a user would type it again."""
    args = list(sys.argv if argv is None else argv)
    shown = ["tilewise", *args[1:]] if args and Path(args[0]).name in ("tilewise", "__main__.py") else args
    return shlex.join(shown), args


def new(kind: str, *, topo, params: dict, engines: dict[str, str] | None = None, system_check: dict | None = None,
        argv: Sequence[str] | None = None, environment: dict | None = None, **env_extra) -> dict:
    """A fresh document of `kind`: meta (command line, tilewise version and commit, start time) and
    the environment (topology included) filled in; the caller adds its body and metrics."""
    if kind not in KINDS:
        raise ValueError(f"unknown results kind {kind!r}; add it to KINDS")
    from tilewise.environment import capture

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


def metric(name: str, values: Sequence[float], *, unit: str, better: str = "lower",
           warmups: Sequence[float] = (), **labels) -> dict:
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    return {"name": name, "unit": unit, "better": better, "values": [v for v in values if v is not None],
            "warmups": [v for v in warmups if v is not None], "labels": labels}


# ---- metrics per kind (derived from the body) ------------------------------------------------

# the figures of a run record (key, title): TPC-H's unless the document names its benchmark's
TPCH_METRICS = (("power_at_size", "Power@Size"), ("throughput_at_size", "Throughput@Size"), ("qphh_at_size", "QphH@Size"))


def metric_names(doc: dict) -> tuple[tuple[str, str], ...]:
    """The (key, title) of the figures each run of a tpch-kind document records (the harness writes
    its benchmark's as `metric_names`; older documents are TPC-H's)."""
    names = doc.get("metric_names")
    return tuple((k, t) for k, t in names) if names else TPCH_METRICS


def _tpch_metrics(doc: dict) -> list[dict]:
    out = []
    for pol, rec in doc.get("policies", {}).items():
        if rec.get("same_as"):
            continue  # not run: it is the same deployment as an earlier policy
        for q, r in rec.get("queries", {}).items():
            if r.get("times_s"):
                out.append(metric(f"{pol}/{q}", r["times_s"], unit="s", warmups=r.get("warmup_s", []),
                                  policy=pol, query=q))
        if rec.get("run_wall_s"):
            out.append(metric(f"{pol}/run_wall", rec["run_wall_s"], unit="s", warmups=rec.get("warmup_wall_s", []),
                              policy=pol))
        for key, _ in metric_names(doc):
            unit = "queries/h"
            vals = [r.get(key) for r in rec.get("tpch_runs", [])]
            if any(v is not None for v in vals):
                out.append(metric(f"{pol}/{key.replace('_at_size', '@size')}", vals, unit=unit, better="higher",
                                  policy=pol))
    return out


def _elastic_metrics(doc: dict) -> list[dict]:
    out = []
    for c in doc.get("cases", []):
        base = f"{c['workload']}/{c['config']}"
        lab = {"workload": c["workload"], "config": c["config"]}
        out.append(metric(f"{base}/throughput", [c.get("throughput_qps")], unit="queries/s", better="higher", **lab))
        out.append(metric(f"{base}/latency_p50", [(c.get("latency_ms") or {}).get("p50")], unit="ms", **lab))
        out.append(metric(f"{base}/cpu_per_query", [c.get("cpu_s_per_query")], unit="s", **lab))
        ticks = ((c.get("daemon") or {}).get("tick_cpu_ms") or {})
        if ticks.get("mean") is not None:
            out.append(metric(f"{base}/tick_cpu", [ticks["mean"]], unit="ms", **lab))
    return out


def _pair_metrics(doc: dict) -> list[dict]:
    out = []
    better = "higher" if doc.get("probe") == "bandwidth" else "lower"
    for mode, classes in (doc.get("summary") or {}).items():
        for cls, s in classes.items():
            vals = s.get("values") or ([s["median"]] if s.get("median") is not None else [])
            out.append(metric(f"{mode}/{cls}", vals, unit=doc.get("unit", ""), better=better, mode=mode, pair_class=cls))
    return out


def _stream_metrics(doc: dict) -> list[dict]:
    out = []
    for c in doc.get("cases", []):
        for k in ("copy", "scale", "add", "triad"):
            vals = [r[k]["best_gbs"] for r in c.get("runs", []) if k in r]
            if vals:
                out.append(metric(f"{c['policy']}/{c['size_bytes']}/{k}", vals, unit="GB/s", better="higher",
                                  policy=c["policy"], size_bytes=c["size_bytes"], kernel=k))
    return out


def _workload_metrics(doc: dict) -> list[dict]:
    r = doc.get("result") or {}
    w = doc.get("workload", "workload")
    out = []
    if r.get("time_s") is not None:
        out.append(metric(f"{w}/time", [r["time_s"]], unit="s", workload=w))
    if r.get("max_rss_bytes") is not None:
        out.append(metric(f"{w}/max_rss", [r["max_rss_bytes"]], unit="bytes", workload=w))
    return out


def _tune_metrics(doc: dict) -> list[dict]:
    return [metric(c["label"], [r["time_s"] for r in c.get("raw", []) if r.get("status") == "ok"], unit="s",
                   warmups=c.get("warmup_s", []), config=c["label"])
            for c in doc.get("cases", [])]


def _overhead_metrics(doc: dict) -> list[dict]:
    out = []
    for side in ("plain", "tilewise"):
        vals = [r[side]["total_s"] for r in doc.get("rounds", []) if r.get(side)]
        out.append(metric(f"{side}/total", vals, unit="s", side=side))
    ratios = ((doc.get("summary") or {}).get("ratio") or {}).get("ratios") or []
    out.append(metric("tilewise/plain", ratios, unit="ratio"))
    return out


EXTRACTORS: dict[str, Callable[[dict], list[dict]]] = {
    "tpch": _tpch_metrics, "elastic": _elastic_metrics, "probe.latency": _pair_metrics,
    "probe.bandwidth": _pair_metrics, "probe.stream": _stream_metrics, "workload": _workload_metrics,
    "tune": _tune_metrics, "overhead": _overhead_metrics,
}


def with_metrics(doc: dict) -> dict:
    """Fill doc["metrics"] from the body (kinds without an extractor keep the metrics they carry)."""
    fn = EXTRACTORS.get(doc.get("kind"))
    if fn is not None:
        doc["metrics"] = [m for m in fn(doc) if m["values"]]
    return doc


def metrics_by_name(doc: dict) -> dict[str, dict]:
    return {m["name"]: m for m in doc.get("metrics", [])}


# ---- loading and upgrading -------------------------------------------------------------------

def _v1_meta(doc: dict, started: str | None = None, finished: str | None = None) -> dict:
    env = doc.get("environment") or {}
    return {"command": None, "argv": None, "cwd": None, "tilewise_version": env.get("tilewise_version"),
            "git_commit": env.get("git_commit"), "started": started or env.get("time"), "finished": finished,
            "upgraded_from": doc.get("format") + (f" version {doc['version']}" if "version" in doc else "")}


def _envelope(doc: dict, kind: str, params: dict, body: dict, *, complete: bool, interrupted: bool = False,
              started: str | None = None, finished: str | None = None, warnings: list | None = None) -> dict:
    env = dict(doc.get("environment") or {})
    env.setdefault("engines", {})
    out = {"format": FORMAT, "version": VERSION, "kind": kind, "meta": _v1_meta(doc, started, finished),
           "interrupted": interrupted, "complete": complete, "environment": env, "params": params,
           "metrics": [], "warnings": list(warnings or [])}
    out.update({k: v for k, v in body.items() if k not in RESERVED})
    return with_metrics(out)


def _up_tpch_1(doc: dict) -> dict:
    keys = ("engine", "sf", "streams", "runs", "warmup", "data_dir", "dataset")
    params = {k: doc.get(k) for k in keys}
    params["queries"] = [int(q[1:]) for q in doc.get("queries_run", [])]
    params["policies"] = list(doc.get("policies", {}))
    params["tests"] = ["legacy"]
    env = doc.setdefault("environment", {})
    env.setdefault("engines", {doc.get("engine"): doc.get("engine_version")})
    pols = doc.get("policies", {})
    complete = bool(pols) and all(p.get("complete") for p in pols.values())
    body = {"validation": doc.get("validation"), "policies": pols, "plots": doc.get("plots", [])}
    return _envelope(doc, "tpch", params, body, complete=complete,
                     interrupted=any(p.get("error") == "interrupted" for p in pols.values()),
                     started=doc.get("started"), finished=doc.get("finished"), warnings=doc.get("warnings"))


def _up_elastic_1(doc: dict) -> dict:
    return _envelope(doc, "elastic", doc.get("params", {}), {"cases": doc.get("cases", []), "notes": doc.get("notes", []),
                                                            "plot": doc.get("plot")}, complete=True)


def _up_probe_1(doc: dict) -> dict:
    kind = f"probe.{doc.get('probe')}"
    if kind not in KINDS:
        raise UsageError(f"unknown probe {doc.get('probe')!r} in a tilewise.probe/1 document")
    params = doc.get("params") or {k: doc.get(k) for k in ("ntimes", "runs", "size_rule")}
    body = {k: v for k, v in doc.items() if k not in ("format", "environment", "params", "complete")}
    return _envelope(doc, kind, params, body, complete=bool(doc.get("complete")), warnings=doc.get("warnings"))


def _up_tune_1(doc: dict) -> dict:
    body = {k: v for k, v in doc.items() if k not in ("format", "version", "environment", "interrupted")}
    return _envelope(doc, "tune", {"target": doc.get("target"), "grid": doc.get("grid"), "repeat": doc.get("repeat"),
                                   "warmup": doc.get("warmup")}, body,
                     complete=not doc.get("interrupted"), interrupted=bool(doc.get("interrupted")),
                     started=doc.get("created"), warnings=doc.get("warnings"))


UPGRADES: dict[tuple[str, int | None], Callable[[dict], dict]] = {
    ("tilewise-tpch-results/1", None): _up_tpch_1,
    ("tilewise-elastic-bench/1", None): _up_elastic_1,
    ("tilewise.probe/1", None): _up_probe_1,
    ("tilewise-tune-results", 1): _up_tune_1,
}


def upgrade(doc: dict, source: str = "document") -> dict:
    """The document in the current version (old formats are converted; this one is returned as is)."""
    if not isinstance(doc, dict):
        raise UsageError(f"{source} is not a results document (a JSON object is expected)")
    fmt, ver = doc.get("format"), doc.get("version")
    if fmt == FORMAT:
        if not isinstance(ver, int):
            raise UsageError(f"{source}: {FORMAT} document without a version number")
        if ver > VERSION:
            raise UsageError(f"{source} is {FORMAT} version {ver}, newer than this tilewise reads ({VERSION})",
                             "upgrade tilewise to read it")
        if ver < VERSION:  # future: chain v2 -> v3 ... here
            raise UsageError(f"{source}: {FORMAT} version {ver} is not readable (this tilewise reads {VERSION})")
        if doc.get("kind") not in KINDS:
            raise UsageError(f"{source}: unknown results kind {doc.get('kind')!r}", "upgrade tilewise to read it")
        return doc
    up = (UPGRADES.get((fmt, ver)) or UPGRADES.get((fmt, None))) if isinstance(fmt, str) else None
    if up is None:
        raise UsageError(f"{source} has result format {fmt!r}" + (f" version {ver}" if ver is not None else "")
                         + f"; this tilewise reads {FORMAT} version {VERSION} and the older formats "
                         + ", ".join(f for f, _ in UPGRADES))
    return up(doc)


def load(path: str | os.PathLike, *, name: str = "results.json") -> dict:
    """Read a results document (a file, or a folder holding `name`) and upgrade it."""
    p = Path(path)
    if p.is_dir():
        cands = [p / name] + sorted(p.glob("*.json"))
        p = next((c for c in cands if c.is_file() and _looks_like_results(c)), p / name)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {p}: {e.strerror or e}", "give a results folder or results.json") from None
    except ValueError as e:
        raise UsageError(f"{p} is not valid JSON: {e}") from None
    return upgrade(doc, str(p))


def _looks_like_results(p: Path) -> bool:
    try:
        with open(p) as f:
            head = f.read(4096)
    except OSError:
        return False
    return '"format"' in head


# ---- small helpers shared by the producers ----------------------------------------------------

def median_or_none(xs: Sequence[float]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None
