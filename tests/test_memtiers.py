"""Memory tiers: the firmware figures and kernel tiers as sysfs shows them (topology.firmware), and the
decisions made from them (topology.tiers): nearest initiators, each node's tier, interleave weights.
Fixtures: 2x EPYC 9654 with two CXL expanders, 2x Xeon Max 9480 SNC4 with CPU-less HBM nodes, and a
machine whose firmware disagrees with its SLIT and whose figures are read/write asymmetric."""

from __future__ import annotations

import pytest

from fixtures import hmat as H
from tilewise.errors import TilewiseError, UsageError
from tilewise.topology import firmware, sysfs, tiers


MACHINES = ("epyc9654x2_cxl2", "xeonmax9480x2_snc4", "asymmetric_reversed")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Each machine's sysfs tree, written once for the module (hundreds of CPUs: seconds each)."""
    made: dict = {}

    def get(name: str):
        if name not in made:
            spec = getattr(H, name)()
            root = H.write(spec, tmp_path_factory.mktemp(name))
            made[name] = (spec, sysfs.load(root / "devices" / "system"), firmware.read(root), root)
        return made[name]

    return get


@pytest.fixture(params=MACHINES)
def machine(request, trees):
    spec, t, fw, _ = trees(request.param)
    return request.param, spec, t, fw


@pytest.fixture
def load(trees):
    return lambda name, _tmp=None: trees(name)[:3]


# ---- reading sysfs ---------------------------------------------------------------------------------

def test_firmware_reads_every_figure_as_written(machine):
    name, spec, t, fw = machine
    got = {(a.target, a.access): a for a in fw.accesses}
    want = {(tg, acc): v for tg, classes in spec.hmat.items() for acc, v in classes.items()}
    assert set(got) == set(want)
    for key, (inits, rl, wl, rb, wb) in want.items():
        a = got[key]
        assert (a.initiators, a.read_latency, a.write_latency, a.read_bandwidth, a.write_bandwidth) == (inits, rl, wl, rb, wb)
    assert fw.has_hmat and fw.tiers_supported
    assert {x.id: x.nodes for x in fw.tiers} == spec.tiers
    assert fw.weights_supported == (spec.weights is not None) and fw.weights == (spec.weights or {})
    assert [n.id for n in t.numa_nodes if n.cpuless] == list(spec.machine.cpuless_nodes)


def test_firmware_figure_only_for_the_kept_initiators(load):
    _, _, fw = load("epyc9654x2_cxl2")
    assert fw.figure(0, 2, "read_bandwidth") == 64000
    assert fw.figure(1, 2, "read_bandwidth") is None  # the kernel keeps node 2's best initiator only
    assert fw.tier_of(2) == 5 and fw.tier_of(0) == 4
    assert firmware.MemoryTier(5, (2, 3)).adistance == (640, 767)


def test_a_zero_figure_is_no_figure_and_garbage_is_an_error(tmp_path):
    spec = H.asymmetric_reversed()
    root = H.write(spec, tmp_path)
    f = root / "devices/system/node/node2/access1/initiators/write_bandwidth"
    f.write_text("0\n")
    assert firmware.read(root).access(2).write_bandwidth is None
    f.write_text("fast\n")
    with pytest.raises(UsageError, match="is not a number"):
        firmware.read(root)


def test_a_kernel_without_hmat_tiers_or_weights(tmp_path):
    fw = firmware.read(tmp_path)  # nothing there at all
    assert not fw.has_hmat and not fw.tiers_supported and not fw.weights_supported
    assert fw.to_json()["hmat"] == []


# ---- nearest initiators and tiers -------------------------------------------------------------------

def test_cxl_nodes_are_far_and_nearest_their_own_socket_by_firmware(load):
    _, t, fw = load("epyc9654x2_cxl2")
    by = {x.node: x for x in tiers.classify(t, firmware=fw)}
    assert by[0].tier == by[1].tier == "near"
    for node, socket, bw in ((2, 0, 64000 / 460000), (3, 1, 32000 / 460000)):
        x = by[node]
        assert x.tier == "far" and x.basis == tiers.SRC_HMAT
        assert x.nearest.initiators == (socket,) and x.nearest.source == tiers.SRC_HMAT
        assert x.bandwidth_ratio == pytest.approx(bw)
        assert x.kernel_tier == 5 and "the kernel puts it in tier 5" in x.reason
    assert tiers.far_nodes(t, 0, firmware=fw) == [2] and tiers.far_nodes(t, 1, firmware=fw) == [3]


def test_hbm_nodes_are_fast_and_beside_their_cluster(load):
    _, t, fw = load("xeonmax9480x2_snc4")
    by = {x.node: x for x in tiers.classify(t, firmware=fw)}
    for k in range(8):
        assert by[k].tier == "near"
        hbm = by[8 + k]
        assert hbm.tier == "fast" and hbm.nearest.initiators == (k,), hbm
        assert hbm.bandwidth_ratio == pytest.approx(200000 / 60000) and hbm.latency_ratio == pytest.approx(130 / 110)
        assert hbm.kernel_tier == 4 and "kernel puts" not in hbm.reason  # one tier: nothing to compare
    assert tiers.far_nodes(t, 0, firmware=fw) == []  # HBM is not a far tier


def test_without_figures_slit_decides_and_says_so(load):
    _, t, _ = load("xeonmax9480x2_snc4")
    by = {x.node: x for x in tiers.classify(t)}
    hbm = by[9]
    assert hbm.nearest.source == tiers.SRC_SLIT and hbm.nearest.initiators == (1,) and hbm.nearest.value == 13
    assert hbm.tier == "far" and hbm.basis == tiers.SRC_SLIT and "technology unknown" in hbm.reason


def test_firmware_over_slit_where_they_disagree(load):
    _, t, fw = load("asymmetric_reversed")
    slit = tiers.nearest_initiators(t, 2)
    assert slit.initiators == (0,) and slit.source == tiers.SRC_SLIT
    by_fw = tiers.nearest_initiators(t, 2, firmware=fw)
    # access1 (CPU initiators) names node 1; access0's node 2 is not a CPU node and is skipped
    assert by_fw.initiators == (1,) and by_fw.source == tiers.SRC_HMAT and by_fw.value == 240
    x = {n.node: n for n in tiers.classify(t, firmware=fw)}[2]
    assert x.tier == "far" and x.latency_ratio == pytest.approx(240 / 90) and x.bandwidth_ratio == pytest.approx(0.25)


def measured(lat: dict, bw: dict, trusted: bool = True) -> dict:
    keys = set(lat) | set(bw)
    return {k: {"latency_ns": lat.get(k), "read_bw_gbs": bw.get(k), "trusted": trusted,
                "why_untrusted": None if trusted else "QEMU TCG (emulated CPU)"} for k in keys}


def test_measured_latency_wins_over_firmware_and_ties_share(load):
    _, t, fw = load("asymmetric_reversed")
    m = measured({(0, 2): 300.0, (1, 2): 303.0, (0, 0): 100.0, (1, 1): 100.0}, {(0, 2): 20.0, (0, 0): 50.0})
    near = tiers.nearest_initiators(t, 2, measured=m, firmware=fw)
    assert near.source == tiers.SRC_MEASURED and near.initiators == (0, 1)  # within 2 %
    x = {n.node: n for n in tiers.classify(t, measured=m, firmware=fw)}[2]
    assert x.basis == tiers.SRC_MEASURED and x.latency_ratio == pytest.approx(3.0) and x.bandwidth_ratio == pytest.approx(0.4)


def test_untrusted_measurements_are_skipped_with_the_reason(load):
    _, t, fw = load("epyc9654x2_cxl2")
    m = measured({(1, 2): 1.0, (0, 2): 9.0}, {(1, 2): 99.0}, trusted=False)
    near = tiers.nearest_initiators(t, 2, measured=m, firmware=fw)
    assert near.source == tiers.SRC_HMAT and near.initiators == (0,)
    assert "measured figures not used: QEMU TCG" in near.reason


# ---- weights ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bw, want", [
    ({0: 20000, 2: 8000}, {0: 5, 2: 2}),
    ({0: 100, 2: 100}, {0: 1, 2: 1}),
    ({0: 460000, 2: 64000}, {0: 7, 2: 1}),
    ({0: 460000, 3: 32000}, {0: 14, 3: 1}),
    ({0: 30.0, 1: 20.0, 2: 10.0}, {0: 3, 1: 2, 2: 1}),
    ({0: 1000.0, 2: 1.0}, {0: 255, 2: 1}),  # capped at the kernel's 255
])
def test_integer_weights(bw, want):
    assert tiers.integer_weights(bw) == want


@pytest.mark.parametrize("bw", [{0: 0, 2: 1}, {0: -5, 2: 1}, {0: float("nan"), 2: 1}, {}])
def test_integer_weights_refuse_what_cannot_weight(bw):
    with pytest.raises(UsageError):
        tiers.integer_weights(bw)


def test_auto_weights_measured_then_firmware_then_an_error(load):
    _, t, fw = load("epyc9654x2_cxl2")
    m = measured({}, {(0, 0): 40.0, (0, 2): 10.0})
    w = tiers.auto_weights(t, 0, [0, 2], measured=m, firmware=fw)
    assert (w.weights, w.source, w.text()) == ({0: 4, 2: 1}, tiers.SRC_MEASURED, "4:1")
    tcg = measured({}, {(0, 0): 40.0, (0, 2): 10.0}, trusted=False)
    w = tiers.auto_weights(t, 0, [0, 2], measured=tcg, firmware=fw)
    assert w.source == tiers.SRC_HMAT and w.weights == {0: 7, 2: 1} and "QEMU TCG" in w.reason
    with pytest.raises(UsageError, match="firmware gives none to node\\(s\\) 3") as e:
        tiers.auto_weights(t, 0, [0, 3], firmware=fw)  # node 3's figures are from node 1 only
    assert "--weights" in str(e.value)
    with pytest.raises(UsageError, match="at least two nodes"):
        tiers.auto_weights(t, 0, [2], firmware=fw)


@pytest.mark.parametrize("text, msg", [("3:0", "out of range"), ("3:-1", "out of range"), ("3", "1 weight\\(s\\) for 2"),
                                       ("3:1:1", "3 weight\\(s\\) for 2"), ("3:x", "not a whole number"),
                                       ("256:1", "out of range")])
def test_parse_weights_refuses(text, msg):
    with pytest.raises(UsageError, match=msg):
        tiers.parse_weights(text, [0, 2])


def test_parse_weights():
    assert tiers.parse_weights("3:1", [0, 2]) == {0: 3, 2: 1}
    assert tiers.parse_weights(" 255 : 1 ", [1, 3]) == {1: 255, 3: 1}


# ---- far memory per instance --------------------------------------------------------------------------

def test_each_socket_instance_gets_its_own_cxl_node(load):
    _, t, fw = load("epyc9654x2_cxl2")
    got, notes = tiers.assign_far(t, {0: (0,), 1: (1,)}, firmware=fw)
    assert [(a.instance, a.near, a.far) for a in got] == [(0, (0,), (2,)), (1, (1,), (3,))]
    assert "this instance's alone" in got[0].reason and tiers.SRC_HMAT in got[0].reason and not notes


def test_instances_on_one_node_share_its_far_node(load):
    _, t, fw = load("epyc9654x2_cxl2")
    got, _ = tiers.assign_far(t, {0: (0,), 1: (0,), 2: (1,)}, firmware=fw)
    assert [a.far for a in got] == [(2,), (2,), (3,)]
    assert "shared with instance(s) 1" in got[0].reason and "shared with instance(s) 0" in got[1].reason


def test_far_node_without_a_near_instance_is_said(load):
    _, t, fw = load("epyc9654x2_cxl2")
    got, notes = tiers.assign_far(t, {0: (0,)}, firmware=fw)
    assert got[0].far == (2,) and len(notes) == 1 and "far node 3" in notes[0]


def test_hbm_is_no_far_tier(load):
    _, t, fw = load("xeonmax9480x2_snc4")
    got, notes = tiers.assign_far(t, {k: (k,) for k in range(8)}, firmware=fw)
    assert all(a.far == () and "no far-tier memory" in a.reason for a in got) and not notes


# ---- placement by tier in the planner, and its edge (weights, kernels, read-back) ------------------------

from tilewise import binding, changes, plan as plan_mod, verification  # noqa: E402
from tilewise import procs as tw_procs  # noqa: E402


def test_plan_near_then_far_gives_each_socket_its_cxl_node(load):
    _, t, fw = load("epyc9654x2_cxl2")
    p = plan_mod.plan(t, "win", mem="near-then-far", figures=plan_mod.MemoryFigures(firmware=fw))
    got = [(i.numa_nodes, i.mem_policy, i.mem_nodes, i.far_nodes) for i in p.instances]
    assert got == [((0,), "preferred-many", (0, 2), (2,)), ((1,), "preferred-many", (1, 3), (3,))]
    assert all("MPOL_PREFERRED_MANY" in i.mem_reason and tiers.SRC_HMAT in i.mem_reason for i in p.instances)
    again = plan_mod.Plan.from_json(p.to_json())
    assert again.instances == p.instances


def test_plan_near_is_membind_to_the_instances_nodes(load):
    _, t, fw = load("epyc9654x2_cxl2")
    p = plan_mod.plan(t, "wicp", mem="near", figures=plan_mod.MemoryFigures(firmware=fw))
    assert all(i.mem_policy == "membind" and i.mem_nodes == i.numa_nodes for i in p.instances)
    assert {i.far_nodes for i in p.instances} == {(2,), (3,)}  # known, not used by near


def test_plan_weighted_interleave_auto_and_given(load):
    _, t, fw = load("epyc9654x2_cxl2")
    fig = plan_mod.MemoryFigures(firmware=fw)
    p = plan_mod.plan(t, "win", mem="weighted-interleave", weights="auto", figures=fig)
    assert [(i.mem_nodes, i.weights) for i in p.instances] == [((0, 2), {0: 7, 2: 1}), ((1, 3), {1: 14, 3: 1})]
    assert "firmware's read bandwidth" in p.instances[0].mem_reason
    p = plan_mod.plan(t, "win", mem="weighted-interleave", weights="3:1", figures=fig)
    assert [i.weights for i in p.instances] == [{0: 3, 2: 1}, {1: 3, 3: 1}]
    b = binding.Binding.from_instance(p.instances[1])
    assert b.weights == ((1, 3), (3, 1)) and "weights 1=3,3=1" in b.describe()


def test_plan_weights_are_global_so_instances_must_agree(load):
    _, t, _ = load("epyc9654x2_cxl2")
    m = measured({}, {(0, 0): 40.0, (0, 2): 10.0, (1, 0): 20.0, (1, 2): 10.0})
    with pytest.raises(UsageError, match="weights are global.*node 0 \\(4 and 2\\)"):
        plan_mod.plan(t, "win", mem="weighted-interleave", weights="auto", mem_nodes=(0, 2),
                      figures=plan_mod.MemoryFigures(measured=m))


@pytest.mark.parametrize("kw, msg", [
    (dict(mem="membind", weights="3:1"), "--weights applies to --mem weighted-interleave"),
    (dict(mem="near", mem_nodes=(0,)), "chooses the nodes by tier"),
    (dict(mem="weighted-interleave", weights="0:1"), "out of range"),
    (dict(mem="weighted-interleave", weights="-1:1"), "not a whole number|out of range"),
    (dict(mem="weighted-interleave", weights="3:1:1"), "3 weight\\(s\\) for 2"),
])
def test_plan_bad_memory_input(load, kw, msg):
    _, t, fw = load("epyc9654x2_cxl2")
    with pytest.raises(UsageError, match=msg):
        plan_mod.plan(t, "win", figures=plan_mod.MemoryFigures(firmware=fw), **kw)


def test_plan_weighted_without_a_far_tier_needs_nodes(load):
    _, t, fw = load("xeonmax9480x2_snc4")
    with pytest.raises(UsageError, match="has only node\\(s\\) 0.*no far-tier memory"):
        plan_mod.plan(t, "win", mem="weighted-interleave", weights="auto", figures=plan_mod.MemoryFigures(firmware=fw))


def test_binding_refuses_weights_that_do_not_fit():
    with pytest.raises(UsageError, match="not among the interleaved nodes"):
        binding.check_binding(binding.Binding(None, "weighted-interleave", (0, 2), weights=((0, 3), (5, 1))))
    with pytest.raises(UsageError, match="a weight is 1..255"):
        binding.check_binding(binding.Binding(None, "weighted-interleave", (0, 2), weights=((0, 0), (2, 1))))
    with pytest.raises(UsageError, match="apply to weighted-interleave"):
        binding.check_binding(binding.Binding(None, "membind", (0,), weights=((0, 3),)))


@pytest.mark.parametrize("policy, release, need", [("preferred-many", "5.10.0-28-amd64", "5.15"),
                                                   ("preferred-many", "4.19.0", "5.15")])
def test_old_kernels_are_one_line_with_the_version_and_the_fallback(load, policy, release, need):
    _, t, fw = load("epyc9654x2_cxl2")
    p = plan_mod.plan(t, "win", mem="near-then-far", figures=plan_mod.MemoryFigures(firmware=fw))
    with pytest.raises(TilewiseError) as e:
        binding.ensure_mem_policy_supported(p, release=release)
    text = str(e.value)
    assert f"{need} or later" in text and "--mem preferred" in text and "\n" not in text
    binding.ensure_mem_policy_supported(p, release="6.1.0-56-amd64")  # new enough: nothing said
    assert binding.kernel_version("6.18.44-fc") == (6, 18) and binding.kernel_version("garbage") == (0, 0)


def test_weights_are_journaled_read_back_and_restored(tmp_path):
    sysfs = tmp_path / "weighted_interleave"
    sysfs.mkdir()
    for n in (0, 2):
        (sysfs / f"node{n}").write_text("1\n")
    state = tmp_path / "state"
    with changes.Session("test weights", base=state) as s:
        lines = binding.set_interleave_weights(s, ((0, 3), (2, 1)), str(sysfs))
        assert (sysfs / "node0").read_text().strip() == "3" and (sysfs / "node2").read_text().strip() == "1"
        assert "whole machine" in lines[0] and "was 1" in lines[0]
        journal = s.journal.path.read_text()
        assert "node0" in journal and '"3"' in journal  # journaled before the write
        with pytest.raises(changes.Busy, match="already controlled"):
            with changes.Session("a second controller", base=state) as s2:
                binding.set_interleave_weights(s2, ((0, 5),), str(sysfs))
    assert (sysfs / "node0").read_text().strip() == "1"  # restored
    assert not list((state / "journals").glob("*.json"))


def test_numa_maps_preferred_many_and_page_split(tmp_path):
    pid = tmp_path / "77"
    pid.mkdir()
    (pid / "numa_maps").write_text(
        "7f00 prefer (many):1,3 anon=300 dirty=300 N1=200 N3=100 kernelpagesize_kB=4\n"
        "7f10 prefer (many):1,3 anon=2 N1=2 kernelpagesize_kB=4\n"
        "5500 prefer (many):1,3 file=/usr/bin/python3 mapped=4 N0=4 kernelpagesize_kB=4\n")
    assert verification.read_task_policy(77, str(tmp_path)) == "prefer (many):1,3"
    assert verification.parse_policy("prefer (many):1,3") == ("prefer (many)", (1, 3))
    assert tw_procs.numa_pages(77, str(tmp_path)) == {0: 4, 1: 202, 3: 100}
    b = binding.Binding(None, "preferred-many", (1, 3))
    assert verification.expected_policy(b) == "prefer (many):1,3"


# ---- memory attributes in the topology: hwloc memattrs, round trips with real lstopo ---------------------

import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

from tilewise.topology import hwloc_xml, render  # noqa: E402

LSTOPO = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")
needs_lstopo = pytest.mark.skipif(LSTOPO is None, reason="hwloc's lstopo is not installed (Debian package hwloc)")
STANDARD = ("ReadLatency", "WriteLatency", "ReadBandwidth", "WriteBandwidth", "Latency", "Bandwidth")


def values(t, names) -> set:
    return {(n, v["target_node"], tuple(v["initiator_cpus"] or ()), v["value"])
            for n in names for v in (t.memattrs.get(n) or {}).get("values", [])}


def test_sysfs_loader_keeps_hmat_and_tiers_as_memattrs(trees):
    spec, t, fw, _ = trees("epyc9654x2_cxl2")
    rb = {v["target_node"]: v["value"] for v in t.memattrs["ReadBandwidth"]["values"]}
    assert rb == {0: 460000, 1: 460000, 2: 64000, 3: 32000}
    lat = {v["target_node"]: v["value"] for v in t.memattrs["Latency"]["values"]}
    assert lat[2] == (250 + 300) // 2  # hwloc's rule: the mean of read and write
    node0 = next(v for v in t.memattrs["ReadLatency"]["values"] if v["target_node"] == 2)["initiator_cpus"]
    assert node0 == list(t.node_by_id[0].cpus)
    f = tiers.figures(t)
    assert {a.target: a.initiators for a in f.firmware.accesses} == {0: (0,), 1: (1,), 2: (0,), 3: (1,)}
    assert {x.id: x.nodes for x in f.firmware.tiers} == {4: (0, 1), 5: (2, 3)}
    assert [n.kind for n in t.numa_nodes] == ["dram", "dram", "cxl", "cxl"]  # tier 5 > DRAM's 4


@needs_lstopo
@pytest.mark.parametrize("name", ["epyc9654x2_cxl2", "asymmetric_reversed"])
def test_tilewise_reads_what_real_hwloc_reads_from_the_same_sysfs(trees, tmp_path, name):
    _, mine, _, root = trees(name)
    xml = tmp_path / "hwloc.xml"
    cp = subprocess.run([LSTOPO, "--of", "xml", "-f", str(xml)], env=dict(os.environ, HWLOC_FSROOT=str(root.parent) + "/"),
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    theirs = hwloc_xml.load(str(xml))
    assert values(theirs, STANDARD) == values(mine, STANDARD)
    a, b = tiers.figures(theirs), tiers.figures(mine)
    assert a.firmware.accesses == b.firmware.accesses
    # the same tiers from either reading (hwloc 2.9 keeps no kernel tier: compare the rest)
    same = [(x.node, x.tier, x.nearest, x.latency_ratio, x.bandwidth_ratio) for x in tiers.classify(theirs, firmware=a.firmware)]
    assert same == [(x.node, x.tier, x.nearest, x.latency_ratio, x.bandwidth_ratio)
                    for x in tiers.classify(mine, firmware=b.firmware)]


@needs_lstopo
def test_real_lstopo_reads_tilewise_export_and_back(trees, tmp_path):
    _, t, _, _ = trees("epyc9654x2_cxl2")
    m = measured({(0, 0): 112.5, (0, 2): 261.0, (1, 3): 270.2}, {(0, 0): 380.25, (0, 2): 52.0, (1, 3): 26.5})
    t.memattrs.update(tiers.measured_memattrs(t, m))
    try:
        out = tmp_path / "tilewise.xml"
        hwloc_xml.save(t, str(out))
        shown = subprocess.run([LSTOPO, "--input", str(out), "--memattrs"], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        block = shown.stdout.split("name `tilewise:MeasuredReadBandwidth'")[1].split("Memory attribute")[0]
        assert sorted(int(x) for x in __import__("re").findall(r"= (\d+) from", block)) == [26500, 52000, 380250]
        assert "name `ReadBandwidth'" in shown.stdout and "= 64000 from" in shown.stdout
        again = tmp_path / "again.xml"
        cp = subprocess.run([LSTOPO, "--input", str(out), "--of", "xml", "-f", str(again)], capture_output=True, text=True)
        assert cp.returncode == 0, cp.stderr
        back = hwloc_xml.load(str(again))
        names = STANDARD + (tiers.MEASURED_LATENCY, tiers.MEASURED_READ_BW, tiers.MEASURED_TRUSTED, "tilewise:MemoryTier")
        assert values(back, names) == values(t, names)
        f = tiers.figures(back)
        assert f.measured[(0, 2)] == {"trusted": True, "why_untrusted": None, "latency_ns": 261.0, "read_bw_gbs": 52.0}
        near = tiers.nearest_initiators(back, 2, measured=f.measured, firmware=f.firmware)
        assert near.source == tiers.SRC_MEASURED and near.initiators == (0,)
    finally:
        for k in (tiers.MEASURED_LATENCY, tiers.MEASURED_READ_BW, tiers.MEASURED_TRUSTED):
            t.memattrs.pop(k, None)


def test_topo_says_what_each_tier_was_decided_on(trees):
    _, t, _, _ = trees("asymmetric_reversed")
    text = "\n".join(render.tree_lines(t))
    assert "Memory tiers (kernel: tier 4 = node(s) 0-1; tier 6 = node(s) 2-3):" in text
    assert "node 2: far; nearest CPUs: node(s) 1 by firmware (HMAT) (240 ns)" in text
    doc = render.to_json(t)["memory_tiers"]
    assert [x["tier"] for x in doc] == ["near", "near", "far", "far"] and doc[3]["nearest"]["initiators"] == [0]


def test_topo_falls_back_to_slit_and_measured_wins(tmp_path):
    from tilewise import topology

    t = topology.load(str(__import__("pathlib").Path(__file__).parent / "fixtures" / "epyc9654_cxl.xml"))
    text = "\n".join(render.tree_lines(t))
    assert "node 1: far; nearest CPUs: node(s) 0 by SLIT distance (50); decided on SLIT distance" in text
    t.memattrs.update(tiers.measured_memattrs(t, measured({(0, 0): 100.0, (0, 1): 300.0}, {(0, 0): 200.0, (0, 1): 50.0})))
    text = "\n".join(render.tree_lines(t))
    assert "node 1: far; nearest CPUs: node(s) 0 by measured (300 ns); latency 3.00x, read bandwidth 0.25x" in text
    t.memattrs.update(tiers.measured_memattrs(t, measured({(0, 0): 100.0, (0, 1): 300.0}, {}, trusted=False)))
    assert "by SLIT distance" in "\n".join(render.tree_lines(t))  # untrusted (emulated) figures are not used
