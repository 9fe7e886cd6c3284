"""Where a result was measured (pyperf-style): one capture for every result document.

Benchmarks, probes, the tuner and the elastic experiment all embed this, so two result files can
be told apart by machine, topology, kernel, OS switches and tool version.
"""

from __future__ import annotations

import os
import platform
import time


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def selected(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise' (the kernel's bracketed choice)."""
    if text is None:
        return None
    for tok in text.split():
        if tok.startswith("[") and tok.endswith("]"):
            return tok[1:-1]
    return text


def os_state() -> dict:
    nb = read_text("/proc/sys/kernel/numa_balancing")
    return {
        "thp_enabled": selected(read_text("/sys/kernel/mm/transparent_hugepage/enabled")),
        "thp_defrag": selected(read_text("/sys/kernel/mm/transparent_hugepage/defrag")),
        "autonuma": None if nb is None else {"0": "off", "1": "on"}.get(nb, nb),
    }


def cpu_model() -> str | None:
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def capture(topo, **extra) -> dict:
    """The environment of a measurement on topology `topo`; `extra` adds tool-specific fields."""
    from tilewise import __version__

    env = {
        "tilewise_version": __version__,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "hostname": platform.node(),
        "topology": {"fingerprint": topo.fingerprint(), "summary": topo.summary(), "source": topo.source},
        "affinity": sorted(os.sched_getaffinity(0)),
        "os": os_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    env.update(extra)
    return env
