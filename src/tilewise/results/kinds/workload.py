"""The ``workload`` result kind (`workload --out`): one run of a workload of paper 003 (W1-W4, the
allocator microbenchmark) under one configuration; its summary lines (and the generic metrics CSV)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise.results import document
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

# the workloads of tune.workloads (paper 003), as the tables and `workload --list` call them
DESCRIPTIONS = {"W1": "holistic aggregation (median per group)", "W2": "distributive aggregation (count per group)",
                "W3": "non-partitioned hash join (build 1 : probe 16)", "W4": "index nested-loop join (B+-tree)",
                "alloc": "allocator microbenchmark (allocate+write / read+free)"}


@dataclass
class Result(Record):
    dataset: str | None = None
    threads: int | None = None
    pinned_cpus: str | None = None
    time_s: float | None = None
    build_s: float | None = None  # W3, W4
    probe_s: float | None = None  # W3
    max_rss_bytes: int | None = None
    memory_overhead: float | None = None  # alloc
    requested_peak_bytes: int | None = None  # alloc
    result_rows: int | None = None
    checksum: int | str | None = None


@dataclass
class Config(Record):
    allocator: str = "system"


@dataclass
class Switch(Record):
    shown: str | None = None


@dataclass
class WorkloadDoc(document.Document):
    workload: str = "workload"
    label: str = ""
    config: Config = field(default_factory=Config)
    result: Result = field(default_factory=Result)
    allocator_verified: bool | None = None
    os_switches: dict[str, Switch] = field(default_factory=dict)
    os_restored: bool = False


def metrics(doc: WorkloadDoc) -> list[dict]:
    r, w = doc.result, doc.workload
    out = []
    if r.time_s is not None:
        out.append(document.metric(f"{w}/time", [r.time_s], unit="s", workload=w))
    if r.max_rss_bytes is not None:
        out.append(document.metric(f"{w}/max_rss", [r.max_rss_bytes], unit="bytes", workload=w))
    return out


def render(doc: WorkloadDoc, out) -> None:
    r, w = doc.result, doc.workload
    out.print(f"[bold]{w}[/bold] {DESCRIPTIONS.get(w, '')}: dataset {r.dataset}, {r.threads} thread(s)")
    out.print(f"  config     {doc.label}" + (f" (pinned to CPUs {r.pinned_cpus})" if r.pinned_cpus else ""), markup=False)
    out.print(f"  time       {r.time_s:.3f} s" + (f"  (index build {r.build_s:.3f} s, reported apart)" if w == "W4" else "")
              + (f"  (build {r.build_s:.3f} s, probe {r.probe_s:.3f} s)" if w == "W3" else ""), markup=False)
    out.print(f"  max RSS    {T.binary_bytes(r.max_rss_bytes)}", markup=False)
    if w == "alloc":
        out.print(f"  overhead   {r.memory_overhead:.2f} x (max RSS / {T.binary_bytes(r.requested_peak_bytes)} "
                  "requested at peak)", markup=False)
    else:
        out.print(f"  result     {r.result_rows} rows, checksum {r.checksum}", markup=False)
    alloc = {True: "verified in /proc/PID/maps", False: "NOT in use", None: "not checked"}[doc.allocator_verified]
    out.print(f"  allocator  {doc.config.allocator}: {alloc}", markup=False)
    os_line = ", ".join(f"{k} {v.shown}" for k, v in doc.os_switches.items())
    out.print(f"  OS         {os_line}" + (" (changed for this run, restored)" if doc.os_restored else ""), markup=False)
    T.footer(doc, out)


KIND = Kind(name="workload", document=WorkloadDoc, metrics=metrics, render=render)
