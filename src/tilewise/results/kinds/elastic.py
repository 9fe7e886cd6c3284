"""The ``elastic`` result kind (`bench elastic`): clients on one engine instance (a DuckDB process, a
PostgreSQL server's process tree) with and without the elastic allocator, one case per workload
and configuration, with the reaction to the load steps; its table, CSV and plot, and the older
``tilewise-elastic-bench/1`` format. (The daemon's own log is the ``elastic.log`` kind.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind


@dataclass
class Latency(Record):
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None


@dataclass
class TickCpu(Record):
    mean: float | None = None


@dataclass
class DaemonStats(Record):
    ticks: int | None = None
    tick_cpu_ms: TickCpu | None = None
    daemon_cpu_pct_of_core: float | None = None


@dataclass
class Step(Record):
    ticks: int | None = None
    s: float | None = None


@dataclass
class Reaction(Record):
    up: Step | None = None  # the first core allocated after the clients started
    down: Step | None = None  # the first core released after they stopped
    interval_s: float | None = None


@dataclass
class Case(Record):
    workload: str = ""
    config: str = ""
    queries_done: int = 0
    wall_s: float | None = None
    throughput_qps: float | None = None
    latency_ms: Latency = field(default_factory=Latency)
    cpu_s: float | None = None
    cpu_s_per_query: float | None = None
    cores_total: int | None = None
    cores_mean: float | None = None
    core_seconds_allocated: float | None = None
    cores_used_mean: float | None = None  # CPU the instance used, in cores (absent in older files)
    reaction: Reaction | None = None  # absent for os (static) and in older files
    # [seconds since the clients started, cores allocated, load %, cores used (newer files)]
    timeline: list[list] = field(default_factory=list)
    daemon: DaemonStats | None = None

    def react(self, which: str) -> str:
        step = getattr(self.reaction, which) if self.reaction else None
        if self.reaction is None:
            return "-"
        return "none" if step is None else str(step.ticks)

    @property
    def tick_cpu_ms(self) -> float | None:
        return self.daemon.tick_cpu_ms.mean if self.daemon and self.daemon.tick_cpu_ms else None

    @property
    def daemon_pct(self) -> float | None:
        return self.daemon.daemon_cpu_pct_of_core if self.daemon else None


@dataclass
class Params(Record):
    sf: float | None = None
    clients: int | None = None


@dataclass
class ElasticDoc(document.Document):
    params: Params = field(default_factory=Params)
    cases: list[Case] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def metrics(doc: ElasticDoc) -> list[dict]:
    out = []
    for c in doc.cases:
        base = f"{c.workload}/{c.config}"
        lab = {"workload": c.workload, "config": c.config}
        out.append(document.metric(f"{base}/throughput", [c.throughput_qps], unit="queries/s", better="higher", **lab))
        out.append(document.metric(f"{base}/latency_p50", [c.latency_ms.p50], unit="ms", **lab))
        out.append(document.metric(f"{base}/cpu_per_query", [c.cpu_s_per_query], unit="s", **lab))
        if c.tick_cpu_ms is not None:
            out.append(document.metric(f"{base}/tick_cpu", [c.tick_cpu_ms], unit="ms", **lab))
        if c.core_seconds_allocated is not None and c.reaction is not None:
            out.append(document.metric(f"{base}/core_seconds", [c.core_seconds_allocated], unit="core-s", **lab))
        for which in ("up", "down"):
            step = getattr(c.reaction, which) if c.reaction else None
            if step is not None and step.ticks is not None:
                out.append(document.metric(f"{base}/reaction_{which}", [step.ticks], unit="ticks", **lab))
    return out


def render(doc: ElasticDoc, out) -> None:
    tab = T.table(None, ("workload", "config", "queries", "q/s", "p50 ms", "p95 ms", "CPU s", "CPU s/q", "cores mean",
                         "used", "core-s", "react up", "react down", "tick ms", "daemon %"), left=("workload", "config"))
    for r in doc.cases:
        tab.add_row(r.workload, r.config, str(r.queries_done), T.fmt(r.throughput_qps, ".1f"),
                    T.fmt(r.latency_ms.p50, ".1f"), T.fmt(r.latency_ms.p95, ".1f"), T.fmt(r.cpu_s, ".2f"),
                    T.fmt(r.cpu_s_per_query, ".4f"), f"{T.fmt(r.cores_mean, '.2f')}/{r.cores_total}",
                    T.fmt(r.cores_used_mean, ".2f"), T.fmt(r.core_seconds_allocated, ".1f"), r.react("up"),
                    r.react("down"), _plain(r.tick_cpu_ms), _plain(r.daemon_pct))
    if doc.cases:
        out.print(tab)
        if any(r.reaction for r in doc.cases):
            out.print("react up/down: ticks from the clients' start (stop) to the first core allocated (released); "
                      "none: the load never called for one", markup=False)
    else:
        out.print("no cases measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
    T.footer(doc, out, notes=doc.notes)


def _plain(x) -> str:
    return "-" if x is None else str(x)


def csv_files(doc: ElasticDoc) -> dict[str, str]:
    def step(c, which, key):
        st = getattr(c.reaction, which) if c.reaction else None
        return None if st is None else getattr(st, key)

    rows = [[c.workload, c.config, c.queries_done, c.wall_s, c.throughput_qps, c.latency_ms.p50, c.latency_ms.p95,
             c.cpu_s, c.cpu_s_per_query, c.cores_mean, c.cores_total, c.tick_cpu_ms, c.daemon_pct,
             c.cores_used_mean, c.core_seconds_allocated, step(c, "up", "ticks"), step(c, "up", "s"),
             step(c, "down", "ticks"), step(c, "down", "s")] for c in doc.cases]
    if not rows:
        return {}
    return {"results.csv": T.csv_text(["workload", "config", "queries", "wall_s", "throughput_qps", "p50_ms", "p95_ms",
                                       "cpu_s", "cpu_s_per_query", "cores_mean", "cores_total", "tick_cpu_ms",
                                       "daemon_cpu_pct", "cores_used_mean", "core_seconds_allocated",
                                       "react_up_ticks", "react_up_s", "react_down_ticks", "react_down_s"], rows)}


def plots(doc: ElasticDoc, out_dir: Path) -> list[Path]:
    if not doc.cases or not doc.complete:
        return []
    return [plot(doc, out_dir / "elastic.png")]


def plot(doc: ElasticDoc, path: Path) -> Path:
    """Per workload: throughput (bars) and CPU per query (line) per configuration; cores over time."""
    plt = P.pyplot()
    workloads = list(dict.fromkeys(c.workload for c in doc.cases))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    for row, w in zip(axes, workloads):
        cs = [c for c in doc.cases if c.workload == w]
        names = [c.config for c in cs]
        row[0].bar(names, [c.throughput_qps or 0 for c in cs], color="tab:blue")
        row[0].set_ylabel("queries / s")
        ax2 = row[0].twinx()
        ax2.plot(names, [c.cpu_s_per_query or 0 for c in cs], "o-", color="tab:red")
        ax2.set_ylabel("CPU s / query", color="tab:red")
        row[0].set_title(f"{w}: throughput (bars), CPU per query (line)", fontsize=9)
        for c in cs:
            line = row[1].step([x[0] for x in c.timeline], [x[1] for x in c.timeline], where="post",
                               label=f"{c.config} allocated")[0]
            used = [(x[0], x[3]) for x in c.timeline if len(x) > 3 and x[3] is not None]
            if used:
                row[1].plot([u[0] for u in used], [u[1] for u in used], linestyle=":", color=line.get_color(),
                            label=f"{c.config} used")
        row[1].axvline(0.0, color="grey", linewidth=0.8, linestyle="--")
        walls = [c.wall_s for c in cs if c.wall_s]
        if walls:
            row[1].axvline(max(walls), color="grey", linewidth=0.8, linestyle="--")
        row[1].set_xlabel("time since the clients started (s); dashed: load steps")
        row[1].set_ylabel("cores")
        row[1].set_title(f"{w}: cores allocated (solid) and used (dotted) over time", fontsize=9)
        row[1].legend(fontsize=6)
    engine = doc.params.extra.get("engine", "duckdb")
    fig.suptitle(f"elastic allocator on {engine}, {doc.params.clients} clients, SF {doc.params.sf}", fontsize=10)
    fig.tight_layout()
    return P.save(fig, path)


def upgrade_1(doc: dict) -> dict:
    return document.legacy_envelope(doc, "elastic", doc.get("params", {}),
                                 {"cases": doc.get("cases", []), "notes": doc.get("notes", []), "plot": doc.get("plot")},
                                 complete=True)


KIND = Kind(name="elastic", document=ElasticDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=("results.csv", "elastic.png"), legacy={("tilewise-elastic-bench/1", None): upgrade_1})
