"""Bindings: what CPUs, memory policy and allocator a started process gets, and how it gets them.

A binding is applied in the child before it execs (``apply_to_self``, called by launch.spawn's
``preexec_fn``): CPU affinity with sched_setaffinity and the memory policy with the
set_mempolicy syscall. Both are inherited by everything the child spawns (threads, Spark
executors), and DuckDB, DataFusion and Java size their thread pools from the affinity mask. An
allocator is preloaded with LD_PRELOAD (``child_env``).

Before anything starts, ``check_binding`` rejects a binding that cannot be applied here, and
``ensure_runnable`` a plan made for another machine. Reading back what a process got is
tilewise.verification's job.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tilewise import admission, allocators, changes, cpulist, devices, procs, topology
from tilewise.errors import TilewiseError, UsageError
from tilewise.plan import Instance, Plan

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_PREFERRED_MANY = 5  # Linux 5.15+: prefer these nodes (nearest first), then any other
MPOL_WEIGHTED_INTERLEAVE = 6  # Linux 6.9+: interleave by the weights in WEIGHTED_INTERLEAVE_SYSFS
MODE_OF = {"first-touch": MPOL_DEFAULT, "preferred": MPOL_PREFERRED, "membind": MPOL_BIND,
           "interleave": MPOL_INTERLEAVE, "local": MPOL_LOCAL, "weighted-interleave": MPOL_WEIGHTED_INTERLEAVE,
           "preferred-many": MPOL_PREFERRED_MANY}
NEEDS_NODES = ("preferred", "membind", "interleave", "weighted-interleave", "preferred-many")
# the kernel a memory policy needs, and what to use instead on an older one
KERNEL_NEEDED = {"preferred-many": ((5, 15), "MPOL_PREFERRED_MANY",
                                    "--mem preferred (the near node, then the kernel's fallback by distance)"),
                 "weighted-interleave": ((6, 9), "MPOL_WEIGHTED_INTERLEAVE", "--mem interleave (equal weights)")}
WEIGHTED_INTERLEAVE_SYSFS = "/sys/kernel/mm/mempolicy/weighted_interleave"
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 258, "s390x": 237}.get(platform.machine(), 238)

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Binding:
    cpus: tuple[int, ...] | None  # None: leave affinity alone
    mem_policy: str = "first-touch"
    mem_nodes: tuple[int, ...] = ()
    allocator: str = "system"
    gpu: str | None = None  # a GPU tile's GPU (UUID): the only one the process sees (CUDA_VISIBLE_DEVICES)
    # weighted interleave: (node, weight) pairs written to WEIGHTED_INTERLEAVE_SYSFS (global!) for the
    # process's lifetime; empty: the kernel's weights as they are
    weights: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_instance(cls, inst: Instance, allocator: str = "system") -> Binding:
        return cls(tuple(inst.cpus), inst.mem_policy, tuple(inst.mem_nodes), allocator, gpu=inst.gpu_uuid,
                   weights=tuple(sorted(inst.weights.items())))

    def describe(self) -> str:
        cpus = cpulist.format(self.cpus) if self.cpus is not None else "unchanged"
        mem = self.mem_policy + (f":{cpulist.format(self.mem_nodes)}" if self.mem_nodes and self.mem_policy not in ("first-touch", "local") else "")
        if self.weights:
            mem += " weights " + ",".join(f"{n}={w}" for n, w in self.weights)
        return f"OS cpus {cpus}, memory {mem}, allocator {self.allocator}" + (f", GPU {self.gpu}" if self.gpu else "")

    def to_json(self) -> dict:
        d = asdict(self)
        d["cpus"] = list(self.cpus) if self.cpus is not None else None
        d["mem_nodes"] = list(self.mem_nodes)
        d["weights"] = {str(n): w for n, w in self.weights}
        return d


def check_binding(b: Binding, proc: str = "/proc") -> None:
    """Reject, before anything is started, a binding that cannot be applied here (one line)."""
    if b.mem_policy not in MODE_OF:
        raise UsageError(f"unknown memory policy {b.mem_policy!r}", f"choose one of {', '.join(MODE_OF)}")
    if b.mem_policy in NEEDS_NODES and not b.mem_nodes:
        raise UsageError(f"memory policy {b.mem_policy} needs at least one NUMA node", "e.g. --mem-nodes 0")
    if b.cpus is not None and not b.cpus:
        raise UsageError("the binding has an empty CPU list", "give at least one CPU")
    if b.weights and b.mem_policy != "weighted-interleave":
        raise UsageError(f"weights apply to weighted-interleave, not {b.mem_policy}")
    stray = [n for n, _ in b.weights if n not in b.mem_nodes]
    if stray:
        raise UsageError(f"weights given for node(s) {cpulist.format(stray)}, which are not among the interleaved "
                         f"nodes {cpulist.format(b.mem_nodes)}", "give one weight per interleaved node")
    bad = [f"{n}={w}" for n, w in b.weights if not 1 <= w <= 255]
    if bad:
        raise UsageError(f"weights {', '.join(bad)}: a weight is 1..255", "0 or less would never place a page there")
    if b.mem_policy in NEEDS_NODES:
        try:
            st = procs.status("self", proc)
            allowed = cpulist.parse(st.get("Mems_allowed_list", ""), what="Mems_allowed_list", allow_empty=True)
        except OSError:
            allowed = ()
        bad = [n for n in b.mem_nodes if allowed and n not in allowed]
        if bad:
            raise UsageError(f"memory node(s) {cpulist.format(bad)} cannot be used here",
                             f"this process may use nodes {cpulist.format(allowed)} (tilewise topo)")
    allocators.get(b.allocator)


# ---- applying a binding (in the child, before exec) ----------------------------------------

def set_mempolicy(policy: str, nodes: Sequence[int]) -> None:
    mode = MODE_OF[policy]
    if mode in (MPOL_DEFAULT, MPOL_LOCAL):
        res = _libc.syscall(SYS_SET_MEMPOLICY, mode, None, ctypes.c_ulong(0))
    else:
        if not nodes:
            raise OSError(22, f"memory policy {policy} needs at least one node")
        nbits = max(nodes) + 1
        words = (nbits + 63) // 64
        mask = (ctypes.c_ulong * words)()
        for n in nodes:
            mask[n // 64] |= 1 << (n % 64)
        res = _libc.syscall(SYS_SET_MEMPOLICY, mode, mask, ctypes.c_ulong(words * 64 + 1))
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy({policy}, {cpulist.format(nodes)}): {os.strerror(err)}")


def apply_to_self(b: Binding) -> None:
    """Bind the calling process (used in children before exec, and by tests)."""
    if b.cpus is not None:
        try:
            os.sched_setaffinity(0, b.cpus)
        except OSError as e:
            raise OSError(e.errno, f"sched_setaffinity({cpulist.format(b.cpus)}): {e.strerror}") from None
    set_mempolicy(b.mem_policy, b.mem_nodes)


def child_env(b: Binding, base: dict | None = None, token: str | None = None) -> dict:
    """The child's environment: the allocator preloaded, and the spawn token appended to
    procs.SPAWN_VAR (so its descendants can be found after they left its group)."""
    env = dict(os.environ if base is None else base)
    if b.gpu:  # the tile's process sees only its GPU; its pinned host buffers follow the memory policy (its node)
        env = devices.cuda_env(env, b.gpu)
    lib = allocators.find_library(b.allocator)
    if lib:
        prev = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = lib + ((":" + prev) if prev else "")
    if token:
        prev = env.get(procs.SPAWN_VAR, "")
        env[procs.SPAWN_VAR] = (prev + ":" if prev else "") + token
    return env


# ---- is this plan runnable here? ----------------------------------------------------------------

def weighted_interleave_supported(sysfs: str = WEIGHTED_INTERLEAVE_SYSFS) -> bool:
    """Linux 6.9+ has MPOL_WEIGHTED_INTERLEAVE, and with it this sysfs directory of node weights."""
    return os.path.isdir(sysfs)


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a kernel release string such as 6.1.0-56-amd64; (0, 0) when unreadable."""
    m = re.match(r"(\d+)\.(\d+)", release if release is not None else platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def mem_policy_supported(policy: str, *, release: str | None = None, sysfs: str = WEIGHTED_INTERLEAVE_SYSFS) -> bool:
    if policy == "weighted-interleave":
        return weighted_interleave_supported(sysfs)
    need = KERNEL_NEEDED.get(policy)
    return need is None or kernel_version(release) >= need[0]


def ensure_mem_policy_supported(p: Plan, sysfs: str = WEIGHTED_INTERLEAVE_SYSFS, release: str | None = None) -> None:
    """One line naming the kernel a plan's memory policy needs and what to use instead."""
    for policy in dict.fromkeys(i.mem_policy for i in p.instances):
        if not mem_policy_supported(policy, release=release, sysfs=sysfs):
            (major, minor), mode, fallback = KERNEL_NEEDED[policy]
            raise TilewiseError(
                f"memory policy {policy} is not supported by this kernel (Linux {release or platform.release()}; "
                f"{mode} needs {major}.{minor} or later)", f"use {fallback}")


WEIGHTS_WAY_OUT = ("re-run as root (sudo tilewise ...), or interleave with equal weights (--mem interleave), "
                   "which sets nothing global")


def admit_weights(weights: Sequence[tuple[int, int]], sysfs: str = WEIGHTED_INTERLEAVE_SYSFS,
                  caller: admission.Caller | None = None, access=admission.access) -> None:
    """Admission for weighted-interleave weights, before anything is journaled or written: each
    weight that has to change is a global sysfs switch (root's to write). Raises admission.Refused
    (one line naming the file, its owner, what is missing and the way out; exit 2). A weight that
    already has its value needs no write, and is admitted."""
    if not weights:
        return
    who = caller or admission.caller()
    refusals = []
    for node, w in weights:
        path = os.path.join(sysfs, f"node{node}")
        try:
            with open(path) as f:
                if f.read().strip() == str(w):
                    continue
        except OSError:
            pass  # unreadable or missing: the change layer says so when it reads the old value
        refusals.append(admission.write_refusal(who, access(path), f"the weighted-interleave weight of node {node}",
                                                WEIGHTS_WAY_OUT))
    admission.check(refusals)


def set_interleave_weights(session: changes.Session, weights: Sequence[tuple[int, int]], sysfs: str = WEIGHTED_INTERLEAVE_SYSFS) -> list[str]:
    """Write weighted-interleave weights through the change-and-undo layer (locked, journaled before
    the write, read back, undone when the session closes). They are global: every process on the
    machine that uses weighted interleave gets them meanwhile, and the lines returned say so.
    Admitted first (admit_weights): a caller who may not write them is refused before anything."""
    admit_weights(weights, sysfs)
    out = []
    for node, w in weights:
        target = changes.FileValue(os.path.join(sysfs, f"node{node}"), "plain",
                                   f"weighted-interleave weight of node {node} (global: the whole machine)")
        c = session.change(target, "value", str(w))
        was = c.old if c is not None else str(w)
        out.append(f"weighted interleave: node {node} weight {w} (was {was}); the weights are global: they apply to "
                   "the whole machine until this run ends and are then restored")
    return out


def ensure_runnable(p: Plan, live_fingerprint: str | None = None) -> None:
    """A plan made on a loaded topology that is not this machine can be shown, not executed."""
    ensure_mem_policy_supported(p)
    live = topology.load(None)
    fp = live_fingerprint or live.fingerprint()
    if p.topology_fingerprint != fp:
        raise UsageError(
            f"the plan's topology ({p.topology_source}) is not this machine ({live.summary()}): "
            "it can be planned but not executed here",
            "drop --topology, or use a file exported here with `tilewise topo --export`",
        )
    allowed = set(os.sched_getaffinity(0))
    for inst in p.instances:
        bad = [c for c in inst.cpus if c not in allowed]
        if bad:
            raise UsageError(f"instance {inst.id} wants CPUs {cpulist.format(bad)}, which this process may not use",
                             f"allowed CPUs are {cpulist.format(allowed)}")
