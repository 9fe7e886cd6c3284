"""Deployment planner: a policy over a topology -> bound instances. Pure functions only.

Policies keep the studies' names (papers 000 and 001):
  wim         one instance with every core; first-touch memory
  win         one instance per NUMA node with CPUs; membind to that node
  wicp        one instance per L3 domain (chiplet); membind to the node holding it  ("WICP_Local")
  wicp-mixed  as many instances as L3 domains, same core count each, cores spread evenly over the
              L3 domains of a node (uses all L3 capacity, pays cross-chiplet traffic); interleave
  wic         one instance per physical core (+ its SMT siblings with --smt); local memory
  spread      as win (same count, same size) but each instance's cores spread over the nodes (SPMWIN)
  n           --instances K: K instances of ceil(C/K) cores, packed inside one L3, then one node
  gpu         one tile per GPU: the cores of the GPU's NUMA node (shared fairly by the GPUs on one
              node), membind to that node; the tile's process sees only its GPU
  auto        chosen by the documented rules below; every decision carries its reasons
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology import pci, tiers
from tilewise.topology.model import Core, Topology

POLICIES = ("wim", "win", "wicp", "wicp-mixed", "wic", "spread", "n", "gpu", "auto")
MEM_POLICIES = ("first-touch", "interleave", "membind", "preferred", "local", "weighted-interleave", "near",
                "near-then-far", "preferred-many")
# memory policies that place by tier (thesis 004, ch. 4): near = membind to the instance's own nodes;
# near-then-far = MPOL_PREFERRED_MANY over them and the far-tier nodes nearest to them
TIERED = ("near", "near-then-far")
DEFAULT_MEM = {"wim": "first-touch", "win": "membind", "wicp": "membind", "wicp-mixed": "interleave",
               "wic": "local", "spread": "local", "n": "membind", "gpu": "membind"}
# auto: a measured cross-L3 / within-L3 latency ratio above this means "chiplet machine"
CHIPLET_LATENCY_RATIO = 1.5
# auto: working set "far above" total L3 when it exceeds this multiple
FAR_ABOVE_L3 = 4.0


@dataclass(frozen=True)
class Instance:
    id: int
    cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    mem_policy: str
    numa_nodes: tuple[int, ...]  # nodes holding this instance's CPUs
    l3_domains: tuple[int, ...]
    cores: int
    gpu: str | None = None  # policy gpu: the tile's GPU, by PCI address
    gpu_uuid: str | None = None  # its UUID where known (NVML, hwloc's nvml OSDev): CUDA_VISIBLE_DEVICES
    far_nodes: tuple[int, ...] = ()  # its far tier (CPU-less nodes nearest to its CPUs), where placed by tier
    weights: dict[int, int] = field(default_factory=dict, hash=False)  # weighted interleave: node -> weight
    mem_reason: str = ""  # why this memory placement (tiered policies, weights)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("cpus", "mem_nodes", "numa_nodes", "l3_domains", "far_nodes"):
            d[k] = list(d[k])
        d["weights"] = {str(n): w for n, w in sorted(self.weights.items())}
        d["cpulist"] = cpulist.format(self.cpus)
        for k in ("gpu", "gpu_uuid"):  # CPU tiles keep the document they always had
            if d[k] is None:
                del d[k]
        return d


@dataclass(frozen=True)
class Plan:
    policy: str  # the concrete policy (auto resolves to one of the others)
    requested: str
    instances: tuple[Instance, ...]
    reasons: tuple[str, ...]
    smt: bool
    topology_fingerprint: str
    topology_source: str
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "requested": self.requested,
            "smt": self.smt,
            "topology": {"source": self.topology_source, "fingerprint": self.topology_fingerprint},
            "instances": [i.to_json() for i in self.instances],
            "reasons": list(self.reasons),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict, source: str | None = None) -> Plan:
        try:
            inst = tuple(
                Instance(i["id"], tuple(i["cpus"]), tuple(i["mem_nodes"]), i["mem_policy"],
                         tuple(i.get("numa_nodes", ())), tuple(i.get("l3_domains", ())), i.get("cores", len(i["cpus"])),
                         gpu=i.get("gpu"), gpu_uuid=i.get("gpu_uuid"), far_nodes=tuple(i.get("far_nodes", ())),
                         weights={int(n): int(w) for n, w in (i.get("weights") or {}).items()},
                         mem_reason=i.get("mem_reason", ""))
                for i in d["instances"]
            )
            return cls(d["policy"], d.get("requested", d["policy"]), inst, tuple(d.get("reasons", ())),
                       bool(d.get("smt", False)), d["topology"]["fingerprint"], d["topology"]["source"],
                       tuple(d.get("notes", ())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"{source}: malformed plan" if source else "malformed plan document"
            raise UsageError(f"{what} (missing or bad {e})", "write it with `tilewise plan --save FILE`") from None


# What tier-aware placement decides on: figures measured per (initiator node, target node), and the
# firmware's (HMAT) with the kernel's tiers (topology.tiers.figures(t) reads them from the topology).
MemoryFigures = tiers.Figures


@dataclass(frozen=True)
class AutoHints:
    """What auto may know about the workload (all optional)."""

    engine_threads: str = "parallel"  # parallel | single
    working_set_bytes: int | None = None
    skewed: bool = False
    uses_gpu: bool = False  # the engine or workload runs on GPUs (a tensor workload with --device cuda)


# ---- helpers ----------------------------------------------------------------------------------

def _units(t: Topology, cores, smt: bool) -> list[tuple[Core, tuple[int, ...]]]:
    out = []
    for c in cores:
        cpus = t.core_cpus(c, smt)
        if cpus:
            out.append((c, cpus))
    return out


def _instance(t: Topology, iid: int, units, mem_policy: str, mem_nodes_override=None) -> Instance:
    cpus = tuple(sorted(p for _, cs in units for p in cs))
    nodes = tuple(sorted({c.numa_node for c, _ in units}))
    l3s = tuple(sorted({c.l3 for c, _ in units}))
    if mem_nodes_override is not None:
        mem_nodes = tuple(mem_nodes_override)
    else:
        # a node whose memory may not be used (a container's cpuset.mems excludes it) is skipped;
        # with none of the instance's nodes usable, its memory goes to the allowed nodes
        allowed = t.mem_allowed_nodes
        usable = tuple(n for n in nodes if n in allowed) or tuple(n.id for n in t.cpu_nodes if n.id in allowed) or allowed
        mem_nodes = usable[:1] if mem_policy == "preferred" else usable
    return Instance(iid, cpus, mem_nodes, mem_policy, nodes, l3s, len(units))


def _group(units, key) -> list[list]:
    groups: dict = defaultdict(list)
    for u in units:
        groups[key(u[0])].append(u)
    return [groups[k] for k in sorted(groups)]


def _check_mem(t: Topology, mem: str | None, mem_nodes) -> None:
    if mem is not None and mem not in MEM_POLICIES:
        raise UsageError(f"unknown memory policy {mem!r}", f"choose one of {', '.join(MEM_POLICIES)}")
    if mem_nodes is not None:
        known = {n.id for n in t.numa_nodes}
        bad = [n for n in mem_nodes if n not in known]
        if bad:
            raise UsageError(f"memory node(s) {cpulist.format(bad)} do not exist in this topology",
                             f"nodes are {cpulist.format(known)}")


# ---- policies -------------------------------------------------------------------------------

def _split(t: Topology, policy: str, units, k: int | None) -> tuple[list[list], list[str]]:
    """Partition usable cores into instances for a concrete policy; returns (groups, notes)."""
    notes: list[str] = []
    if policy == "wim":
        return [units], notes
    if policy == "win":
        return _group(units, lambda c: c.numa_node), notes
    if policy == "wicp":
        spanning = [d for d in t.l3_domains if d.spans_nodes]
        if spanning:
            notes.append(
                f"{len(spanning)} L3 domain(s) span several NUMA nodes (sub-NUMA clustering): a wicp instance "
                "takes the whole L3 and binds memory to all its nodes; win gives one instance per node")
        return _group(units, lambda c: c.l3), notes
    if policy == "wic":
        return [[u] for u in units], notes
    if policy == "wicp-mixed":
        # Per locality block (a node with its L3s, or an L3 holding several nodes): as many instances
        # as L3s there, each taking cores round-robin from the L3s (instance i takes the j-th core of
        # L3 (i + j) mod m): every L3 feeds every instance.
        groups: list[list] = []
        block_of = {nid: b for b, (nodes, _) in enumerate(t.locality_blocks) for nid in nodes}
        for block_units in _group(units, lambda c: block_of[c.numa_node]):
            l3s = _group(block_units, lambda c: c.l3)
            m = len(l3s)
            size = max(len(g) for g in l3s)
            inst: list[list] = [[] for _ in range(m)]
            for i in range(m):
                for j in range(size):
                    col = l3s[(i + j) % m]
                    if j < len(col):
                        inst[i].append(col[j])
            groups.extend(g for g in inst if g)
        if all(len(_group(g, lambda c: c.l3)) == 1 for g in groups):
            where = "L3 domain holds whole NUMA nodes" if t.l3_spans_nodes else "NUMA node has a single L3 domain"
            notes.append(f"each {where}: wicp-mixed is the same as wicp here")
        return groups, notes
    if policy == "spread":
        by_node = _group(units, lambda c: c.numa_node)
        if len(by_node) < 2:
            raise UsageError("spread needs at least 2 NUMA nodes with CPUs; this topology has 1",
                             "use win or wim on this machine")
        count = len(by_node)
        size = max(len(g) for g in by_node)
        order = [g[j] for j in range(size) for g in by_node if j < len(g)]  # node-interleaved
        groups = [order[i * size:(i + 1) * size] for i in range(count)]
        return [g for g in groups if g], notes
    if policy == "n":
        if k is None or k < 1:
            raise UsageError("policy n needs --instances K with K >= 1")
        if k > len(units):
            raise UsageError(f"{k} instances asked for but only {len(units)} cores are usable",
                             f"use --instances {len(units)} or fewer, or --smt")
        size = math.ceil(len(units) / k)
        groups = [units[i:i + size] for i in range(0, len(units), size)]
        while len(groups) < k:  # ceil sizing can leave fewer groups: split the largest
            big = max(range(len(groups)), key=lambda i: len(groups[i]))
            g = groups.pop(big)
            half = len(g) // 2
            groups[big:big] = [g[:half], g[half:]]
        for g in groups:
            if len({c.numa_node for c, _ in g}) > 1:
                notes.append(f"an instance of {len(g)} cores spans several NUMA nodes")
                break
        return groups, notes
    raise UsageError(f"unknown policy {policy!r}", f"choose one of {', '.join(POLICIES)}")


def gpu_nodes(t: Topology) -> list[tuple[pci.PciDevice, int, str]]:
    """Each GPU with the NUMA node its tile runs on and how that was found; one Error line for a
    machine without GPUs or a GPU whose node cannot be told."""
    if not t.gpus:
        raise UsageError(f"--policy gpu: no GPU in this topology ({t.source}: no PCI display or accelerator device)",
                         "use a CPU policy (auto, win, wicp), or a topology with GPUs (an hwloc XML exported with "
                         "I/O devices: `lstopo --of xml FILE`)")
    node_cpus = {n.id: n.cpus for n in t.cpu_nodes}
    out = []
    for g in t.gpus:
        node, why = pci.locate(g, node_cpus)
        if node is None:
            raise UsageError(f"--policy gpu: {why}",
                             "tilewise will not guess: export the topology (`tilewise topo --export FILE`), move the "
                             "GPU's PCIDev under its node's Package and plan with --topology FILE, or use a CPU policy")
        out.append((g, node, why))
    return out


def _gpu_split(t: Topology, units) -> tuple[list[list], list[pci.PciDevice], list[str], list[str]]:
    """One tile per GPU: the usable cores of its node, split in contiguous shares that differ by at
    most one core among the GPUs of that node (fewer cores than GPUs: tiles share cores, said so)."""
    placed = gpu_nodes(t)
    reasons = [why for _, _, why in placed]
    notes: list[str] = []
    by_node = {n: [u for u in units if u[0].numa_node == n] for n in {node for _, node, _ in placed}}
    blocked = sorted(n for n, cores in by_node.items() if not cores)
    if blocked:
        skipped = [g.address for g, n, _ in placed if n in blocked]
        if len(blocked) == len(by_node):
            raise UsageError(f"--policy gpu: the GPUs' NUMA node(s) {cpulist.format(blocked)} have no usable core here",
                             "run where those nodes' CPUs are allowed, or use a CPU policy")
        notes.append(f"GPU(s) {', '.join(skipped)} on node(s) {cpulist.format(blocked)}: no usable core there "
                     "(allowed CPUs), no tile")
        by_node = {n: c for n, c in by_node.items() if c}
    groups, gpus = [], []
    for node in sorted(by_node):
        mine = [g for g, n, _ in placed if n == node]
        cores = by_node[node]
        k, n = len(mine), len(cores)
        if n >= k:
            size, extra = divmod(n, k)
            start = 0
            for i in range(k):
                end = start + size + (1 if i < extra else 0)
                groups.append(cores[start:end])
                start = end
            if k > 1:
                reasons.append(f"node {node}: {k} GPUs share its {n} cores fairly "
                               f"({', '.join(str(size + (1 if i < extra else 0)) for i in range(k))} cores)")
        else:
            groups.extend([cores[i % n]] for i in range(k))
            notes.append(f"node {node} has {k} GPUs but {n} usable core(s): tiles share cores "
                         "(each GPU's tile gets one core, round-robin)")
        gpus.extend(mine)
    idle = sorted({c.numa_node for c, _ in units} - set(by_node))
    if idle:
        notes.append(f"node(s) {cpulist.format(idle)} hold no GPU: their cores are in no GPU tile")
    return groups, gpus, reasons, notes


def plan(
    t: Topology,
    policy: str,
    *,
    instances: int | None = None,
    mem: str | None = None,
    smt: bool = False,
    mem_nodes: tuple[int, ...] | None = None,
    hints: AutoHints | None = None,
    weights: str | None = None,
    figures: MemoryFigures | None = None,
) -> Plan:
    policy = (policy or "").lower().replace("_", "-")
    if policy in ("wicp-local", "wicplocal"):
        policy = "wicp"
    if policy in ("spmwin",):
        policy = "spread"
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}", f"choose one of {', '.join(p for p in POLICIES)}")
    if instances is not None and policy not in ("n", "auto"):
        raise UsageError(f"--instances applies to policy n (or auto), not {policy}",
                         f"drop --instances, or use --policy n --instances {instances}")
    _check_mem(t, mem, mem_nodes)
    if weights is not None and mem != "weighted-interleave":
        raise UsageError("--weights applies to --mem weighted-interleave", "drop --weights, or add --mem weighted-interleave")
    if mem in TIERED and mem_nodes is not None:
        raise UsageError(f"--mem {mem} chooses the nodes by tier", "drop --mem-nodes, or use --mem membind/preferred")
    requested = policy
    reasons: list[str] = []
    if policy == "auto":
        policy, reasons = choose(t, hints or AutoHints(), instances=instances)
    units = _units(t, t.usable_cores(), smt)
    if not units:
        raise UsageError("no usable cores in this topology")
    gpus: list = []
    if policy == "gpu":
        groups, gpus, gpu_reasons, notes = _gpu_split(t, units)
        reasons += gpu_reasons
    else:
        groups, notes = _split(t, policy, units, instances)
    mem_policy = mem or DEFAULT_MEM[policy]
    if mem_policy == "first-touch" and policy != "wim" and mem is None:
        mem_policy = "membind"
    insts = tuple(_instance(t, i, g, mem_policy, mem_nodes) for i, g in enumerate(groups))
    if gpus:
        insts = tuple(replace(i, gpu=g.address, gpu_uuid=g.uuid) for i, g in zip(insts, gpus))
        if not all(g.uuid for g in gpus):
            notes.append("no UUID known for some GPUs (no NVML here, or a topology without nvml OS devices): their "
                         "tiles select the GPU by its PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    if policy == "wim" and mem_policy in ("interleave", "weighted-interleave") and mem_nodes is None:
        # WIM+interleave spreads pages over every node that holds CPUs
        spread = tuple(n.id for n in t.cpu_nodes if n.id in t.mem_allowed_nodes) or t.mem_allowed_nodes
        insts = tuple(_instance(t, i.id, g, mem_policy, spread) for i, g in zip(insts, groups))
    if mem_policy == "weighted-interleave" and weights is None and mem_nodes is None:
        lone = next((i for i in insts if len(i.mem_nodes) < 2), None)
        if lone is not None:  # interleaving over one node is no interleave: the weights would do nothing
            raise UsageError(f"weighted interleave for instance {lone.id} has only node(s) "
                             f"{cpulist.format(lone.mem_nodes)} to interleave over (no far-tier memory or second node "
                             "for it here)", "name two or more nodes with --mem-nodes, or use --mem membind")
    if mem_policy in TIERED or weights is not None:
        insts = _by_tier(t, insts, mem_policy, weights, mem_nodes, figures or tiers.figures(t), notes)
    if not smt and t.smt > 1:
        notes.append(f"SMT{t.smt}: physical cores only (one hardware thread each); pass --smt to use siblings")
    if t.allowed_cpus is not None:
        notes.append(f"planned on the {len(t.allowed_cpus)} allowed CPUs only ({cpulist.format(t.allowed_cpus)})")
    if t.allowed_nodes is not None:
        notes.append(f"memory only on the allowed NUMA nodes ({cpulist.format(t.mem_allowed_nodes) or 'none'})")
    return Plan(policy, requested, insts, tuple(reasons), smt, t.fingerprint(), t.source, tuple(notes))


# ---- memory by tier ------------------------------------------------------------------------------

def _by_tier(t: Topology, insts: tuple[Instance, ...], mem: str, weights: str | None, mem_nodes, fig: MemoryFigures,
             notes: list[str]) -> tuple[Instance, ...]:
    """Each instance's near memory (its CPUs' nodes) and far tier (tiers.assign_far), placed by the
    memory policy: near (membind near), near-then-far (preferred-many over near, then far) or
    weighted interleave over near and far with weights (auto: from the read bandwidth ratio)."""
    far, far_notes = tiers.assign_far(t, {i.id: i.numa_nodes for i in insts}, measured=fig.measured,
                                      firmware=fig.firmware)
    notes += far_notes
    out = []
    allowed = set(t.mem_allowed_nodes)
    for inst, a in zip(insts, far):
        near = inst.mem_nodes  # its CPUs' nodes whose memory may be used
        if any(n not in allowed for n in a.far):
            notes.append(f"instance {inst.id}: far node(s) {cpulist.format(n for n in a.far if n not in allowed)} "
                         "may not be used here (not in the allowed memory nodes)")
            a = dataclasses.replace(a, far=tuple(n for n in a.far if n in allowed))
        if mem == "near":
            out.append(dataclasses.replace(inst, mem_policy="membind", mem_nodes=near, far_nodes=a.far,
                                           mem_reason=f"near: membind to node(s) {cpulist.format(near)} (allocation fails "
                                                      f"when they are full; {a.reason})"))
        elif mem == "near-then-far":
            why = (f"near-then-far: node(s) {cpulist.format(near)} first, then far node(s) {cpulist.format(a.far)} when "
                   f"full (MPOL_PREFERRED_MANY); {a.reason}" if a.far else
                   f"near-then-far: {a.reason}, so node(s) {cpulist.format(near)} only, then the kernel's fallback "
                   "by distance when full")
            out.append(dataclasses.replace(inst, mem_policy="preferred-many", mem_nodes=near + a.far, far_nodes=a.far,
                                           mem_reason=why))
        else:  # weighted interleave with --weights
            nodes = tuple(mem_nodes) if mem_nodes is not None else near + a.far
            if len(nodes) < 2:
                raise UsageError(f"weighted interleave for instance {inst.id} has only node(s) {cpulist.format(nodes)}: "
                                 f"{a.reason}", "name the nodes with --mem-nodes, or use --mem membind")
            if weights == "auto":
                w = tiers.auto_weights(t, inst.numa_nodes[0], nodes, measured=fig.measured, firmware=fig.firmware)
                wmap, why = w.weights, f"weights {w.text()} for node(s) {cpulist.format(sorted(w.weights))} {w.reason}"
            else:
                wmap = tiers.parse_weights(weights or "", nodes)
                why = f"weights {weights} given for node(s) {', '.join(map(str, nodes))}"
            out.append(dataclasses.replace(inst, mem_policy="weighted-interleave", mem_nodes=tuple(sorted(nodes)),
                                           far_nodes=a.far, weights=wmap,
                                           mem_reason=f"weighted interleave: {why}; {a.reason}"))
    if mem == "weighted-interleave":
        seen: dict[int, tuple[int, int]] = {}
        for inst in out:
            for n, w in inst.weights.items():
                if n in seen and seen[n][1] != w:
                    raise UsageError(f"the weighted-interleave weights are global, but instances {seen[n][0]} and "
                                     f"{inst.id} need different weights for node {n} ({seen[n][1]} and {w})",
                                     "give the weights yourself (--weights N:M), or run one instance")
                seen[n] = (inst.id, w)
    return tuple(out)


# ---- auto ---------------------------------------------------------------------------------------

def measured_chiplet_ratio(t: Topology) -> float | None:
    """Mean cross-L3 latency / mean within-L3 latency from a measured matrix, if there is one."""
    m = t.measurements.get("latency_ns")
    if not m:
        return None
    cpus = m["cpus"]
    l3_of = {p: t.core_of_cpu[p].l3 for p in cpus if p in t.core_of_cpu}
    core_of = {p: t.core_of_cpu[p].id for p in cpus if p in t.core_of_cpu}
    within, across = [], []
    for i, a in enumerate(cpus):
        for j, b in enumerate(cpus):
            if i == j or a not in l3_of or b not in l3_of or core_of[a] == core_of[b]:
                continue
            v = m["values"][i][j]
            if v and v > 0:
                (within if l3_of[a] == l3_of[b] else across).append(v)
    if not within or not across:
        return None
    return (sum(across) / len(across)) / (sum(within) / len(within))


def choose(t: Topology, hints: AutoHints, *, instances: int | None = None) -> tuple[str, list[str]]:
    """The studies' rules, in order; returns (policy, reasons). Override by naming a policy."""
    reasons: list[str] = []
    cores = t.usable_cores()
    nodes = {c.numa_node for c in cores}
    l3s = {c.l3 for c in cores}
    if hints.uses_gpu:
        if t.gpus:
            reasons.append(f"the workload runs on GPUs and this topology has {len(t.gpus)}: one tile per GPU with "
                           "its node's cores and memory (policy gpu)")
            return "gpu", reasons
        reasons.append("the workload can run on a GPU but this topology has none: CPU tiles")
    elif t.gpus:
        reasons.append(f"{len(t.gpus)} GPU(s) here, but the engine runs on CPUs: GPUs are not planned "
                       "(--policy gpu, or a tensor workload with --device cuda, plans one tile per GPU)")
    if instances is not None:
        reasons.append(f"--instances {instances} given: {instances} instances packed by L3 then node")
        return "n", reasons
    if hints.engine_threads == "single":
        reasons.append("single-threaded engine: one instance per physical core (WIC) uses every core")
        return "wic", reasons
    if len(cores) == 1:
        reasons.append("only one usable core: a single instance (WIM)")
        return "wim", reasons

    ratio = measured_chiplet_ratio(t)
    # The finer of the two units wins: several L3s per node (chiplets) -> per L3; L3s that each hold
    # several nodes (sub-NUMA clustering) -> per node.
    spanning = [d for d in t.l3_domains if d.id in l3s and d.spans_nodes]
    several_l3 = len(l3s) > len(nodes)
    if ratio is not None:
        chiplet = several_l3 and ratio >= CHIPLET_LATENCY_RATIO
        reasons.append(
            f"measured core-to-core latency: across L3 domains {ratio:.2f}x within one "
            f"({'above' if ratio >= CHIPLET_LATENCY_RATIO else 'below'} the {CHIPLET_LATENCY_RATIO}x chiplet threshold)"
        )
    else:
        chiplet = several_l3
        if several_l3:
            reasons.append(
                f"{len(l3s)} L3 domains over {len(nodes)} NUMA node(s): a chiplet design, where "
                "cross-L3 core-to-core latency is non-uniform (not measured; run `tilewise topo --measure` to confirm)"
            )

    if hints.skewed:
        reasons.append("skewed data reduces the gain of many small instances: prefer fewer, larger ones")
        if len(nodes) > 1:
            reasons.append(f"{len(nodes)} NUMA nodes: one instance per node (WIN)")
            return "win", reasons
        reasons.append("one NUMA node: a single instance (WIM)")
        return "wim", reasons

    if chiplet:
        one_l3 = max((d.size_bytes for d in t.l3_domains), default=0)
        total = t.total_l3_bytes
        ws = hints.working_set_bytes
        if ws is not None and one_l3 and total:
            if ws <= one_l3:
                reasons.append(f"working set {ws} B fits one L3 ({one_l3} B): one instance per chiplet, local (WICP)")
                return "wicp", reasons
            if ws <= total:
                reasons.append(
                    f"working set {ws} B is above one L3 ({one_l3} B) but within the total L3 ({total} B): "
                    "spread each instance over the chiplets (WICP_MIXED)"
                )
                return "wicp-mixed", reasons
            reasons.append(
                f"working set {ws} B is {'far ' if ws > FAR_ABOVE_L3 * total else ''}above the total L3 ({total} B): "
                "local and mixed perform alike; one instance per chiplet, local (WICP)"
            )
            return "wicp", reasons
        reasons.append("parallel engine on a chiplet machine: one instance per chiplet (WICP), the studies' best (up to 7x over WIM)")
        return "wicp", reasons
    if len(nodes) > 1:
        if spanning:
            reasons.append(
                f"parallel engine, {len(nodes)} NUMA nodes under {len(l3s)} L3 domain(s) "
                f"({len(spanning)} L3 spanning several nodes, as with sub-NUMA clustering): the node is the finer "
                "unit, one instance per node (WIN) with membind")
        else:
            reasons.append(f"parallel engine, {len(nodes)} NUMA nodes, one L3 per node: one instance per node (WIN) with membind")
        return "win", reasons
    if len(l3s) == 1:
        reasons.append("one NUMA node and one L3 domain: nothing to split, a single instance (WIM)")
    else:
        reasons.append("one NUMA node, L3 domains with uniform latency: a single instance (WIM)")
    return "wim", reasons
