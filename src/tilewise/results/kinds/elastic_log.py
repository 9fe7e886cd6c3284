"""The ``elastic.log`` result kind: the elastic daemon's log (`tilewise elastic --log`, and the
logs/<case>.jsonl of `bench elastic`), its summary, its text and its plot.

The log is written while the daemon runs, so it is JSON lines (``output.LineWriter``): the results
envelope on the first line (command, environment, parameters), then one record per line as it
happens, each flushed: a ``start`` event per unit, one record per tick (load u, the net's
transitions, the action, the cores), other events (``target exited``), and last an ``end`` record
with the stop reason, the daemon's own cost, any restore problems and whether the run completed.
A daemon killed hard leaves every line it wrote; the log then has no end record (complete false).

Reading gives the document with the lines after the first as ``records``. The log of tilewise
before the results model (JSON lines headed ``{"event": "log", "format": "tilewise-elastic",
"version": 1}``) reads as this kind, with the same summary and plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.errors import UsageError
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

LEGACY = ("tilewise-elastic", 1)


@dataclass
class TickCpu(Record):
    mean: float | None = None
    median: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass
class DaemonStats(Record):
    """The controller's own cost (Daemon.stats)."""
    ticks: int | None = None
    tick_cpu_ms: TickCpu = field(default_factory=TickCpu)
    daemon_cpu_s: float | None = None
    wall_s: float | None = None
    daemon_cpu_pct_of_core: float | None = None


@dataclass
class LogRecord(Record):
    """One line after the header: a tick (no event) or an event (start, target exited, end)."""
    t: float | None = None
    unit: str | None = None
    event: str | None = None
    u: float | None = None  # load of the allocated cores, %
    transitions: list[str] = field(default_factory=list)
    action: str | None = None  # allocate | release | none
    n_alloc: int | None = None
    cpus: str | None = None
    tick_cpu_ms: float | None = None
    # the end record
    stop_reason: str | None = None
    stats: DaemonStats | None = None
    problems: list[str] = field(default_factory=list)
    uncontrolled: list[str] = field(default_factory=list)  # processes left alone (the run was partial)
    detail: str | None = None  # a "not controlled" event: which process and why
    complete: bool | None = None
    interrupted: bool | None = None

    @property
    def is_tick(self) -> bool:
        return not self.event


@dataclass
class LogDoc(document.Document):
    records: list[LogRecord] = field(default_factory=list)

    @property
    def ticks(self) -> list[LogRecord]:
        return [r for r in self.records if r.is_tick]

    @property
    def end(self) -> LogRecord | None:
        return next((r for r in self.records if r.event == "end"), None)

    @property
    def source(self) -> str:
        p = self.params
        return p.get("source") or ", ".join(p.get("target") or []) or "log"


# ---- writing (the daemon's side: the first line is model.new("elastic.log", ...)) ---------------------

def end_record(*, t: float | None, stop_reason: str | None, stats: dict | None, problems: Sequence[str] = (),
               interrupted: bool = False, uncontrolled: Sequence[str] = ()) -> dict:
    """The last line: why the daemon stopped, its own cost, what it could not restore, which
    processes it was not allowed to control (then the run was partial)."""
    rec = {"event": "end", "t": t, "stop_reason": stop_reason, "stats": stats, "problems": list(problems),
           "uncontrolled": list(uncontrolled) or None, "complete": not interrupted, "interrupted": interrupted,
           "finished": document.now()}
    return {k: v for k, v in rec.items() if v is not None or k in ("stop_reason", "stats")}


# ---- reading ---------------------------------------------------------------------------------------

def _check(doc: LogDoc) -> None:
    for i, r in enumerate(doc.records, 2):
        if r.is_tick and (r.n_alloc is None or r.u is None or r.action is None):
            raise UsageError(f"line {i} of the elastic log is neither a tick nor an event",
                             "is it a file `tilewise elastic --log` wrote?")


def current(doc: dict) -> dict:
    """A log as read: its state comes from the end record. Without one the daemon did not finish
    (killed hard), except in a simulation's log from before end records (it has no daemon)."""
    v = KIND.view(doc)
    _check(v)
    end = v.end
    if end is not None:
        stopped = end.interrupted if end.interrupted is not None else end.stop_reason == "stopped by signal"
        doc["interrupted"] = bool(stopped)
        doc["complete"] = not stopped if end.complete is None else bool(end.complete)
    else:
        starts = [r for r in v.records if r.event == "start"]
        doc["interrupted"] = False
        doc["complete"] = bool(starts) and all(r.get("enforce") == "simulated" for r in starts)
    if end and end.get("finished"):
        doc["meta"]["finished"] = end.get("finished")
    doc["metrics"] = [m for m in metrics(v) if m["values"]]  # from this view: a long log is read once
    return doc


def upgrade_1(doc: dict) -> dict:
    """The log before the results model: the same records under a one-line header."""
    recs = doc.get("records") or []
    out = document.legacy_envelope(doc, "elastic.log", {}, {"records": recs}, complete=False)
    out["meta"]["started"] = None
    return out  # the loader reads its state from the end record (current)


# ---- metrics and the summary -----------------------------------------------------------------------

def metrics(doc: LogDoc) -> list[dict]:
    """Per tick: the allocated cores and the controller's CPU time. With one target the names are
    "cores" and "tick_cpu" (so two runs on different pids compare), else "<target>/cores" ..."""
    units = list(dict.fromkeys(r.unit for r in doc.ticks))
    out = []
    for unit in units:
        ticks = [r for r in doc.ticks if r.unit == unit]
        pre = "" if len(units) == 1 else f"{unit}/"
        out.append(document.metric(f"{pre}cores", [r.n_alloc for r in ticks], unit="cores", target=unit))
        out.append(document.metric(f"{pre}tick_cpu", [r.tick_cpu_ms for r in ticks], unit="ms", target=unit))
    return out


def summarize(records: Sequence[LogRecord], base: dict) -> dict:
    """What `tilewise elastic` prints at the end (and --json gives): ticks, core changes, firings of
    each transition, cores min/mean/max/final, mean load; `base` first (target, parameters)."""
    ticks = [r for r in records if r.is_tick]
    counts: dict[str, int] = {}
    for r in ticks:
        for tr in r.transitions:
            counts[tr] = counts.get(tr, 0) + 1
    n = [r.n_alloc for r in ticks]
    s = dict(base)
    s.update({
        "ticks": len(ticks),
        "allocations": sum(1 for r in ticks if r.action == "allocate"),
        "releases": sum(1 for r in ticks if r.action == "release"),
        "firings": dict(sorted(counts.items())),
        "cores": {"min": min(n) if n else 1, "max": max(n) if n else 1, "mean": round(sum(n) / len(n), 3) if n else 1,
                  "final": n[-1] if n else 1},
        "load_mean": round(sum(r.u for r in ticks) / len(ticks), 3) if ticks else None,
    })
    return s


def records(dicts: Sequence[dict]) -> list[LogRecord]:
    return [LogRecord.from_json(d, "elastic log record") for d in dicts]


def replay_summary(doc: LogDoc, source: str) -> dict:
    """The summary of a log read back: the same as the run printed, with the end record's figures."""
    s = summarize(doc.records, {"source": source})
    end = doc.end
    if end:
        s["stats"] = end.stats.to_json() if end.stats else None
        s["stop_reason"] = end.stop_reason
        s["problems"] = end.problems
        s["restored"] = not s["problems"]
        if end.uncontrolled:  # (logs of complete runs replay as before)
            s["uncontrolled"] = end.uncontrolled
            s["partial"] = True
    return s


# ---- text and plot ---------------------------------------------------------------------------------

def print_summary(summary: dict, out, *, show_stats: bool) -> None:
    src = summary.get("source") or ", ".join(summary.get("target", []))
    c = summary["cores"]
    out.print(f"[bold]elastic[/bold] {src}: {summary['ticks']} ticks, {summary['allocations']} allocations, "
              f"{summary['releases']} releases; cores min {c['min']} / mean {c['mean']} / max {c['max']} / "
              f"final {c['final']}")
    out.print("firings: " + (", ".join(f"{k}x{v}" for k, v in summary["firings"].items()) or "none"), markup=False)
    if summary.get("stop_reason"):
        restored = "restored" if summary.get("restored") else "restore had problems"
        kinds = summary.get("enforce") or []
        extra = ", own cgroup removed" if any(k in ("cgroup-v1", "cgroup-v2") for k in kinds) else ""
        extra += ", cpuset.cpus put back" if "cgroup-v2 in place" in kinds else ""
        what = "nothing changed (dry run)" if summary.get("dry_run") else f"original CPUs {restored}{extra}"
        out.print(f"stopped: {summary['stop_reason']}; {what}", markup=False)
    for p in summary.get("problems", []):
        out.print(f"problem: {p}", markup=False)
    if summary.get("uncontrolled"):
        out.print(f"partial: {len(summary['uncontrolled'])} process(es) of the target were not controlled "
                  "(the rest was):", markup=False)
        for line in summary["uncontrolled"]:
            out.print(f"  {line}", markup=False)
    if show_stats and summary.get("stats"):
        st = DaemonStats.from_json(summary["stats"])
        tc = st.tick_cpu_ms
        total = (f"; daemon {st.daemon_cpu_s} s CPU over {st.wall_s} s = {st.daemon_cpu_pct_of_core} % of one core"
                 if st.wall_s else " (simulated: decision only, no /proc reads or enforcement)")
        out.print(f"controller cost: {st.ticks} ticks, CPU per tick mean {tc.mean} ms, median {tc.median} ms, "
                  f"p99 {tc.p99} ms, max {tc.max} ms" + total, markup=False)


def render(doc: LogDoc, out) -> None:
    print_summary(replay_summary(doc, doc.source), out, show_stats=doc.end is not None)
    if not doc.complete and not doc.interrupted:
        out.print("note: the log has no end record: the daemon stopped before it finished (killed?)", markup=False)


def plot(doc: LogDoc, path: str | Path, title: str = "") -> Path:
    """Load (left axis, %) and allocated cores (right axis) over time, per unit, as in 002's Fig. 7."""
    ticks = doc.ticks
    if not ticks:
        raise UsageError("the log has no ticks to draw")
    plt = P.pyplot()
    units = sorted({r.unit for r in ticks})
    fig, axes = plt.subplots(len(units), 1, figsize=(9, 3.2 * len(units)), squeeze=False)
    for ax, name in zip(axes[:, 0], units):
        rs = [r for r in ticks if r.unit == name]
        ts = [r.t for r in rs]
        ax.plot(ts, [r.u for r in rs], color="tab:blue", lw=1, label="load of allocated cores (%)")
        ax.set_ylabel("CPU load (%)")
        ax.set_ylim(0, max(105, max(r.u for r in rs) * 1.05))
        ax.set_xlabel("time (s)")
        ax2 = ax.twinx()
        ax2.step(ts, [r.n_alloc for r in rs], where="post", color="tab:red", lw=1.5, label="allocated cores")
        ax2.set_ylabel("allocated cores")
        ax2.set_ylim(0, max(r.n_alloc for r in rs) + 1)
        for r in rs:
            if r.action != "none":
                ax.annotate(",".join(r.transitions), (r.t, min(r.u, 100)), fontsize=6, alpha=0.7)
        ax.set_title(f"{title} {name}".strip(), fontsize=9)
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right", fontsize=7)
    fig.tight_layout()
    try:
        return P.save(fig, Path(path), bbox_inches=None)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None


KIND = Kind(name="elastic.log", document=LogDoc, metrics=metrics, render=render, current=current,
            legacy={LEGACY: upgrade_1})
