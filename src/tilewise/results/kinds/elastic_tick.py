"""The ``elastic.tick`` result kind (`bench elastic-tick`): the elastic controller's CPU time per
tick per allocation mode, against its budget; its table, and the older ``tilewise-elastic-tick/1``
format (the same cases, written before the results model)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilewise.results import document
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind


@dataclass
class TickStats(Record):
    ticks: int = 0
    mean: float | None = None
    median: float | None = None
    p99: float | None = None
    max: float | None = None
    core_pct_at_interval: float | None = None


@dataclass
class Case(Record):
    proc: str = "synthetic"  # synthetic | real
    topology: str | None = None
    cpus: int | None = None
    threads: int | None = None
    mode: str = ""
    interval_s: float | None = None
    enforce: str | None = None
    tick_cpu_ms: TickStats = field(default_factory=TickStats)
    ticks_ms: list[float] = field(default_factory=list)  # every tick's CPU time (absent in the older format)
    daemon_cpu_pct_of_core: float | None = None  # real: the daemon's CPU time over the wall time
    budget_ms: float | None = None
    verdict: str | None = None

    @property
    def core_pct(self) -> float | None:
        return self.daemon_cpu_pct_of_core if self.proc == "real" else self.tick_cpu_ms.core_pct_at_interval


@dataclass
class TickDoc(document.Document):
    proc: str = "synthetic"
    cases: list[Case] = field(default_factory=list)


def metrics(doc: TickDoc) -> list[dict]:
    return [document.metric(f"{c.mode}/tick_cpu", c.ticks_ms or [c.tick_cpu_ms.mean], unit="ms", mode=c.mode)
            for c in doc.cases]


def render(doc: TickDoc, out) -> None:
    if not doc.cases:
        out.print("no cases measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
        T.footer(doc, out)
        return
    tab = T.table(None, ("mode", "cpus", "threads", "ticks", "mean ms", "median ms", "p99 ms", "max ms", "% core",
                         "budget"), left=("mode", "budget"))
    for r in doc.cases:
        st = r.tick_cpu_ms
        tab.add_row(r.mode, str(r.cpus), str(r.threads), str(st.ticks), T.fmt(st.mean), T.fmt(st.median),
                    T.fmt(st.p99), T.fmt(st.max), T.fmt(r.core_pct, ".2f"), f"{r.verdict} (< {r.budget_ms:g} ms)")
    out.print(tab)
    first = doc.cases[0]
    out.print(f"{first.proc} /proc, {first.topology}, enforcement {first.enforce}, tick every {first.interval_s:g} s; "
              "% core: " + ("daemon CPU time over wall time" if first.proc == "real" else "mean tick CPU over the interval"),
              markup=False)
    T.footer(doc, out)


def csv_files(doc: TickDoc) -> dict[str, str]:
    cols = ("ticks", "mean", "median", "p99", "max")
    rows = [[c.mode, c.proc, c.cpus, c.threads, *(getattr(c.tick_cpu_ms, k) for k in cols), c.core_pct, c.budget_ms,
             c.verdict] for c in doc.cases]
    return {"results.csv": T.csv_text(["mode", "proc", "cpus", "threads", "ticks", "mean_ms", "median_ms", "p99_ms",
                                       "max_ms", "core_pct", "budget_ms", "verdict"], rows)} if rows else {}


def upgrade_1(doc: dict) -> dict:
    return document.legacy_envelope(doc, "elastic.tick", {"proc": doc.get("proc")},
                                 {"proc": doc.get("proc"), "cases": doc.get("cases", [])}, complete=True)


KIND = Kind(name="elastic.tick", document=TickDoc, metrics=metrics, render=render, csv=csv_files,
            files=("results.csv",), legacy={("tilewise-elastic-tick/1", None): upgrade_1})
