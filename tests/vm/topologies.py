"""The guest machines the VM suite boots (data only; see docs/vm-tests.md to add one).

CPU numbering follows QEMU: threads fastest, then cores, dies, sockets. With
``-cpu max,vendor=GenuineIntel`` each die has its own L3, so ``dies`` is "L3 domains per socket".
"""

from __future__ import annotations

try:
    from .harness import GuestTopology, Hmat, Node
except ImportError:  # run as a script from tests/vm
    from harness import GuestTopology, Hmat, Node

TOPOLOGIES: dict[str, GuestTopology] = {}


def _add(t: GuestTopology) -> GuestTopology:
    t.validate()
    TOPOLOGIES[t.name] = t
    return t


# 2 sockets x 2 L3 (dies) x 2 cores; one node per socket and a CPU-less far-memory node (CXL-like
# tier) nearer to socket 0 than to socket 1. The recipe.
TWO_SOCKET_CXL = _add(GuestTopology(
    "two-socket-cxl", sockets=2, dies=2, cores=2, threads=1,
    nodes=(Node(640, (0, 1, 2, 3)), Node(640, (4, 5, 6, 7)), Node(256)),
    distances=((10, 21, 30), (21, 10, 40), (30, 40, 10)),
    description="2 sockets x 2 L3 x 2 cores, node per socket + CPU-less memory node 2",
))

# 4 nodes, one per socket, on a ring with non-uniform and asymmetric distances (0->3 != 3->0).
FOUR_NODE_ASYM = _add(GuestTopology(
    "four-node-asym", sockets=4, dies=1, cores=2, threads=1,
    nodes=(Node(384, (0, 1)), Node(384, (2, 3)), Node(384, (4, 5)), Node(384, (6, 7))),
    distances=((10, 16, 22, 28),
               (16, 10, 16, 22),
               (22, 16, 10, 16),
               (26, 22, 16, 10)),
    description="4 sockets/nodes x 2 cores, ring distances, 0->3 = 28 but 3->0 = 26",
))

# Sub-NUMA clustering: each socket's single L3 holds two NUMA nodes of 2 cores.
L3_SPANS_NODES = _add(GuestTopology(
    "l3-spans-nodes", sockets=2, dies=1, cores=4, threads=1,
    nodes=(Node(384, (0, 1)), Node(384, (2, 3)), Node(384, (4, 5)), Node(384, (6, 7))),
    distances=((10, 12, 21, 21), (12, 10, 21, 21), (21, 21, 10, 12), (21, 21, 12, 10)),
    description="SNC2-like: 2 sockets, one L3 each spanning 2 nodes",
))

# SMT2: 1 socket, 2 L3 (dies) x 2 cores x 2 threads; one node per L3. Siblings are adjacent (2k, 2k+1).
SMT = _add(GuestTopology(
    "smt", sockets=1, dies=2, cores=2, threads=2,
    nodes=(Node(640, (0, 1, 2, 3)), Node(640, (4, 5, 6, 7))),
    distances=((10, 20), (20, 10)),
    description="SMT2, 2 L3 x 2 cores, node per L3",
))

# Control: no -numa at all, as most small VMs; the kernel makes one node of everything.
SINGLE_NODE = _add(GuestTopology(
    "single-node", sockets=1, dies=1, cores=2, threads=1, mem_mib=1024,
    description="2 cores, 1 L3, no NUMA configuration",
))

# cgroup2 only (cgroup_no_v1=all, cgroup2 mounted at /sys/fs/cgroup), 2 nodes.
CGROUP2 = _add(GuestTopology(
    "cgroup2", sockets=2, dies=1, cores=2, threads=1,
    nodes=(Node(640, (0, 1)), Node(640, (2, 3))),
    distances=((10, 21), (21, 10)), cgroup="v2",
    description="cgroup2-only guest, 2 nodes x 2 cores",
))


def _hmat_figures() -> tuple[Hmat, ...]:
    """Firmware figures of hmat-tiers (ns, MiB/s): DRAM 80 ns / 20000 local, 140 ns / 10000 across
    sockets; each CPU-less node is read in 250 ns at 8000 from its own socket and written slower
    (asymmetric: 300 ns, 4000), and is 100 ns and half the bandwidth further from the other socket.
    Every pair gets all four read/write figures: a figure left out of one of QEMU's tables is a 0 there,
    which the kernel takes as the best."""
    out: list[Hmat] = []
    for i in (0, 1):
        for t in range(4):
            if t < 2:
                rl, wl, rb, wb = (80, 80, 20000, 20000) if i == t else (140, 140, 10000, 10000)
            else:
                rl, wl, rb, wb = (250, 300, 8000, 4000) if t - 2 == i else (350, 400, 4000, 2000)
            out += [Hmat(i, t, "read-latency", rl), Hmat(i, t, "write-latency", wl),
                    Hmat(i, t, "read-bandwidth", rb), Hmat(i, t, "write-bandwidth", wb)]
    return tuple(out)


# Memory tiers with firmware figures (ACPI HMAT): 2 sockets of 1 core, a node each, and two CPU-less
# far-memory nodes, node 2 attached to socket 0 and node 3 to socket 1. Small nodes, so that "near
# full, then far" fills node 1 quickly.
HMAT_TIERS = _add(GuestTopology(
    "hmat-tiers", sockets=2, dies=1, cores=1, threads=1,
    nodes=(Node(512, (0,)), Node(256, (1,)), Node(128, initiator=0), Node(128, initiator=1)),
    distances=((10, 21, 17, 28), (21, 10, 28, 17), (17, 28, 10, 28), (28, 17, 28, 10)),
    hmat=_hmat_figures(),
    description="2 sockets x 1 core, node per socket + 2 CPU-less nodes with HMAT figures (asymmetric read/write)",
))
