"""`tilewise probe exchange`: what moving a batch from one process to another costs, per transport
(issue 30's exchange micro-benchmark; the transports the cooperating tiles swap under one flag).

tw_exchange (native/probes/tw_exchange.cpp) sends length-prefixed frames from a sender process to a
receiver process over C channels, each a pair of threads pinned to a sender CPU and a receiver CPU;
the receiver reads every byte once (a checksum it verifies). Transports:

* ``shm``: a ring buffer per channel in a memfd (anonymous shared memory: nothing in /dev/shm, so
  Docker's 64 MB /dev/shm does not limit it, and nothing is left once both processes are gone),
  bounded (``--ring`` bytes per channel, whatever the message size: memory grows with the channels
  used, never with an N x N mesh), its pages bound (mbind) to the receiver's NUMA node before they
  are touched; back-pressure when full; one copy per hop (the sender copies in, the receiver reads
  in place);
* ``unix``: a Unix stream socket pair per channel;
* ``tcp``: a loopback TCP connection per channel (TCP_NODELAY).

Per (transport, message size, channel count): throughput (GB/s over C x M messages, from the
common start to the receiver's acknowledgement of the last) and latency (a message and an 8-byte
reply, round trip, median and p99), each the median of ``--runs`` runs; next to them memcpy of the
same size on the receiver's CPU, and once memcpy of a buffer far larger than the L3 (the memory's
one-thread copy bandwidth, as `probe memory` measures memory: the reference a one-copy transport is
held to). The goals the issue sets (shm at least 3x tcp for messages of 1 MiB or more, and at least
half of that memcpy) are checked and reported, never assumed. Pure decisions here (CPUs, message counts, summaries); the process edge runs the tool.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tilewise import cpulist, launch, native
from tilewise.binding import Binding
from tilewise.errors import TilewiseError, UsageError
from tilewise.probes import matrix as pair_probes
from tilewise.results import model
from tilewise.topology.model import Topology

TRANSPORTS = ("shm", "unix", "tcp")
KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZES = (4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB)
DEFAULT_CHANNELS = (1, 2)
DEFAULT_RING = 8 * MiB  # per channel
MIN_RING, MAX_RING = 64 * KiB, 1 << 30
MAX_CHANNELS = 64
MAX_SIZE = 1 << 30
BYTES_PER_CASE = 256 * MiB  # throughput: this many bytes per channel and run (4..4096 messages)
LATENCY_BYTES = 64 * MiB  # latency: round trips of at most this many bytes in all (5..200 of them)
GOAL_TCP = 3.0  # shm at least this many times tcp, for messages of GOAL_SIZE or more
GOAL_MEMCPY = 0.5  # and at least this share of memcpy
GOAL_SIZE = MiB
REFERENCE_MIN = 256 * MiB  # the memcpy reference copies at least this, and 4x the L3: memory, not caches


@dataclass(frozen=True)
class Config:
    topology_src: str | None = None
    sender_cpus: str | None = None  # --sender-cpus (default: see choose_cpus)
    receiver_cpus: str | None = None
    transports: tuple[str, ...] = TRANSPORTS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    channels: tuple[int, ...] = DEFAULT_CHANNELS
    ring: int = DEFAULT_RING
    runs: int = 3


class Reporter:
    def message(self, text: str) -> None:
        pass

    def start(self, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


# ---- decisions ----------------------------------------------------------------------------------

def check(cfg: Config) -> None:
    """Everything about the options that can be refused before anything runs."""
    bad = [t for t in cfg.transports if t not in TRANSPORTS]
    if bad or not cfg.transports:
        raise UsageError(f"--transports {','.join(cfg.transports)!r}: unknown {', '.join(bad) or 'none given'}",
                         f"use some of {','.join(TRANSPORTS)}")
    if len(set(cfg.transports)) != len(cfg.transports):
        raise UsageError(f"--transports {','.join(cfg.transports)}: a transport is named twice")
    for s in cfg.sizes:
        if s < 8 or s % 8 or s > MAX_SIZE:
            raise UsageError(f"--sizes: {s} bytes is not a message size here",
                             f"give multiples of 8 bytes from 8 B to {MAX_SIZE // 2**30} GiB, e.g. 4KiB,1MiB,64MiB")
    if not cfg.sizes or len(set(cfg.sizes)) != len(cfg.sizes):
        raise UsageError("--sizes: give distinct sizes, e.g. 4KiB,1MiB,64MiB")
    if not cfg.channels or any(c < 1 or c > MAX_CHANNELS for c in cfg.channels) or len(set(cfg.channels)) != len(cfg.channels):
        raise UsageError(f"--channels {','.join(map(str, cfg.channels))}: give distinct counts from 1 to {MAX_CHANNELS}")
    if cfg.ring < MIN_RING or cfg.ring > MAX_RING or cfg.ring % 4096:
        raise UsageError(f"--ring {cfg.ring}: a ring is {MIN_RING // KiB} KiB to {MAX_RING // 2**30} GiB, "
                         "a multiple of 4 KiB")
    if cfg.runs < 1:
        raise UsageError("--runs must be at least 1")


def choose_cpus(t: Topology, sender_text: str | None, receiver_text: str | None,
                allowed: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """(sender CPUs, receiver CPUs, why). Default: the two ends on two NUMA nodes when the process may
    use CPUs of two (the receiving tile's node is the receiver's), else on two L3 domains, else on
    two cores; each end one CPU per core of its side (channels go round-robin over them)."""
    allowed = sorted(set(allowed) & set(t.allowed_cpus if t.allowed_cpus is not None else t.pus))
    if sender_text or receiver_text:
        if not (sender_text and receiver_text):
            raise UsageError("--sender-cpus and --receiver-cpus go together", "give both, or neither")
        s = cpulist.parse(sender_text, what="--sender-cpus")
        r = cpulist.parse(receiver_text, what="--receiver-cpus")
        outside = sorted((set(s) | set(r)) - set(allowed))
        if outside:
            raise UsageError(f"CPUs {cpulist.format(outside)} are not CPUs this process may use",
                             f"pick from {cpulist.format(allowed)}")
        return tuple(s), tuple(r), "as given"
    if len(allowed) < 2:
        raise UsageError(f"an exchange needs two CPUs, this process may use {cpulist.format(allowed) or 'none'}",
                         "run it where two CPUs are allowed (taskset, cgroup)")
    primary = [c.pus[0] for c in t.cores if c.pus[0] in allowed] or allowed

    def split(key) -> tuple[list[int], list[int]] | None:
        groups: dict = {}
        for c in primary:
            groups.setdefault(key(c), []).append(c)
        if len(groups) < 2:
            return None
        first, second = list(groups)[:2]
        return groups[first], groups[second]

    for what, key in (("two NUMA nodes", lambda c: t.core_of_cpu[c].numa_node), ("two L3 domains", lambda c: t.core_of_cpu[c].l3)):
        got = split(key)
        if got:
            return tuple(got[0]), tuple(got[1]), f"the two ends on {what}"
    if len(primary) >= 2:
        half = len(primary) // 2
        return tuple(primary[:half]), tuple(primary[half:]), "the two ends on other cores of one L3 (one NUMA node here)"
    return (allowed[0],), (allowed[1],), "the two ends on two hardware threads of one core (one core allowed)"


def messages_for(size: int) -> int:
    return max(4, min(4096, BYTES_PER_CASE // size))


def round_trips_for(size: int) -> int:
    return max(5, min(200, LATENCY_BYTES // size))


def plan_cases(cfg: Config) -> list[tuple[str, str, int, int]]:
    """(transport, mode, size, channels) in the order they run; memcpy once per size."""
    out = []
    for size in cfg.sizes:
        out.append(("memcpy", "throughput", size, 1))
        for tr in cfg.transports:
            out.append((tr, "latency", size, 1))
            out.extend((tr, "throughput", size, ch) for ch in cfg.channels)
    return out


def reference_size(t: Topology) -> int:
    return max(REFERENCE_MIN, 4 * t.total_l3_bytes)


def summarize(cases: list[dict], transports: Sequence[str], reference_gbs: float | None = None) -> dict:
    """Per size (one channel): shm against tcp and against memcpy of that size, and the goals'
    verdicts (memcpy's: against reference_gbs, the memory's copy bandwidth, when measured)."""
    by = {(c["transport"], c["mode"], c["size"], c["channels"]): c for c in cases}
    rows, verdicts = [], []
    for size in sorted({c["size"] for c in cases}):
        shm, tcp = by.get(("shm", "throughput", size, 1)), by.get(("tcp", "throughput", size, 1))
        mem = by.get(("memcpy", "throughput", size, 1))
        row = {"size": size, "shm_gbs": shm and shm["gbs"], "tcp_gbs": tcp and tcp["gbs"], "memcpy_gbs": mem and mem["gbs"]}
        row["shm_over_tcp"] = round(shm["gbs"] / tcp["gbs"], 3) if shm and tcp and tcp["gbs"] else None
        row["shm_over_memcpy"] = round(shm["gbs"] / mem["gbs"], 3) if shm and mem and mem["gbs"] else None
        row["shm_over_reference"] = round(shm["gbs"] / reference_gbs, 3) if shm and reference_gbs else None
        rows.append(row)
    big = [r for r in rows if r["size"] >= GOAL_SIZE]
    if "shm" in transports and "tcp" in transports and big:
        worst = min((r for r in big if r["shm_over_tcp"] is not None), key=lambda r: r["shm_over_tcp"], default=None)
        if worst is not None:
            ok = worst["shm_over_tcp"] >= GOAL_TCP
            verdicts.append({"goal": f"shm >= {GOAL_TCP:g}x tcp for messages of 1 MiB or more", "met": ok,
                             "worst": f"{worst['shm_over_tcp']:.2f}x at {worst['size']} B"})
    if "shm" in transports and big:
        worst = min((r for r in big if r["shm_over_reference"] is not None), key=lambda r: r["shm_over_reference"],
                    default=None)
        if worst is not None:
            verdicts.append({"goal": f"shm >= {GOAL_MEMCPY:g} of memcpy for messages of 1 MiB or more",
                             "met": worst["shm_over_reference"] >= GOAL_MEMCPY,
                             "worst": f"{worst['shm_over_reference']:.2f} at {worst['size']} B"})
    return {"by_size": rows, "goals": verdicts}


def median_case(runs: list[dict]) -> dict:
    """The case's figures: the median over its runs (each run kept)."""
    out = dict(runs[0])
    for key in ("gbs", "seconds", "latency_us_median", "latency_us_p99"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = round(statistics.median(vals), 4)
    out["runs"] = [{k: r.get(k) for k in ("gbs", "seconds", "latency_us_median", "latency_us_p99") if k in r} for r in runs]
    return out


# ---- the process edge --------------------------------------------------------------------------

def run_tool(transport: str, mode: str, size: int, channels: int, *, ring: int, ring_node: int,
             sender: Sequence[int], receiver: Sequence[int], timeout_s: float = 300) -> dict:
    messages = round_trips_for(size) if mode == "latency" else messages_for(size)
    argv = [native.binary("tw_exchange"), "--transport", transport, "--mode", mode, "--size", str(size),
            "--channels", str(channels), "--messages", str(messages), "--ring", str(ring),
            "--ring-node", str(ring_node), "--sender-cpus", ",".join(map(str, sender)),
            "--receiver-cpus", ",".join(map(str, receiver))]
    try:
        cp = launch.run(argv, Binding(tuple(sorted(set(sender) | set(receiver)))), timeout=timeout_s,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        raise TilewiseError(f"tw_exchange ({transport}, {mode}, {size} B) did not finish within {timeout_s:.0f} s",
                            "use smaller --sizes or fewer --channels") from None
    if cp.returncode != 0:
        err = (cp.stderr or "").strip().splitlines()
        raise TilewiseError(f"tw_exchange ({transport}, {mode}, {size} B x {channels}) failed: "
                            + (err[-1].removeprefix("error: ") if err else f"exit status {cp.returncode}"))
    try:
        doc = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TilewiseError(f"tw_exchange printed no result: {cp.stdout[-200:]!r}") from None
    if doc.get("checksum_ok") is False:
        raise TilewiseError(f"tw_exchange ({transport}): the receiver's checksum did not match what was sent")
    return doc


def run(cfg: Config, reporter: Reporter | None = None, *, writer: Callable[[dict], None] | None = None) -> dict:
    """Measure every case; returns the probe.exchange document (written through `writer` after
    each case, so an interruption loses nothing)."""
    check(cfg)
    rep = reporter or Reporter()
    t = pair_probes.live_topology(cfg.topology_src)
    sender, receiver, why = choose_cpus(t, cfg.sender_cpus, cfg.receiver_cpus, sorted(os.sched_getaffinity(0)))
    ring_node = t.core_of_cpu[receiver[0]].numa_node
    doc = model.new("probe.exchange", topo=t, params=asdict(cfg) | {"transports": list(cfg.transports),
                                                                     "sizes": list(cfg.sizes), "channels": list(cfg.channels)})
    doc.update({"probe": "exchange", "sender_cpus": list(sender), "receiver_cpus": list(receiver), "cpus_rule": why,
                "ring_bytes": cfg.ring, "ring_node": ring_node, "cases": [], "summary_by_size": [], "goals": [],
                "notes": []})
    if len(t.numa_nodes) == 1:
        doc["notes"].append("one NUMA node here: the ring's pages are on the receiver's node by construction; "
                            "what placing them on the receiving tile's node saves needs a multi-node machine (not measured)")
    plan = plan_cases(cfg)
    ref_size = reference_size(t)
    rep.message(f"exchange: sender CPUs {cpulist.format(sender)}, receiver CPUs {cpulist.format(receiver)} ({why}); "
                f"{len(plan)} cases x {cfg.runs} run(s); shm ring {cfg.ring // KiB} KiB per channel on node {ring_node}")
    write = writer or (lambda d: None)
    rep.start(len(plan))
    try:
        for tr, mode, size, ch in plan:
            runs = [run_tool(tr, mode, size, ch, ring=cfg.ring, ring_node=ring_node, sender=sender, receiver=receiver)
                    for _ in range(cfg.runs)]
            doc["cases"].append(median_case(runs))
            write(doc)
            rep.advance()
        if "shm" in cfg.transports:
            runs = [run_tool("memcpy", "throughput", ref_size, 1, ring=cfg.ring, ring_node=ring_node, sender=sender,
                             receiver=receiver) for _ in range(cfg.runs)]
            doc["memcpy_reference"] = median_case(runs) | {
                "why": f"{ref_size // MiB} MiB, far larger than the {t.total_l3_bytes // MiB} MiB of L3: the memory's "
                       "copy bandwidth for one thread on the receiver's CPU and node"}
            write(doc)
    except BaseException as e:
        model.stopped(doc, e)
        write(doc)
        raise
    s = summarize(doc["cases"], cfg.transports, (doc.get("memcpy_reference") or {}).get("gbs"))
    doc["summary_by_size"], doc["goals"] = s["by_size"], s["goals"]
    model.finish(doc, complete=True)
    write(doc)
    return doc
