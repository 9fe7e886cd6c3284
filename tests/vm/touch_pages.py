"""Touch an anonymous buffer and report where its pages landed (run inside a guest, bound by tilewise).

    python touch_pages.py OUT.json [MiB]

Writes {"pages": {node: count}, "policy": ..., "cpus": ..., "mems_allowed": ..., "cpu_ran_on": n}
from /proc/self/numa_maps (the N<node>= counts of the buffer's mapping) and /proc/self/status.
Transparent huge pages are disabled for the buffer so interleaving is per 4 KiB page.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import sys


def main() -> int:
    out = sys.argv[1]
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    size = mib << 20
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    page = mmap.PAGESIZE
    chunk = b"\x01" * page
    for off in range(0, size, page):  # first touch of every page, from this thread
        buf[off:off + page] = chunk
    line = ""
    with open("/proc/self/numa_maps") as f:
        for ln in f:
            if int(ln.split()[0], 16) == addr:
                line = ln.strip()
                break
    pages = {m.group(1): int(m.group(2)) for m in re.finditer(r"\bN(\d+)=(\d+)", line)}
    status = {}
    with open("/proc/self/status") as f:
        for ln in f:
            k, _, v = ln.partition(":")
            status[k] = v.strip()
    doc = {"pages": pages, "numa_maps": line, "policy": line.split()[1] if line else "",
           "cpus": status.get("Cpus_allowed_list"), "mems_allowed": status.get("Mems_allowed_list"),
           "total_pages": size // page, "cpu_ran_on": os.sched_getcpu() if hasattr(os, "sched_getcpu") else None}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
