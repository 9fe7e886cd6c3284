"""Topology: discover this machine or load a saved/synthetic one; one model for all sources.

``load(src)``: src is None (this machine, from sysfs), ``synthetic:<hwloc description>``,
``sysfs:<dir>`` (a saved copy of /sys/devices/system) or a path to an hwloc XML file.
"""

from __future__ import annotations

import os

from tilewise.errors import UsageError
from tilewise.topology.model import Core, L3Domain, NumaNode, Package, Topology

__all__ = ["Core", "L3Domain", "NumaNode", "Package", "Topology", "load", "is_live"]


def load(src: str | os.PathLike | None = None) -> Topology:
    from tilewise.topology import hwloc_xml, synthetic, sysfs

    if src is None or str(src) in ("", "live", "this"):
        return sysfs.load_live()
    s = str(src)
    if s.startswith("synthetic:"):
        return synthetic.load(s[len("synthetic:"):])
    if s.startswith("sysfs:"):
        return sysfs.load(s[len("sysfs:"):])
    if s.startswith("xml:"):
        s = s[len("xml:"):]
    if os.path.isdir(s):
        return sysfs.load(s)
    if not os.path.exists(s):
        raise UsageError(
            f"topology source {s!r} is not a file",
            "give an hwloc XML file, sysfs:<dir>, or synthetic:<description>",
        )
    return hwloc_xml.load(s)


def is_live(t: Topology) -> bool:
    return t.source.startswith("sysfs:/sys/devices/system")
