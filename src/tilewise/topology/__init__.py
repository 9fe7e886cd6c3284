"""Topology: discover this machine or load a saved/synthetic one; one model for all sources.

``load(src)``: src is None (this machine, from sysfs), ``synthetic:<hwloc description>``,
``sysfs:<dir>`` (a saved copy of /sys/devices/system) or a path to an hwloc XML file.
"""

from __future__ import annotations

import os

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology import sysfs
from tilewise.topology.model import Core, L3Domain, NumaNode, Package, Topology

__all__ = ["Core", "L3Domain", "NumaNode", "Package", "Topology", "load", "is_live", "allowed_nodes"]


def load(src: str | os.PathLike | None = None) -> Topology:
    if src is None or str(src) in ("live", "this"):
        return sysfs.load_live()
    if not str(src).strip():
        raise UsageError("empty topology source", "give an hwloc XML file, sysfs:<dir> or synthetic:<description>, "
                         "or leave --topology out for this machine")
    s = str(src)
    if s.startswith("synthetic:"):
        from tilewise.topology import synthetic  # decimal: only for this source

        return synthetic.load(s[len("synthetic:"):])
    if s.startswith("sysfs:"):
        if not s[len("sysfs:"):].strip():
            raise UsageError("--topology sysfs: names no directory",
                             "give sysfs:DIR, DIR a copy of /sys/devices/system (or a tree holding sys/devices/system)")
        return sysfs.load(s[len("sysfs:"):])
    if s.startswith("xml:"):
        s = s[len("xml:"):]
    if os.path.isdir(s):
        return sysfs.load(s)
    if not os.path.lexists(s):
        raise UsageError(
            f"topology source {s!r} is not a file",
            "give an hwloc XML file, sysfs:<dir>, or synthetic:<description>",
        )
    from tilewise import userfiles
    from tilewise.topology import hwloc_xml  # an XML parser: only for this source

    return hwloc_xml.load(s, text=userfiles.read_bytes(s, "topology file", "produce it with `lstopo --of xml FILE`"))


def is_live(t: Topology) -> bool:
    return t.source.startswith("sysfs:/sys/devices/system")


def allowed_nodes(t: Topology, status_path: str = "/proc/self/status") -> tuple[int, ...]:
    """The NUMA nodes a node set may name: on this machine the ones this process's cpuset allows
    (Mems_allowed_list), on a loaded topology all of them. numactl's `all`, `!N` and `+N` are relative
    to this set."""
    ids = t.mem_allowed_nodes  # a loaded topology: the nodes its allowed_nodeset names
    if not is_live(t):
        return ids
    try:
        with open(status_path) as f:
            line = next((ln for ln in f if ln.startswith("Mems_allowed_list:")), "")
        mems = set(cpulist.parse(line.partition(":")[2], what="Mems_allowed_list"))
    except (OSError, UsageError):
        return ids
    return tuple(i for i in ids if i in mems) or ids
