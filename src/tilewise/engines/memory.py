"""Memory per worker: reading sizes, and an engine's memory knob as data (engines.contract.Capabilities).

Every engine sizes its workers (a JVM heap, DuckDB's memory_limit) from the memory of the NUMA
node(s) an instance uses, split between the instances sharing a node, unless the user gives a size
(`--worker-memory`). What differs per engine -- the share, the cap, the smallest size that works --
is a MemoryKnob in its spec; the arithmetic is here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tilewise import topology
from tilewise.errors import UsageError
from tilewise.plan import Instance, Plan

# the JVM engines' defaults: this share of the memory of the instance's NUMA node(s), capped below
# 32 GiB (compressed oops), at least 512 MiB
MEMORY_FRACTION = 0.5
MEMORY_CAP_MB = 31 * 1024
MEMORY_MIN_MB = 512


def parse_size_mb(text: str, what: str = "--worker-memory", minimum_mb: int = MEMORY_MIN_MB) -> int:
    """'4g', '512m', '2GB', '1.5G' -> MiB (a bare number is MiB, as Spark reads it)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        raise UsageError(f"{what}: cannot read size {text!r}", "use e.g. 4g or 512m")
    val = float(m.group(1)) * {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2)]
    mb = int(val)
    if mb < minimum_mb:
        raise UsageError(f"{what}: {text} is below the {minimum_mb} MiB a worker needs", "use e.g. 2g")
    return mb


def inst_nodes(inst: Instance) -> tuple[int, ...]:
    """The NUMA nodes whose memory an instance uses."""
    if inst.mem_policy in ("membind", "interleave", "preferred") and inst.mem_nodes:
        return tuple(inst.mem_nodes)
    return tuple(inst.numa_nodes) or (0,)


def worker_memory_mb(plan: Plan, node_memory: dict[int, int], *, fraction: float = MEMORY_FRACTION,
                     cap_mb: int = MEMORY_CAP_MB, min_mb: int = MEMORY_MIN_MB) -> dict[int, int]:
    """Memory per worker (MiB): `fraction` of its NUMA nodes' memory, split between the instances
    sharing a node, capped at cap_mb. node_memory: node id -> bytes (0 = unknown: 4 GiB assumed)."""
    if not 0 < fraction <= 1:
        raise UsageError(f"memory fraction must be in (0, 1], got {fraction}")
    users: dict[int, int] = {}
    for inst in plan.instances:
        for n in inst_nodes(inst):
            users[n] = users.get(n, 0) + 1
    out = {}
    for inst in plan.instances:
        total = 0.0
        for n in inst_nodes(inst):
            mem = node_memory.get(n) or 4 * 1024 ** 3
            total += mem / users[n]
        mb = int(total * fraction / (1024 * 1024))
        out[inst.id] = max(min_mb, min(cap_mb, mb))
    return out


@dataclass(frozen=True)
class MemoryKnob:
    """What an engine's memory setting per worker is, as data: the harness, `up` and the help texts
    read it; no code outside the engine's folder needs to know which engine it is."""

    what: str  # what the size sets, for messages and help: "JVM heap", "memory_limit"
    minimum_mb: int = MEMORY_MIN_MB  # the smallest size a user may give
    fraction: float = MEMORY_FRACTION  # default: this share of the instance's node memory ...
    cap_mb: int = MEMORY_CAP_MB  # ... at most this
    default_min_mb: int | None = None  # ... at least this (None: minimum_mb)
    default_text: str | None = None  # how the engine derives its default, where not from the node's memory

    def parse(self, text: str, flag: str = "--worker-memory") -> int:
        return parse_size_mb(text, flag, self.minimum_mb)

    def default_mb(self, plan: Plan, node_memory: dict[int, int]) -> dict[int, int]:
        floor = self.minimum_mb if self.default_min_mb is None else self.default_min_mb
        return worker_memory_mb(plan, node_memory, fraction=self.fraction, cap_mb=self.cap_mb, min_mb=floor)

    def per_instance(self, plan: Plan, node_memory: dict[int, int], text: str | None = None) -> dict[int, int]:
        """One size for every instance when given, else the default from the node memory."""
        if text:
            mb = self.parse(text)
            return {i.id: mb for i in plan.instances}
        return self.default_mb(plan, node_memory)

    def describe(self) -> str:
        """'JVM heap: 50 % of its node's memory, at most 31 GiB' (for help texts)."""
        if self.default_text:
            return f"{self.what}: {self.default_text}"
        cap = f", at most {self.cap_mb // 1024} GiB" if self.cap_mb < (1 << 20) else ""
        return f"{self.what}: {self.fraction * 100:g} % of its node's memory{cap}"


def live_node_memory() -> dict[int, int]:
    """NUMA node id -> bytes of this machine (what default sizes are computed from)."""
    return {n.id: n.memory_bytes for n in topology.load(None).numa_nodes}
