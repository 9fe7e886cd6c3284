"""NIC locality: the NUMA node of the interface carrying inter-host traffic, read from sysfs
fixtures, and the coordinator placed on the plan instance local to it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tilewise import nic, plan, topology


@pytest.fixture
def sysfs(tmp_path):
    net = tmp_path / "class" / "net"
    for name, node in (("eth0", "1"), ("eth1", "-1"), ("ib0", "0")):
        (net / name / "device").mkdir(parents=True)
        (net / name / "device" / "numa_node").write_text(node + "\n")
    (net / "lo").mkdir(parents=True)  # virtual: no device
    (net / "veth0").mkdir(parents=True)
    return tmp_path


def test_nic_numa_node(sysfs):
    assert nic.nic_numa_node("eth0", sysfs) == 1
    assert nic.nic_numa_node("ib0", sysfs) == 0
    assert nic.nic_numa_node("eth1", sysfs) is None  # firmware says "no node"
    assert nic.nic_numa_node("lo", sysfs) is None and nic.nic_numa_node("veth0", sysfs) is None
    assert nic.nic_numa_node("nope", sysfs) is None
    assert nic.nic_numa_node("../../etc", sysfs) is None


def test_detect_from_local_address(sysfs):
    addrs = {"eth0": [SimpleNamespace(address="10.1.2.3")], "lo": [SimpleNamespace(address="127.0.0.1")]}
    assert nic.detect("10.1.2.3", sysfs=sysfs, if_addrs=addrs) == ("eth0", 1)
    assert nic.detect("127.0.0.1", sysfs=sysfs, if_addrs=addrs) == ("lo", None)
    assert nic.detect(None, sysfs=sysfs, if_addrs=addrs) == (None, None)


TWO_NODES = "synthetic:Package:2 [NUMANode(memory=8GB)] L3Cache:1(size=32MB) Core:4 PU:1"


def test_coordinator_goes_to_the_instance_on_the_nic_node():
    p = plan.plan(topology.load(TWO_NODES), "win")
    pl = nic.place_coordinator(p, "eth0", 1)
    assert pl.coordinator.id == 1 and 1 in pl.coordinator.numa_nodes
    assert "NUMA node 1" in pl.reasons[0] and pl.to_json()["coordinator_instance"] == 1
    assert nic.place_coordinator(p, "eth0", 0).coordinator.id == 0
    assert nic.place_coordinator(p, "lo", None).coordinator.id == 0  # loopback: no preference
    assert "loopback" in nic.place_coordinator(p, None, None).reasons[0]


def test_largest_local_instance_wins_and_missing_node_falls_back():
    p = plan.plan(topology.load(TWO_NODES), "n", instances=3)  # 3 instances over 2 nodes: uneven
    local = [i for i in p.instances if 1 in i.numa_nodes]
    pl = nic.place_coordinator(p, "eth0", 1)
    assert pl.coordinator.id == sorted(local, key=lambda i: (-len(i.cpus), i.id))[0].id
    pl = nic.place_coordinator(p, "eth9", 7)
    assert pl.coordinator.id == 0 and "no instance runs on node 7" in pl.reasons[0]


def test_nic_local_workers_first():
    p = plan.plan(topology.load(TWO_NODES), "win")
    assert nic.nic_local_first(p, 1) == (1, 0)
    assert nic.nic_local_first(p, 0) == (0, 1)
    assert nic.nic_local_first(p, None) == (0, 1)
