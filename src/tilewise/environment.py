"""Where a result was measured (pyperf-style): one capture for every result document, and the
system check run before measurements.

Benchmarks, probes, the tuner and the elastic experiment all embed ``capture()``, so two result
files can be told apart by machine, topology, kernel, OS switches, tool version and commit.
``system_check()`` reads what makes timings unstable (CPU frequency governor, turbo, load average,
THP, AutoNUMA, other busy processes) and turns what it finds into warnings with advice, the way
``pyperf system show`` does. Every file is read under an injectable root (tests use a fake /sys).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tilewise import __version__, cpulist, procs
from tilewise.topology.render import to_json

BUSY_CPU_PCT = 10.0  # another process above this share of one CPU is "busy"
LOAD_PER_CPU = 0.25  # 1-minute load average above this per CPU (and above 0.5): warn


def read_text(path: str | os.PathLike) -> str | None:
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


def _under(root: str | os.PathLike, path: str) -> Path:
    return Path(root) / path.lstrip("/")


def os_state(root: str | os.PathLike = "/") -> dict:
    nb = read_text(_under(root, "/proc/sys/kernel/numa_balancing"))
    return {
        "thp_enabled": selected(read_text(_under(root, "/sys/kernel/mm/transparent_hugepage/enabled"))),
        "thp_defrag": selected(read_text(_under(root, "/sys/kernel/mm/transparent_hugepage/defrag"))),
        "autonuma": None if nb is None else {"0": "off", "1": "on"}.get(nb, nb),
    }


def cpu_model() -> str | None:
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """The commit of the tilewise source tree (with "-dirty" when it has local changes), or None
    when tilewise does not run from a git checkout."""
    src = Path(path) if path else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def capture(topo, **extra) -> dict:
    """The environment of a measurement on topology `topo`; `extra` adds tool-specific fields."""
    env = {
        "tilewise_version": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "hostname": platform.node(),
        "topology": {"fingerprint": topo.fingerprint(), "summary": topo.summary(), "source": topo.source,
                     "document": to_json(topo)},
        "affinity": sorted(os.sched_getaffinity(0)),
        "os": os_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    env.update(extra)
    return env


# ---- the system check -------------------------------------------------------------------------

def _governors(root, cpus) -> dict[str, list[int]] | None:
    out: dict[str, list[int]] = {}
    for c in cpus:
        g = read_text(_under(root, f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor"))
        if g is not None:
            out.setdefault(g, []).append(c)
    return out or None


def _turbo(root) -> bool | None:
    nt = read_text(_under(root, "/sys/devices/system/cpu/intel_pstate/no_turbo"))
    if nt in ("0", "1"):
        return nt == "0"
    boost = read_text(_under(root, "/sys/devices/system/cpu/cpufreq/boost"))
    if boost in ("0", "1"):
        return boost == "1"
    return None


def busy_processes(sample_s: float = 0.3, threshold: float = BUSY_CPU_PCT, exclude: set[int] | None = None) -> list[dict]:
    """Other processes using more than `threshold` % of one CPU over `sample_s` seconds."""
    import psutil

    me = os.getpid()
    skip = set(exclude or ()) | set(procs.tree_of(me))
    watched = []
    for p in psutil.process_iter(["pid", "name"]):
        if p.pid in skip:
            continue
        try:
            p.cpu_percent(None)
            watched.append(p)
        except psutil.Error:
            pass
    time.sleep(sample_s)
    out = []
    for p in watched:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if pct > threshold:
            out.append({"pid": p.pid, "name": p.info.get("name") or "?", "cpu_pct": round(pct, 1)})
    return sorted(out, key=lambda d: -d["cpu_pct"])


def system_check(*, root: str | os.PathLike = "/", cpus: list[int] | None = None, numa_nodes: int = 1,
                 loadavg: tuple[float, float, float] | None = None,
                 processes: Callable[[], list[dict]] | None = busy_processes) -> dict:
    """What was found before the runs, and warnings with advice. `processes=None` skips the
    busy-process sample (it takes a fraction of a second)."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if loadavg is None:
        try:
            loadavg = os.getloadavg()
        except OSError:
            loadavg = None
    found = {
        "cpus": len(cpus),
        "governor": _governors(root, cpus),
        "turbo": _turbo(root),
        "loadavg": [round(x, 2) for x in loadavg] if loadavg else None,
        **os_state(root),
        "busy_processes": processes() if processes else None,
    }
    warnings = []
    gov = found["governor"]
    if gov:
        slow = {g: cs for g, cs in gov.items() if g != "performance"}
        if slow:
            what = ", ".join(f"{g} on CPUs {cpulist.format(cs)}" for g, cs in slow.items())
            warnings.append(f"CPU frequency governor {what}: the clock follows the load, so timings drift; "
                            "for stable figures set it, as root: cpupower frequency-set -g performance")
    if found["turbo"]:
        warnings.append("turbo boost is on: the clock depends on temperature and on how many cores are busy; "
                        "for stable figures turn it off, as root: echo 1 > /sys/devices/system/cpu/intel_pstate/no_turbo "
                        "(or echo 0 > /sys/devices/system/cpu/cpufreq/boost)")
    if loadavg and loadavg[0] > max(0.5, LOAD_PER_CPU * len(cpus)):
        warnings.append(f"load average {loadavg[0]:.2f} on {len(cpus)} CPU(s): other work competes for the CPUs; "
                        "measure on a quiet machine")
    if found["autonuma"] == "on" and numa_nodes > 1:
        warnings.append("AutoNUMA is on: the kernel migrates pages and threads during the run, which blurs the "
                        "placement being measured; turn it off for the run, as root: echo 0 > "
                        "/proc/sys/kernel/numa_balancing (or tilewise tune --apply-os --autonuma off)")
    if found["thp_enabled"] == "always" and found["thp_defrag"] == "always":
        warnings.append("THP enabled=always with defrag=always: page faults may stall on compaction and add "
                        "latency spikes; compare runs only with the same THP setting")
    busy = found["busy_processes"] or []
    if busy:
        top = ", ".join(f"{b['name']} (pid {b['pid']}, {b['cpu_pct']:.0f} %)" for b in busy[:4])
        warnings.append(f"{len(busy)} other process(es) use CPU: {top}{', ...' if len(busy) > 4 else ''}; "
                        "they compete with the measurement: stop them or measure on a quiet machine")
    found["warnings"] = warnings
    return found
