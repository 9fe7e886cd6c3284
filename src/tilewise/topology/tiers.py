"""Memory tiers from figures: which initiators a memory node is nearest to, what tier it is, and
the weights of a weighted interleave. Pure functions over a Topology and the figures it comes with.

Figures come from two sources, in this order of trust:

* measured: `tilewise probe memory` per (initiator node, target node): idle latency (ns) and read
  bandwidth (GB/s). A measurement taken under an emulator (QEMU/TCG) or otherwise marked
  untrusted times the emulator, not the memory: it is skipped, and the decision says so;
* firmware: the ACPI HMAT figures Linux shows (``topology.firmware``), which the kernel keeps only
  for the best initiators of each node (access1: CPU initiators).

and, for which-node-is-nearest only, the SLIT distance. Every decision says which it used.

Tiers, as tilewise names them for a node:
  near   a node with CPUs: the local memory of its own CPUs
  far    CPU-less and slower than the local memory of its nearest CPUs (CXL, PMem as memory)
  fast   CPU-less with more read bandwidth than that local memory (HBM in flat mode)
  equal  CPU-less and as fast as that local memory, within the margins below
The kernel's own tier (memory_tierN, Linux 6.1+) is reported beside it, never replaced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology.firmware import Firmware, from_memattrs
from tilewise.topology.model import Topology

# A path is "the same" as another within these margins (measurement noise, firmware rounding).
LATENCY_MARGIN = 1.10  # a CPU-less node more than 10 % slower to load from than local memory is far
BANDWIDTH_FAST = 1.20  # 20 % more read bandwidth than local memory: fast (HBM-like)
BANDWIDTH_SLOW = 0.90  # 10 % less: far
NEAREST_TIE = 1.02  # initiators within 2 % of the best latency are all nearest
MAX_WEIGHT = 255  # the kernel's weighted-interleave weights are 1..255
WEIGHT_TOLERANCE = 0.05  # integer weights within 5 % of the bandwidth ratios

# measured[(initiator node, target node)] = {"latency_ns": float | None, "read_bw_gbs": float | None,
#                                            "trusted": bool, "why_untrusted": str | None}
Measured = Mapping[tuple[int, int], Mapping]

# measured figures as memattrs (custom hwloc attributes, so `lstopo --memattrs` shows them too):
# ns and MB/s (10^6 bytes/s), and whether the measurement timed real memory (1) or an emulator (0)
MEASURED_LATENCY = "tilewise:MeasuredLatency"
MEASURED_READ_BW = "tilewise:MeasuredReadBandwidth"
MEASURED_TRUSTED = "tilewise:MeasuredTrusted"
EMULATED = "measured under an emulator (QEMU TCG): its times are not the memory's"


@dataclass(frozen=True)
class Figures:
    """What tier decisions are made on: measured figures and the firmware's (with the kernel's tiers)."""

    measured: Measured = field(default_factory=dict)
    firmware: Firmware | None = None


def _node_cpus(t: Topology) -> dict[int, tuple[int, ...]]:
    return {n.id: n.cpus for n in t.numa_nodes}


def figures(t: Topology) -> Figures:
    """The figures a topology carries in its memattrs: the firmware's (HMAT, kernel tiers; from sysfs or
    an hwloc XML file) and tilewise's measured ones (`topo --measure-memory`)."""
    node_cpus = _node_cpus(t)
    fw = from_memattrs(t.memattrs, node_cpus, t.source) if t.memattrs else None
    if fw is not None and not fw.accesses and not fw.tiers:
        fw = None
    trusted = {v["target_node"]: bool(v["value"]) for v in (t.memattrs.get(MEASURED_TRUSTED) or {}).get("values", [])}
    measured: dict[tuple[int, int], dict] = {}
    for name, key, scale in ((MEASURED_LATENCY, "latency_ns", 1.0), (MEASURED_READ_BW, "read_bw_gbs", 1e-3)):
        for v in (t.memattrs.get(name) or {}).get("values", []):
            cpus = set(v.get("initiator_cpus") or ())
            node = next((n for n, cs in node_cpus.items() if cs and set(cs) == cpus), None)
            if node is None:
                continue
            ok = trusted.get(v["target_node"], True)
            rec = measured.setdefault((node, v["target_node"]), {"trusted": ok, "why_untrusted": None if ok else EMULATED})
            rec[key] = v["value"] * scale
    return Figures(measured, fw)


def measured_memattrs(t: Topology, measured: Measured) -> dict:
    """Measured figures (per initiator node, target node) as memattrs to add to t.memattrs."""
    out: dict = {}
    cpus = _node_cpus(t)
    for (i, target), rec in sorted(measured.items()):
        for name, key, scale, flags in ((MEASURED_LATENCY, "latency_ns", 1.0, 6), (MEASURED_READ_BW, "read_bw_gbs", 1e3, 5)):
            v = rec.get(key)
            if v is not None and v > 0:
                out.setdefault(name, {"flags": flags, "values": []})["values"].append(
                    {"target_node": target, "initiator_cpus": list(cpus[i]), "value": max(1, round(v * scale))})
        trusted = out.setdefault(MEASURED_TRUSTED, {"flags": 1, "values": []})["values"]
        if not any(x["target_node"] == target for x in trusted):
            trusted.append({"target_node": target, "initiator_cpus": None, "value": int(bool(rec.get("trusted", True)))})
    return out

SRC_MEASURED = "measured"
SRC_HMAT = "firmware (HMAT)"
SRC_SLIT = "SLIT distance"


@dataclass(frozen=True)
class Nearest:
    """The initiators (nodes with CPUs) nearest to a memory node, and how that was decided."""

    target: int
    initiators: tuple[int, ...]
    source: str  # SRC_MEASURED (latency) | SRC_HMAT (access1 latency) | SRC_SLIT
    value: float  # ns, or the SLIT distance
    reason: str

    def to_json(self) -> dict:
        return {"target": self.target, "initiators": list(self.initiators), "source": self.source,
                "value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class NodeTier:
    node: int
    tier: str  # near | far | fast | equal
    kernel_tier: int | None  # memory_tierN, None where the kernel has no tiers
    nearest: Nearest | None  # for CPU-less nodes
    latency_ratio: float | None  # this node's latency / the nearest initiator's local latency
    bandwidth_ratio: float | None  # read bandwidth likewise
    basis: str  # what the tier was decided on
    reason: str

    def to_json(self) -> dict:
        return {"node": self.node, "tier": self.tier, "kernel_tier": self.kernel_tier,
                "nearest": self.nearest.to_json() if self.nearest else None, "latency_ratio": self.latency_ratio,
                "bandwidth_ratio": self.bandwidth_ratio, "basis": self.basis, "reason": self.reason}


@dataclass(frozen=True)
class Weights:
    weights: dict[int, int]  # node -> weight (1..255)
    source: str  # SRC_MEASURED | SRC_HMAT | "given"
    bandwidths: dict[int, float]  # the figures the weights came from (GB/s measured, MB/s HMAT)
    reason: str

    def text(self) -> str:
        return ":".join(str(self.weights[n]) for n in sorted(self.weights))

    def to_json(self) -> dict:
        return {"weights": {str(k): v for k, v in sorted(self.weights.items())}, "source": self.source,
                "bandwidths": {str(k): v for k, v in sorted(self.bandwidths.items())}, "reason": self.reason}


def _cpu_nodes(t: Topology) -> list[int]:
    return [n.id for n in t.numa_nodes if n.cpus]


def _trusted(measured: Measured | None, i: int, target: int, key: str) -> float | None:
    rec = (measured or {}).get((i, target))
    if not rec or not rec.get("trusted", True):
        return None
    v = rec.get(key)
    return float(v) if v is not None and v == v and v > 0 else None


def _untrusted_note(measured: Measured | None) -> str:
    why = {rec.get("why_untrusted") for rec in (measured or {}).values() if not rec.get("trusted", True)}
    why.discard(None)
    return f" (measured figures not used: {'; '.join(sorted(why))})" if why else ""


def nearest_initiators(t: Topology, target: int, *, measured: Measured | None = None,
                       firmware: Firmware | None = None) -> Nearest:
    """The nodes with CPUs nearest to node `target`: by measured idle latency, else by the firmware's
    access1 (CPU initiators) figures, else by SLIT distance; the Nearest says which."""
    if target not in t.node_by_id:
        raise UsageError(f"node {target} is not in the topology ({t.source})", "see `tilewise topo`")
    cpu_nodes = _cpu_nodes(t)
    if not cpu_nodes:
        raise UsageError("the topology has no node with CPUs")
    lat = {i: v for i in cpu_nodes if (v := _trusted(measured, i, target, "latency_ns")) is not None}
    if lat:
        best = min(lat.values())
        near = tuple(sorted(i for i, v in lat.items() if v <= best * NEAREST_TIE))
        missing = [i for i in cpu_nodes if i not in lat]
        return Nearest(target, near, SRC_MEASURED, best,
                       f"lowest measured idle latency to node {target}: {best:.1f} ns from node(s) {cpulist.format(near)}"
                       + (f" (not measured from node(s) {cpulist.format(missing)})" if missing else ""))
    note = _untrusted_note(measured)
    if firmware is not None:
        for acc in ("access1", "access0"):
            a = firmware.access(target, acc)
            if a is None:
                continue
            inits = tuple(i for i in a.initiators if i in cpu_nodes)
            value = a.read_latency or a.write_latency
            if inits and value:
                return Nearest(target, inits, SRC_HMAT, float(value),
                               f"the firmware's best CPU initiators of node {target} ({acc}): node(s) "
                               f"{cpulist.format(inits)}, read latency {value} ns{note}")
    d = {i: t.distance(i, target) for i in cpu_nodes}
    best = min(d.values())
    near = tuple(sorted(i for i, v in d.items() if v == best))
    return Nearest(target, near, SRC_SLIT, float(best),
                   f"smallest SLIT distance to node {target}: {best} from node(s) {cpulist.format(near)} "
                   f"(no measured or firmware latency{note})")


def _pair(measured, firmware, i: int, target: int) -> tuple[str, float | None, float | None] | None:
    """(source, latency, read bandwidth) of the path i -> target from the most trusted source that has
    both ends of the comparison (the same source is used for i -> i)."""
    ml, mb = _trusted(measured, i, target, "latency_ns"), _trusted(measured, i, target, "read_bw_gbs")
    ll, lb = _trusted(measured, i, i, "latency_ns"), _trusted(measured, i, i, "read_bw_gbs")
    if (ml and ll) or (mb and lb):
        return SRC_MEASURED, (ml / ll if ml and ll else None), (mb / lb if mb and lb else None)
    if firmware is not None:
        fl, fb = firmware.figure(i, target, "read_latency"), firmware.figure(i, target, "read_bandwidth")
        gl, gb = firmware.figure(i, i, "read_latency"), firmware.figure(i, i, "read_bandwidth")
        if (fl and gl) or (fb and gb):
            return SRC_HMAT, (fl / gl if fl and gl else None), (fb / gb if fb and gb else None)
    return None


def classify(t: Topology, *, measured: Measured | None = None, firmware: Firmware | None = None) -> list[NodeTier]:
    """Every node's tier (see the module's docstring), with the kernel's tier beside it."""
    out = []
    multi_kernel_tiers = firmware is not None and len(firmware.tiers) > 1
    for n in t.numa_nodes:
        ktier = firmware.tier_of(n.id) if firmware is not None else None
        if n.cpus:
            out.append(NodeTier(n.id, "near", ktier, None, None, None, "it has CPUs",
                                f"node {n.id} has CPUs {cpulist.format(n.cpus)}: their local memory"))
            continue
        if n.restricted_away:  # its CPUs exist but are not allowed here: ordinary memory, never a tier
            out.append(NodeTier(n.id, "near", ktier, None, None, None, "its CPUs are not allowed here",
                                f"node {n.id}'s CPUs {cpulist.format(n.hidden_cpus)} are not allowed here (a cgroup "
                                "or a restricted export): their local memory, not a far tier"))
            continue
        near = nearest_initiators(t, n.id, measured=measured, firmware=firmware)
        i = near.initiators[0]
        got = _pair(measured, firmware, i, n.id)
        kernel = ""
        if multi_kernel_tiers and ktier is not None:
            ltier = firmware.tier_of(i)
            if ltier is not None and ltier != ktier:
                kernel = f"; the kernel puts it in tier {ktier}, node {i} in tier {ltier}"
        if got is None:
            dist, local = t.distance(i, n.id), t.distance(i, i)
            tier = "far" if dist > local else "equal"
            out.append(NodeTier(n.id, tier, ktier, near, None, None, SRC_SLIT,
                                f"no latency or bandwidth figures for node {n.id}{_untrusted_note(measured)}: "
                                f"SLIT distance {dist} from node {i} against {local} locally, technology unknown"
                                + kernel))
            continue
        src, lr, br = got
        if br is not None and br >= BANDWIDTH_FAST:
            tier, why = "fast", f"{br:.2f}x the read bandwidth of node {i}'s local memory"
        elif (lr is not None and lr > LATENCY_MARGIN) or (br is not None and br < BANDWIDTH_SLOW):
            parts = ([f"{lr:.2f}x the latency"] if lr is not None else []) + \
                    ([f"{br:.2f}x the read bandwidth"] if br is not None else [])
            tier, why = "far", " and ".join(parts) + f" of node {i}'s local memory"
        else:
            tier, why = "equal", f"within {LATENCY_MARGIN - 1:.0%} of node {i}'s local memory"
        out.append(NodeTier(n.id, tier, ktier, near, lr, br, src,
                            f"CPU-less, nearest to node(s) {cpulist.format(near.initiators)} ({near.source}); "
                            f"{src}: {why}" + kernel))
    return out


def far_nodes(t: Topology, initiator: int, *, measured: Measured | None = None,
              firmware: Firmware | None = None) -> list[int]:
    """The far-tier nodes nearest to `initiator` (the CPU-less far nodes whose nearest initiators include it)."""
    return [nt.node for nt in classify(t, measured=measured, firmware=firmware)
            if nt.tier == "far" and nt.nearest and initiator in nt.nearest.initiators]


# ---- weighted interleave ---------------------------------------------------------------------

def integer_weights(bandwidth: Mapping[int, float], *, tolerance: float = WEIGHT_TOLERANCE,
                    max_weight: int = MAX_WEIGHT) -> dict[int, int]:
    """Small integer weights proportional to the bandwidths: the smallest scale at which every weight
    is within `tolerance` of its node's bandwidth ratio (e.g. 20000 and 8000 MB/s -> 5 and 2), else
    the closest within max_weight. Bandwidths must be positive."""
    if not bandwidth:
        raise UsageError("no nodes to weight")
    bad = [n for n, b in bandwidth.items() if not (b > 0 and math.isfinite(b))]
    if bad:
        raise UsageError(f"node(s) {cpulist.format(bad)} have no positive bandwidth to weight by")
    low = min(bandwidth.values())
    ratio = {n: b / low for n, b in bandwidth.items()}
    top = max(ratio.values())
    best: tuple[float, dict[int, int]] | None = None
    for scale in range(1, max_weight + 1):
        if top * scale > max_weight + 0.5:
            break
        w = {n: max(1, min(max_weight, round(r * scale))) for n, r in ratio.items()}
        err = max(abs(w[n] / scale - r) / r for n, r in ratio.items())
        if best is None or err < best[0] - 1e-12:
            best = (err, w)
        if err <= tolerance:
            break
    if best is None:  # even scale 1 passes the kernel's largest weight: cap it there
        best = (0.0, {n: max(1, min(max_weight, round(r))) for n, r in ratio.items()})
    g = math.gcd(*best[1].values())
    return {n: v // g for n, v in sorted(best[1].items())}


def auto_weights(t: Topology, initiator: int, nodes: Sequence[int], *, measured: Measured | None = None,
                 firmware: Firmware | None = None) -> Weights:
    """Weights for interleaving over `nodes` from CPUs of `initiator`, proportional to each node's
    read bandwidth from there: measured where every path was measured and trusted, else the
    firmware's (where the kernel kept every path), else an error saying what to do."""
    nodes = list(dict.fromkeys(nodes))
    if len(nodes) < 2:
        raise UsageError("weighted interleave needs at least two nodes", "give a near and a far node")
    bw = {n: _trusted(measured, initiator, n, "read_bw_gbs") for n in nodes}
    if all(v is not None for v in bw.values()):
        w = integer_weights(bw)  # type: ignore[arg-type]
        return Weights(w, SRC_MEASURED, bw, "from the measured read bandwidth of node " + str(initiator) + "'s CPUs: "  # type: ignore[arg-type]
                       + ", ".join(f"node {n} {v:.2f} GB/s" for n, v in bw.items()))
    note = _untrusted_note(measured)
    fw = {n: firmware.figure(initiator, n, "read_bandwidth") if firmware is not None else None for n in nodes}
    if all(fw.values()):
        w = integer_weights({n: float(v) for n, v in fw.items()})  # type: ignore[arg-type]
        return Weights(w, SRC_HMAT, {n: float(v) for n, v in fw.items()},  # type: ignore[arg-type]
                       "from the firmware's read bandwidth (HMAT access1) from node " + str(initiator) + ": "
                       + ", ".join(f"node {n} {v} MB/s" for n, v in fw.items()) + note)
    missing_m = [n for n, v in bw.items() if v is None]
    missing_f = [n for n, v in fw.items() if not v]
    raise UsageError(
        f"no read bandwidth from node {initiator} to node(s) {cpulist.format(missing_m)} was measured, and the "
        f"firmware gives none to node(s) {cpulist.format(missing_f)} from there{note}",
        "run `tilewise probe memory` on this machine, or give the weights yourself (--weights N:M)")


def parse_weights(text: str, nodes: Sequence[int]) -> dict[int, int]:
    """--weights N:M[:...]: one whole weight 1..255 per node of `nodes`, in that order."""
    parts = [p.strip() for p in str(text).split(":")]
    nodes = list(nodes)
    if len(parts) != len(nodes):
        raise UsageError(f"--weights {text}: {len(parts)} weight(s) for {len(nodes)} node(s) ({cpulist.format(nodes)})",
                         f"give one weight per node, e.g. --weights {':'.join(['1'] * len(nodes))}")
    out = {}
    for n, p in zip(nodes, parts):
        if not p.lstrip("-").isdigit():
            raise UsageError(f"--weights {text}: {p!r} is not a whole number", "weights are 1..255, e.g. 3:1")
        v = int(p)
        if not 1 <= v <= MAX_WEIGHT:
            raise UsageError(f"--weights {text}: weight {v} for node {n} is out of range",
                             f"weights are 1..{MAX_WEIGHT} (0 or less would never place a page there)")
        out[n] = v
    return out


# ---- far memory of a plan's instances -----------------------------------------------------------------

@dataclass(frozen=True)
class FarAssignment:
    """Which far-tier nodes an instance may spill to (near-then-far, weighted interleave), and why."""

    instance: int
    near: tuple[int, ...]  # the instance's own nodes (its CPUs' local memory)
    far: tuple[int, ...]
    reason: str

    def to_json(self) -> dict:
        return {"instance": self.instance, "near": list(self.near), "far": list(self.far), "reason": self.reason}


def assign_far(t: Topology, instances: Mapping[int, Sequence[int]], *, measured: Measured | None = None,
               firmware: Firmware | None = None) -> tuple[list[FarAssignment], list[str]]:
    """Every instance's far tier: each far node goes to the instances on its nearest initiator node(s)
    (nearest by measured latency, else firmware, else SLIT), shared when several instances run there.
    `instances` maps an instance id to the nodes holding its CPUs. Returns the assignments (one per
    instance, in id order) and notes (far nodes no instance is near to)."""
    classes = classify(t, measured=measured, firmware=firmware)
    far = [c for c in classes if c.tier == "far" and c.nearest is not None]
    users: dict[int, list[int]] = {f.node: [i for i, nodes in instances.items() if set(nodes) & set(f.nearest.initiators)]
                                   for f in far}
    notes = [f"far node {f.node} is nearest to node(s) {cpulist.format(f.nearest.initiators)} ({f.nearest.source}), "
             "where no instance runs: no instance spills to it" for f in far if not users[f.node]]
    out = []
    for iid in sorted(instances):
        near = tuple(sorted(instances[iid]))
        mine = [f for f in far if iid in users[f.node]]
        if not far:
            why = "the machine has no far-tier memory (no CPU-less node slower than local memory)"
        elif not mine:
            why = f"no far-tier node is nearest to node(s) {cpulist.format(near)}"
        else:
            parts = []
            for f in mine:
                others = [i for i in users[f.node] if i != iid]
                share = f"shared with instance(s) {', '.join(map(str, others))}" if others else "this instance's alone"
                parts.append(f"node {f.node} (nearest to node(s) {cpulist.format(f.nearest.initiators)} by "
                             f"{f.nearest.source}; {share})")
            why = "far tier: " + "; ".join(parts)
        out.append(FarAssignment(iid, near, tuple(f.node for f in mine), why))
    return out, notes
