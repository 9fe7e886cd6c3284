"""NIC locality: which NUMA node is local to the network interface used for inter-host traffic.

Scale-out (paper 000, section V) sends every exchange between hosts through one NIC; the processes
that talk to other hosts most (the coordinator, the master, the driver) run best on the NUMA node
the NIC is attached to. This module finds that node (the topology model's NICs: tilewise.topology.pci,
read from sysfs or hwloc XML; an interface outside them by ``class/net/<if>/device/numa_node``)
and places a cluster's coordinator on the plan instance local to it. It does not change a policy's
instances (plan.py owns policies); it only chooses among them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tilewise.plan import Instance, Plan
from tilewise.topology import pci
from tilewise.topology.pci import PciDevice


def nic_numa_node(ifname: str, sysfs: str | os.PathLike = "/sys", devices: Sequence[PciDevice] | None = None
                  ) -> int | None:
    """The NUMA node of a network interface's device; None for virtual interfaces (lo, veth, bridges)
    and for devices the firmware does not attach to a node (numa_node = -1).

    The device model's NICs (a topology's devices, or sysfs's PCI devices) name their interfaces;
    an interface no PCI NIC names (a bond, a device outside PCI) is looked up by its device link."""
    if not ifname or "/" in ifname or ifname in (".", ".."):
        return None
    for d in devices if devices is not None else pci.read_sysfs(sysfs, kinds=("nic",)):
        if ifname in d.os_devices:
            return d.numa_node
    path = Path(sysfs) / "class" / "net" / ifname / "device" / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def interface_of_address(addr: str, if_addrs: dict | None = None) -> str | None:
    """The interface holding a local address (psutil.net_if_addrs() layout)."""
    if if_addrs is None:
        import psutil

        if_addrs = psutil.net_if_addrs()
    for name, addrs in if_addrs.items():
        for a in addrs:
            if getattr(a, "address", None) == addr:
                return name
    return None


def source_address(host: str, port: int = 9) -> str | None:
    """The local address the kernel would use to reach host (no packet is sent: a UDP connect)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                return s.getsockname()[0]
        except OSError:
            continue
    return None


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


@dataclass(frozen=True)
class Placement:
    """Where a cluster's coordinator (master/driver) goes, and why."""

    coordinator: Instance | None  # None: not bound (no plan instance to share)
    nic: str | None
    nic_node: int | None
    reasons: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"coordinator_instance": self.coordinator.id if self.coordinator else None, "nic": self.nic,
                "nic_node": self.nic_node, "reasons": list(self.reasons)}


def place_coordinator(plan: Plan, nic: str | None, nic_node: int | None) -> Placement:
    """Pure: the instance whose CPUs the coordinator shares. With a known NIC node, the instance
    running on that node (the largest such, lowest id on ties); otherwise instance 0."""
    if not plan.instances:
        return Placement(None, nic, nic_node, ("the plan has no instance: the coordinator is not bound",))
    if nic_node is None:
        why = (f"interface {nic} has no NUMA node (virtual or not attached)" if nic
               else "inter-host traffic goes over loopback (no NIC)")
        return Placement(plan.instances[0], nic, None, (f"{why}: the coordinator shares instance 0's CPUs",))
    local = [i for i in plan.instances if nic_node in i.numa_nodes]
    if not local:
        return Placement(plan.instances[0], nic, nic_node,
                         (f"no instance runs on node {nic_node} (local to {nic}): the coordinator shares instance 0's CPUs",))
    best = sorted(local, key=lambda i: (-len(i.cpus), i.id))[0]
    return Placement(best, nic, nic_node,
                     (f"{nic} is attached to NUMA node {nic_node}: the coordinator shares instance {best.id}'s CPUs "
                      "there, next to the NIC that carries the exchanges",))


def nic_local_first(plan: Plan, nic_node: int | None) -> tuple[int, ...]:
    """Pure: instance ids with those on the NIC's node first (the workers that exchange with other
    hosts most cheaply are started, and listed to the coordinator, first)."""
    ids = [i.id for i in plan.instances]
    if nic_node is None:
        return tuple(ids)
    return tuple(sorted(ids, key=lambda k: (nic_node not in plan.instances[ids.index(k)].numa_nodes, k)))


def detect(address: str | None, *, sysfs: str | os.PathLike = "/sys", if_addrs: dict | None = None,
           devices: Sequence[PciDevice] | None = None) -> tuple[str | None, int | None]:
    """(interface, its NUMA node) for traffic from/to address: a local address (the one we bind)
    or a remote one (the coordinator we join). Loopback or unknown: (None or 'lo', None)."""
    if not address or is_loopback(address):
        return ("lo" if address else None), None
    ifname = interface_of_address(address, if_addrs)
    if ifname is None:
        src = source_address(address)
        ifname = interface_of_address(src, if_addrs) if src else None
    return ifname, (nic_numa_node(ifname, sysfs, devices) if ifname else None)
