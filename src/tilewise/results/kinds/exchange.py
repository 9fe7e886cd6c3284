"""The ``probe.exchange`` result kind (`probe exchange`): throughput and latency of moving a
message from one process to another over shared memory, a Unix socket and loopback TCP, against
message size and channel count, next to memcpy; its tables, CSV and plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist
from tilewise.results import document
from tilewise.results import plots as P
from tilewise.results import tables as T
from tilewise.results.body import Record
from tilewise.results.kinds import Kind

ORDER = ("shm", "unix", "tcp")


@dataclass
class Case(Record):
    transport: str = ""
    mode: str = "throughput"  # throughput | latency
    size: int = 0
    channels: int = 1
    messages: int = 0
    seconds: float | None = None
    gbs: float | None = None
    latency_us_median: float | None = None
    latency_us_p99: float | None = None
    ring_bytes: int | None = None
    ring_node: int | None = None
    ring_pages: dict[str, int] = field(default_factory=dict)  # node -> pages of the ring (-2: never touched)
    runs: list[dict] = field(default_factory=list)


@dataclass
class Goal(Record):
    goal: str = ""
    met: bool = False
    worst: str = ""


@dataclass
class ExchangeDoc(document.Document):
    sender_cpus: list[int] = field(default_factory=list)
    receiver_cpus: list[int] = field(default_factory=list)
    cpus_rule: str = ""
    ring_bytes: int = 0
    ring_node: int | None = None
    cases: list[Case] = field(default_factory=list)
    summary_by_size: list[dict] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    memcpy_reference: Case | None = None  # memcpy of a buffer far larger than the L3 (the goal's reference)


def _transports(doc: ExchangeDoc) -> list[str]:
    have = {c.transport for c in doc.cases}
    return [t for t in ORDER if t in have]


def metrics(doc: ExchangeDoc) -> list[dict]:
    out = []
    for c in doc.cases:
        if c.mode == "throughput" and c.gbs is not None:
            vals = [r["gbs"] for r in c.runs if r.get("gbs") is not None] or [c.gbs]
            out.append(document.metric(f"{c.transport}/{c.size}/x{c.channels}/throughput", vals, unit="GB/s",
                                       better="higher", transport=c.transport, size=c.size, channels=c.channels))
        elif c.mode == "latency" and c.latency_us_median is not None:
            vals = [r["latency_us_median"] for r in c.runs if r.get("latency_us_median") is not None]
            out.append(document.metric(f"{c.transport}/{c.size}/latency", vals or [c.latency_us_median], unit="us",
                                       transport=c.transport, size=c.size))
    return out


def _find(doc: ExchangeDoc, transport: str, mode: str, size: int, channels: int = 1) -> Case | None:
    return next((c for c in doc.cases if (c.transport, c.mode, c.size, c.channels) == (transport, mode, size, channels)), None)


def render(doc: ExchangeDoc, out) -> None:
    trs = _transports(doc)
    out.print(f"exchange: sender CPUs {cpulist.format(doc.sender_cpus)} -> receiver CPUs "
              f"{cpulist.format(doc.receiver_cpus)} ({doc.cpus_rule}); shm ring {T.binary_bytes(doc.ring_bytes)} "
              f"per channel, bound to node {doc.ring_node}", markup=False)
    if not doc.cases:
        out.print("no cases measured" + (" (interrupted)" if doc.interrupted else ""), markup=False)
        T.footer(doc, out)
        return
    sizes = sorted({c.size for c in doc.cases})
    chans = sorted({c.channels for c in doc.cases if c.mode == "throughput" and c.transport != "memcpy"})
    tt = T.table("throughput, GB/s (median of runs)", ("message", "channels", *trs, "memcpy of it", "shm/tcp",
                                                          "shm/memcpy of it"))
    for s in sizes:
        mem = _find(doc, "memcpy", "throughput", s)
        for ch in chans:
            cells = {t: _find(doc, t, "throughput", s, ch) for t in trs}
            shm, tcp = cells.get("shm"), cells.get("tcp")
            ratio = f"{shm.gbs / tcp.gbs:.2f}x" if shm and tcp and tcp.gbs else "-"
            share = f"{shm.gbs / mem.gbs:.2f}" if shm and mem and mem.gbs and ch == 1 else "-"
            tt.add_row(T.binary_bytes(s), str(ch), *(f"{cells[t].gbs:.2f}" if cells[t] else "-" for t in trs),
                       f"{mem.gbs:.2f}" if mem and ch == 1 else "", ratio, share)
    out.print(tt)
    lt = T.table("latency: a message and an 8-byte reply, round trip in us (median / p99)", ("message", *trs))
    for s in sizes:
        cells = [_find(doc, t, "latency", s) for t in trs]
        lt.add_row(T.binary_bytes(s), *(f"{c.latency_us_median:.1f} / {c.latency_us_p99:.1f}" if c else "-" for c in cells))
    out.print(lt)
    touched = [c for c in doc.cases if c.transport == "shm" and c.ring_pages]
    shm = max(touched, key=lambda c: sum(n for k, n in c.ring_pages.items() if int(k) >= 0), default=None)
    if shm is not None:
        where = ", ".join(f"{n} on node {k}" if k not in ("-2", "-14") else f"{n} never touched"
                          for k, n in sorted(shm.ring_pages.items()))
        out.print(f"shm ring pages ({T.binary_bytes(shm.ring_bytes or 0)} per channel, bound to node {shm.ring_node}): "
                  f"{where}", markup=False)
    ref = doc.memcpy_reference
    if ref is not None and ref.gbs is not None:
        out.print(f"memcpy reference: {ref.gbs:.2f} GB/s ({ref.extra.get('why', T.binary_bytes(ref.size))})", markup=False)
    for g in doc.goals:
        out.print(f"goal: {g.goal}: {'met' if g.met else 'NOT met'} (worst {g.worst})", markup=False)
    for n in doc.notes:
        out.print(f"note: {n}", markup=False)
    T.footer(doc, out)


def csv_files(doc: ExchangeDoc) -> dict[str, str]:
    if not doc.cases:
        return {}
    header = ["transport", "mode", "size_bytes", "channels", "messages", "gbs", "latency_us_median", "latency_us_p99"]
    rows = [[c.transport, c.mode, c.size, c.channels, c.messages, "" if c.gbs is None else c.gbs,
             "" if c.latency_us_median is None else c.latency_us_median,
             "" if c.latency_us_p99 is None else c.latency_us_p99] for c in doc.cases]
    return {"exchange.csv": T.csv_text(header, rows)}


def plots(doc: ExchangeDoc, out_dir: Path) -> list[Path]:
    if not doc.complete or not doc.cases:
        return []
    return [plot(doc, out_dir / "exchange.png")]


COLORS = {"shm": "tab:blue", "unix": "tab:orange", "tcp": "tab:green", "memcpy": "tab:gray"}


def plot(doc: ExchangeDoc, path: Path) -> Path:
    """Throughput (one channel solid, the most channels dashed, memcpy of each size dotted, the memory
    reference as a line) and round-trip latency over the message size, one colour per transport."""
    plt = P.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    most = max((c.channels for c in doc.cases if c.mode == "throughput" and c.transport != "memcpy"), default=1)
    for t in [*_transports(doc), "memcpy"]:
        for ch in (sorted({1, most}) if t != "memcpy" else [1]):
            cs = sorted((c for c in doc.cases if c.transport == t and c.mode == "throughput" and c.channels == ch),
                        key=lambda c: c.size)
            if cs:
                style = ":" if t == "memcpy" else ("--" if ch > 1 else "-")
                a.plot([c.size for c in cs], [c.gbs for c in cs], marker="o", linestyle=style, color=COLORS[t],
                       label="memcpy of the message" if t == "memcpy" else f"{t}, {ch} channel{'s' if ch > 1 else ''}")
        ls = sorted((c for c in doc.cases if c.transport == t and c.mode == "latency"), key=lambda c: c.size)
        if ls:
            b.plot([c.size for c in ls], [c.latency_us_median for c in ls], marker="o", color=COLORS[t], label=t)
    ref = doc.memcpy_reference
    if ref is not None and ref.gbs:
        a.axhline(ref.gbs, color="black", linewidth=1, label=f"memcpy of memory ({T.binary_bytes(ref.size)})")
    for ax, title, ylabel in ((a, "throughput", "GB/s (median of runs)"), (b, "round trip: message + 8-byte reply", "us (median)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return P.save(fig, path)


KIND = Kind(name="probe.exchange", document=ExchangeDoc, metrics=metrics, render=render, csv=csv_files, plots=plots,
            files=("exchange.csv", "exchange.png"))
