"""The knobs of the in-memory analytics study (paper 003) and the tuned configuration file.

A `Config` is one point of the search space: allocator (preloaded), memory policy (+ nodes),
thread placement inside the process (none, sparse, dense) and, optionally, the OS switches THP and
AutoNUMA. `tilewise tune` writes the winner as a versioned JSON file that `tilewise exec --config`
and `tilewise workload --config` read back.
"""

from __future__ import annotations

import re
import shlex
import time
from collections import defaultdict
from dataclasses import dataclass, field

from tilewise import __version__, allocators, cpulist, userfiles
from tilewise.binding import Binding
from tilewise.errors import UsageError
from tilewise.fsutil import atomic_write_json
from tilewise.topology import allowed_nodes

CONFIG_FORMAT = "tilewise-tuned-config"
CONFIG_VERSION = 1
PLACEMENTS = ("none", "sparse", "dense")
MEM_ALIASES = {"ft": "first-touch", "firsttouch": "first-touch", "default": "first-touch",
               "localalloc": "local", "int": "interleave", "bind": "membind", "mem": "membind",
               "prefer": "preferred"}
MEM_POLICIES = ("first-touch", "interleave", "local", "preferred", "membind")


@dataclass(frozen=True)
class Config:
    allocator: str = "system"
    mem: str = "first-touch"
    mem_nodes: tuple[int, ...] = ()
    placement: str = "none"
    thp: str | None = None  # None: leave as it is
    autonuma: str | None = None  # "0"/"1" or None

    def mem_label(self) -> str:
        if self.mem in ("first-touch", "local") or not self.mem_nodes:
            return self.mem
        return f"{self.mem}:{cpulist.format(self.mem_nodes)}"

    def os_label(self) -> str:
        parts = []
        if self.thp is not None:
            parts.append(f"thp={self.thp}")
        if self.autonuma is not None:
            parts.append(f"autonuma={'on' if self.autonuma == '1' else 'off'}")
        return ",".join(parts)

    def label(self) -> str:
        s = f"{self.allocator}/{self.mem_label()}/{self.placement}"
        return s + (f"/{self.os_label()}" if self.os_label() else "")

    def os_desired(self) -> dict[str, str]:
        d = {}
        if self.thp is not None:
            d["thp"] = self.thp
        if self.autonuma is not None:
            d["autonuma"] = self.autonuma
        return d

    def is_default(self) -> bool:
        return (self.allocator, self.mem, self.placement) == ("system", "first-touch", "none")

    def to_json(self) -> dict:
        return {"allocator": self.allocator, "mem": self.mem, "mem_nodes": list(self.mem_nodes),
                "placement": self.placement, "thp": self.thp, "autonuma": self.autonuma}

    @classmethod
    def from_json(cls, d: dict) -> Config:
        try:
            c = cls(allocators.get(d["allocator"]).name, _norm_mem(d["mem"]), tuple(int(n) for n in d.get("mem_nodes", ())),
                    d.get("placement", "none"), d.get("thp"), d.get("autonuma"))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"malformed configuration ({e})") from None
        if c.placement not in PLACEMENTS:
            raise UsageError(f"unknown placement {c.placement!r} in configuration", f"choose one of {', '.join(PLACEMENTS)}")
        return c

    def binding(self, cpus: tuple[int, ...] | None = None):
        return Binding(cpus, self.mem, self.mem_nodes, self.allocator)

    def numactl_args(self) -> list[str]:
        nodes = cpulist.format(self.mem_nodes)
        return {"first-touch": [], "local": ["--localalloc"], "interleave": [f"--interleave={nodes}"],
                "preferred": [f"--preferred={nodes}"], "membind": [f"--membind={nodes}"]}[self.mem]

    def reproduce_env(self, command: list[str]) -> str:
        """A shell line that reproduces this configuration without tilewise (except placement)."""
        parts = []
        lib = allocators.find_library(self.allocator)
        if lib:
            parts.append(f"LD_PRELOAD={shlex.quote(lib)}")
        na = self.numactl_args()
        if na:
            parts += ["numactl", *na]
        return " ".join(parts + [shlex.join(command)])


def _norm_mem(name: str) -> str:
    n = MEM_ALIASES.get(name.strip().lower(), name.strip().lower())
    if n not in MEM_POLICIES:
        raise UsageError(f"unknown memory policy {name!r}", f"choose one of {', '.join(MEM_POLICIES)} (e.g. interleave:0-1, preferred:0)")
    return n


def memory_nodes(topo) -> tuple[int, ...]:
    """Nodes with memory (CPU-less nodes included: CXL, HBM)."""
    nodes = tuple(n.id for n in topo.numa_nodes if n.memory_bytes > 0 or n.cpus)
    return nodes or tuple(n.id for n in topo.numa_nodes)


def parse_mem(spec: str, topo) -> tuple[str, tuple[int, ...]]:
    """'interleave', 'interleave:0-1', 'preferred:0', 'membind:1', 'local', 'first-touch'."""
    name, sep, nodes_text = spec.partition(":")
    policy = _norm_mem(name)
    known = {n.id for n in topo.numa_nodes}
    if policy in ("first-touch", "local"):
        if sep:
            raise UsageError(f"memory policy {policy} takes no nodes ({spec!r})")
        return policy, ()
    if sep:
        nodes = cpulist.parse_set(nodes_text, allowed_nodes(topo), what=f"node list of {spec!r}")
    elif policy == "preferred":
        nodes = (topo.cpu_nodes[0].id if topo.cpu_nodes else topo.numa_nodes[0].id,)
    else:
        nodes = memory_nodes(topo)
    bad = [n for n in nodes if n not in known]
    if bad:
        raise UsageError(f"memory policy {spec!r} names node(s) {cpulist.format(bad)} that this topology lacks",
                         f"nodes here: {cpulist.format(known)}")
    if policy == "preferred" and len(nodes) != 1:
        raise UsageError(f"preferred takes one node, not {cpulist.format(nodes)}", "e.g. preferred:0")
    return policy, nodes


def split_list(text: str) -> list[str]:
    """Comma list of specs where node lists may contain commas: 'interleave:0,2,local'."""
    out: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if out and re.fullmatch(r"(\d+|N)(-(\d+|N)(:\d+/\d+)?)?", tok) and ":" in out[-1]:
            out[-1] += "," + tok
        else:
            out.append(tok)
    return out


# ---- thread placement -------------------------------------------------------------------------

def thread_order(topo, placement: str, threads: int, allowed: set[int] | None = None) -> list[int] | None:
    """The CPU of each worker thread (thread i -> order[i]); None for placement "none".

    dense : fill one L3 domain, then the next L3 of the same NUMA node, then the next node.
    sparse: round-robin over NUMA nodes, and inside a node round-robin over its L3 domains, so
            consecutive threads land on different memory controllers and caches (paper 003).
    Physical cores first (primary hardware threads); SMT siblings follow in the same order; the
    list repeats when there are more threads than CPUs.
    """
    if placement not in PLACEMENTS:
        raise UsageError(f"unknown placement {placement!r}", f"choose one of {', '.join(PLACEMENTS)}")
    if placement == "none":
        return None
    if threads < 1:
        raise UsageError("--threads must be at least 1")
    cores = [c for c in topo.usable_cores() if allowed is None or any(p in allowed for p in c.pus)]
    if not cores:
        raise UsageError("no allowed cores to place threads on")
    node_order = [n.id for n in topo.numa_nodes]
    by_node: dict[int, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for c in cores:
        by_node[c.numa_node][c.l3].append(c)
    nodes = sorted(by_node, key=node_order.index)
    if placement == "dense":
        seq = [c for n in nodes for l3 in sorted(by_node[n]) for c in by_node[n][l3]]
    else:
        per_node = [_round_robin([by_node[n][l3] for l3 in sorted(by_node[n])]) for n in nodes]
        seq = _round_robin(per_node)
    depth = max(len(c.pus) for c in seq)
    cpus: list[int] = []
    for level in range(depth):
        cpus += [c.pus[level] for c in seq if level < len(c.pus) and (allowed is None or c.pus[level] in allowed)]
    return [cpus[i % len(cpus)] for i in range(threads)]


def _round_robin(lists: list[list]) -> list:
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


# ---- the tuned configuration file -----------------------------------------------------------------

@dataclass
class TunedFile:
    config: Config
    target: dict = field(default_factory=dict)  # {"workload": "W1", ...} or {"command": [...]}
    measured: dict = field(default_factory=dict)  # median_s, default_median_s, speedup, spread
    topology_fingerprint: str = ""
    created: str = ""

    def to_json(self) -> dict:
        return {"format": CONFIG_FORMAT, "version": CONFIG_VERSION, "tilewise": __version__,
                "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "topology_fingerprint": self.topology_fingerprint, "target": self.target,
                "measured": self.measured, "config": self.config.to_json()}


def save_config(path: str, tf: TunedFile) -> None:
    try:
        atomic_write_json(path, tf.to_json())
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def load_config(path: str) -> TunedFile:
    doc = userfiles.read_json(path, "configuration", "write one with `tilewise tune --out DIR`")
    if not isinstance(doc, dict) or doc.get("format") != CONFIG_FORMAT:
        raise UsageError(f"{path} is not a tilewise tuned configuration (format {CONFIG_FORMAT!r})")
    if doc.get("version") != CONFIG_VERSION:
        raise UsageError(f"{path} has configuration version {doc.get('version')!r}; this tilewise reads {CONFIG_VERSION}",
                         "re-run `tilewise tune` with this version")
    cfg = Config.from_json(doc.get("config") or {})
    return TunedFile(cfg, doc.get("target") or {}, doc.get("measured") or {}, doc.get("topology_fingerprint", ""),
                     doc.get("created", ""))
