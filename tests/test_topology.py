"""Topology model on real machines (sysfs copies and real hwloc XML of them), synthetic, round trips."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from fixtures.machines import machines, write_sysfs
from tilewise import topology
from tilewise.errors import UsageError
from tilewise.topology import hwloc_xml, render, synthetic

from conftest import FIXTURES

MACHINES = machines()


@pytest.fixture(scope="session")
def sysfs_root(tmp_path_factory):
    """name -> directory holding a sysfs copy of that machine."""
    base = tmp_path_factory.mktemp("sysfs")
    out = {}
    for name, spec in MACHINES.items():
        write_sysfs(spec, base / name)
        out[name] = base / name
    return out


def load_sysfs(sysfs_root, name):
    return topology.load(f"sysfs:{sysfs_root[name]}")


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_counts_from_sysfs(sysfs_root, name):
    exp = MACHINES[name].expect
    t = load_sysfs(sysfs_root, name)
    assert len(t.packages) == exp["packages"]
    assert len(t.numa_nodes) == exp["nodes"]
    assert len(t.l3_domains) == exp["l3"]
    assert len(t.cores) == exp["cores"]
    assert len(t.pus) == exp["pus"]
    assert t.smt == exp["smt"]
    assert sum(1 for n in t.numa_nodes if n.cpuless) == exp.get("cpuless", 0)
    # every L3 domain's cpus are exactly its cores' PUs, and it lists the nodes of those cores;
    # an L3 and a node nest one way or the other (never split a cache by node)
    for d in t.l3_domains:
        cores = [c for c in t.cores if c.l3 == d.id]
        assert sorted(p for c in cores for p in c.pus) == list(d.cpus)
        assert {c.numa_node for c in cores} == set(d.numa_nodes)
        if d.spans_nodes:
            assert all(set(t.node_by_id[n].cpus) <= set(d.cpus) for n in d.numa_nodes)
        else:
            assert set(d.cpus) <= set(t.node_by_id[d.numa_nodes[0]].cpus)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_real_hwloc_xml_matches_sysfs(sysfs_root, name):
    """The committed XML files were written by real lstopo from the same sysfs trees."""
    a = load_sysfs(sysfs_root, name)
    b = topology.load(str(FIXTURES / f"{name}.xml"))
    assert a.fingerprint() == b.fingerprint()
    assert a.distances == b.distances
    assert [n.memory_bytes for n in a.numa_nodes] == [n.memory_bytes for n in b.numa_nodes]
    assert [d.size_bytes for d in a.l3_domains] == [d.size_bytes for d in b.l3_domains]
    assert [n.cpuless for n in a.numa_nodes] == [n.cpuless for n in b.numa_nodes]


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_export_round_trip(sysfs_root, name, tmp_path):
    t = load_sysfs(sysfs_root, name)
    out = tmp_path / "t.xml"
    hwloc_xml.save(t, out)
    back = topology.load(str(out))
    assert render.to_json(back) | {"source": None} == render.to_json(t) | {"source": None}


@pytest.mark.skipif(shutil.which("lstopo-no-graphics") is None, reason="hwloc not installed")
@pytest.mark.parametrize("name", ["epyc7713x2", "epyc9654_cxl", "spr8480x2_snc4", "opteron8220x8"])
def test_export_is_accepted_by_real_hwloc(sysfs_root, name, tmp_path):
    t = load_sysfs(sysfs_root, name)
    out = tmp_path / "t.xml"
    hwloc_xml.save(t, out)
    again = tmp_path / "again.xml"
    subprocess.run(["lstopo-no-graphics", "--input", str(out), "--of", "xml", "-f", str(again)], check=True,
                   capture_output=True)
    assert topology.load(str(again)).fingerprint() == t.fingerprint()


def test_epyc_smt_siblings_are_n_and_n_plus_128(sysfs_root):
    t = load_sysfs(sysfs_root, "epyc7713x2")
    for c in t.cores:
        assert c.pus == (c.pus[0], c.pus[0] + 128)
    assert [len(d.cpus) for d in t.l3_domains] == [16] * 16
    assert t.l3_domains[0].cpus == tuple(range(8)) + tuple(range(128, 136))


def test_adjacent_smt_numbering(sysfs_root):
    t = load_sysfs(sysfs_root, "xeongold6248x2")
    assert all(c.pus == (2 * c.id, 2 * c.id + 1) for c in t.cores)


@pytest.mark.parametrize("source", ["sysfs", "xml"])
def test_snc4_keeps_one_socket_l3_holding_four_nodes(sysfs_root, source):
    """Sub-NUMA clustering: sysfs shows one L3 per socket over 4 nodes, and so does hwloc. The
    model keeps one L3 containing the nodes instead of inventing a split per node."""
    t = load_sysfs(sysfs_root, "spr8480x2_snc4") if source == "sysfs" else topology.load(str(FIXTURES / "spr8480x2_snc4.xml"))
    assert [d.numa_nodes for d in t.l3_domains] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [len(d.cpus) for d in t.l3_domains] == [112, 112]
    assert t.l3_domains[0].size_bytes == 107520 * 1024
    assert t.locality_blocks == (((0, 1, 2, 3), (0,)), ((4, 5, 6, 7), (1,)))
    assert [d.id for d in t.l3s_of_node(5)] == [1]
    # cores are ordered socket, node, core: node 1's cores follow node 0's inside the one L3
    assert [c.numa_node for c in t.cores[:15]] == [0] * 14 + [1]
    assert t.distance(0, 1) == 12 and t.distance(0, 4) == 21
    assert "2 chiplets x 56 cores each spanning 4 NUMA nodes" in t.summary()
    tree = "\n".join(render.tree_lines(t))
    assert "    L3 L#0 (105 MiB, 56 cores, spans NUMA nodes 0-3)  cpus 0-55,112-167\n      NUMANode L#0 (P#0" in tree
    doc = render.to_json(t)
    assert doc["l3_domains"][1]["numa_nodes"] == [4, 5, 6, 7] and doc["l3_domains"][1]["cores"] == 56


def test_snc_export_puts_the_nodes_under_the_cache(sysfs_root, tmp_path):
    """As hwloc writes it: Package > L3Cache > Group per node > NUMANode (memory child) + Cores."""
    import xml.etree.ElementTree as ET

    t = load_sysfs(sysfs_root, "spr8480x2_snc4")
    root = ET.fromstring(hwloc_xml.dumps(t))
    pkg = root.find("object/object[@type='Package']")
    (l3,) = [o for o in pkg.findall("object") if o.get("type") == "L3Cache"]
    groups = [o for o in l3.findall("object") if o.get("type") == "Group"]
    assert [g.find("object[@type='NUMANode']").get("os_index") for g in groups] == ["0", "1", "2", "3"]
    assert all(len(g.findall("object[@type='Core']")) == 14 for g in groups)
    assert l3.get("nodeset") == "0x0000000f"


def test_l3_partly_overlapping_nodes_round_trips(tmp_path):
    """A VM can put a die's CPUs in two nodes that also hold other dies' CPUs: hwloc's tree cannot
    nest that, so the export writes the L3 in pieces marked with its id, and import rejoins them."""
    from tilewise.topology.build import RawNode, RawPU, build

    # L3 A = cpus 0-3, L3 B = cpus 4-7; node 0 = cpus 0-2, node 1 = cpus 3-7
    pus = [RawPU(c, 0, ("core", c), c, 0 if c < 3 else 1, ("l3", c // 4)) for c in range(8)]
    t = build(pus, [RawNode(0, 2**30), RawNode(1, 2**30)], distances=None, source="test")
    assert [d.numa_nodes for d in t.l3_domains] == [(0, 1), (1,)]
    assert t.locality_blocks == (((0, 1), (0, 1)),)
    out = tmp_path / "p.xml"
    hwloc_xml.save(t, out)
    back = topology.load(str(out))
    assert back.fingerprint() == t.fingerprint()
    assert [d.numa_nodes for d in back.l3_domains] == [(0, 1), (1,)]
    lines = render.tree_lines(t)
    assert any("spans NUMA nodes 0-1" in ln for ln in lines)


def test_cpuless_node_kept_with_memory(sysfs_root):
    t = load_sysfs(sysfs_root, "epyc9654_cxl")
    cxl = t.node_by_id[1]
    assert cxl.cpuless and cxl.cpus == () and cxl.memory_bytes == 256 * 2**30
    assert t.distance(0, 1) == 50
    assert "1 CPU-less" in t.summary()


def test_twisted_ladder_distances(sysfs_root):
    t = load_sysfs(sysfs_root, "opteron8220x8")
    values = {v for row in t.distances for v in row}
    assert values == {10, 12, 14, 16}
    assert all(t.distances[i][j] == t.distances[j][i] for i in range(8) for j in range(8))
    assert not t.l3_known  # Santa Rosa has no L3: one domain per node


def test_synthetic_epyc_summary():
    t = synthetic.load("Package:2 [NUMANode(memory=256GiB)] L3Cache:8(size=32MiB) Core:8 PU:2")
    assert t.summary() == "2 packages, 2 NUMA nodes, 16 chiplets x 8 cores, SMT2, 512 GiB"
    assert len(t.pus) == 256 and t.l3_domains[0].size_bytes == 32 * 2**20


def test_synthetic_explicit_pu_indexes():
    t = synthetic.load("Core:4 PU:2(indexes=0,4,1,5,2,6,3,7)")
    assert [c.pus for c in t.cores] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert t.numa_nodes[0].memory_bytes == 2**30  # hwloc's implicit node


def test_synthetic_second_memory_attachment_is_cpuless():
    t = synthetic.load("Package:2 [NUMANode(memory=64GB)] [NUMANode(memory=32GB)] Core:2 PU:1")
    assert [n.cpuless for n in t.numa_nodes] == [False, True, False, True]
    assert t.numa_nodes[1].memory_bytes == 32 * 10**9


@pytest.mark.skipif(shutil.which("lstopo-no-graphics") is None, reason="hwloc not installed")
@pytest.mark.parametrize("desc", [
    "Package:2 [NUMANode(memory=256GB)] L3Cache:8(size=32MB) Core:8 PU:2",
    "NUMANode:4 Core:4 PU:1",
    "Package:1 [NUMANode] Die:2 L3Cache:2 Core:3 PU:2",
    "Package:2 L3Cache:1 Group:2 [NUMANode(memory=8GiB)] Core:2 PU:2",  # SNC2: nodes under the L3
    "Core:4 PU:2(indexes=0,4,1,5,2,6,3,7)",
])
def test_synthetic_agrees_with_real_hwloc(desc, tmp_path):
    out = tmp_path / "h.xml"
    subprocess.run(["lstopo-no-graphics", "--if", "synthetic", "--input", desc, "--of", "xml", "-f", str(out)],
                   check=True, capture_output=True)
    ours, theirs = synthetic.load(desc), topology.load(str(out))
    assert ours.fingerprint() == theirs.fingerprint()
    assert [n.memory_bytes for n in ours.numa_nodes] == [n.memory_bytes for n in theirs.numa_nodes]
    assert [d.size_bytes for d in ours.l3_domains] == [d.size_bytes for d in theirs.l3_domains]


@pytest.mark.parametrize("desc,msg", [
    ("", "empty synthetic description"),
    ("Package:2 Core:x PU:1", "bad level"),
    ("Package:2 Core:2", "must end with a PU level"),
    ("Core:2 PU:2(indexes=0,1,1,3)", "permutation"),
    ("Core:2 PU:2(indexes=2*2:1*2)", "explicit list"),
    ("Core:2 [Memory] PU:1", "bad memory attachment"),
])
def test_synthetic_errors(desc, msg):
    with pytest.raises(UsageError, match=msg):
        synthetic.load(desc)


def test_malformed_xml_is_an_error(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<topology><object type='Machine'>")
    with pytest.raises(UsageError, match="not valid hwloc XML"):
        topology.load(str(bad))
    other = tmp_path / "other.xml"
    other.write_text("<html/>")
    with pytest.raises(UsageError, match="not hwloc XML"):
        topology.load(str(other))
    with pytest.raises(UsageError, match="is not a file"):
        topology.load(str(tmp_path / "missing.xml"))


def test_broken_sysfs_is_an_error_not_an_empty_machine(sysfs_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(sysfs_root["graviton3"], root, symlinks=True)
    (root / "sys/devices/system/node/node0/cpulist").write_text("0-3,x\n")
    with pytest.raises(UsageError, match="malformed"):
        topology.load(f"sysfs:{root}")


def test_measurements_round_trip_through_xml(tmp_path):
    t = synthetic.load("Package:1 [NUMANode] L3Cache:2 Core:2 PU:1")
    t.measurements["latency_ns"] = {"cpus": [0, 1, 2, 3], "values": [
        [0, 20.5, 80.25, 81], [20.5, 0, 79, 80], [80.25, 79, 0, 21], [81, 80, 21, 0]]}
    out = tmp_path / "m.xml"
    hwloc_xml.save(t, out)
    back = topology.load(str(out))
    assert back.measurements["latency_ns"] == t.measurements["latency_ns"]


def test_live_machine_loads():
    t = topology.load(None)
    assert len(t.pus) >= 1 and t.numa_nodes and t.cores
    assert topology.is_live(t)


def test_topo_cli_json_and_export(cli, tmp_path, sysfs_root):
    out = tmp_path / "e.xml"
    cp = cli("topo", "--topology", f"sysfs:{sysfs_root['epyc7713x2']}", "--json", "--export", str(out), check=True)
    doc = json.loads(cp.stdout)
    assert doc["packages"] == 2 and doc["cores"] == 128 and doc["pus"] == 256
    assert len(doc["numa_nodes"]) == 2 and doc["numa_nodes"][0]["memory_bytes"] == 256 * 2**30
    assert len(doc["l3_domains"]) == 16 and doc["l3_domains"][15]["numa_nodes"] == [1]
    assert doc["distances"] == [[10, 32], [32, 10]]
    assert out.exists()
    text = cli("topo", "--topology", str(out), check=True).stdout
    assert "2 packages, 2 NUMA nodes, 16 chiplets x 8 cores, SMT2, 512 GiB" in text
    assert "L3 L#0 (32 MiB, 8 cores)  cpus 0-7,128-135" in text


def test_topo_cli_error_is_one_line(cli):
    cp = cli("topo", "--topology", "synthetic:Package:2 Core")
    assert cp.returncode == 2
    assert cp.stderr.startswith("Error: ") and cp.stderr.count("\n") == 1
    assert "Traceback" not in cp.stderr
