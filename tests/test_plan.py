"""Planner decisions on the real machines of the studies (loaded from real hwloc XML fixtures)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fixtures.machines import machines
from tilewise import plan, topology
from tilewise.errors import UsageError
from tilewise.topology import synthetic

from conftest import FIXTURES

MACHINES = machines()


@pytest.fixture(scope="module")
def topo():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = topology.load(str(FIXTURES / f"{name}.xml"))
        return cache[name]
    return get


def cpus_of(t, inst):
    return {t.core_of_cpu[c].id for c in inst.cpus}


def assert_partition(t, p, smt=False):
    """Instances are disjoint and together use every usable core (primary threads unless smt)."""
    seen = [c for i in p.instances for c in i.cpus]
    assert len(seen) == len(set(seen))
    want = sorted(p2 for c in t.cores for p2 in t.core_cpus(c, smt))
    assert sorted(seen) == want


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_policy_partitions_the_cores(topo, name):
    t = topo(name)
    for pol in ("wim", "win", "wicp", "wicp-mixed", "wic"):
        assert_partition(t, plan.plan(t, pol))
    if len(t.cpu_nodes) > 1:
        assert_partition(t, plan.plan(t, "spread"))


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_instance_counts(topo, name):
    t = topo(name)
    exp = MACHINES[name].expect
    assert len(plan.plan(t, "wim").instances) == 1
    assert len(plan.plan(t, "win").instances) == exp["nodes"] - exp.get("cpuless", 0)
    assert len(plan.plan(t, "wicp").instances) == exp["l3"]
    assert len(plan.plan(t, "wicp-mixed").instances) == exp["l3"]
    assert len(plan.plan(t, "wic").instances) == exp["cores"]
    assert len(plan.plan(t, "wic", smt=True).instances) == exp["cores"]


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_policy_shapes(topo, name):
    t = topo(name)
    for i in plan.plan(t, "wicp").instances:  # exactly one whole L3; membind to the node(s) holding it
        assert len(i.l3_domains) == 1
        d = t.l3_by_id[i.l3_domains[0]]
        assert set(i.cpus) == {c.primary for c in t.cores if c.l3 == d.id}
        assert i.mem_policy == "membind" and i.mem_nodes == i.numa_nodes == d.numa_nodes
    for i in plan.plan(t, "win").instances:  # membind to its own node, all its cores
        assert i.mem_policy == "membind" and i.mem_nodes == i.numa_nodes and len(i.mem_nodes) == 1
        assert set(i.cpus) == {c.primary for c in t.cores if c.numa_node == i.mem_nodes[0]}
    for i in plan.plan(t, "wic").instances:  # one core each, local memory
        assert len(i.cpus) == 1 and i.mem_policy == "local"
    for i in plan.plan(t, "wic", smt=True).instances:
        assert len(cpus_of(t, i)) == 1 and len(i.cpus) == t.smt
    for i in plan.plan(t, "wim").instances:
        assert i.mem_policy == "first-touch" and len(i.cpus) == len(t.cores)


@pytest.mark.parametrize("name", [n for n, s in MACHINES.items() if s.expect["l3"] > s.expect["nodes"]])
def test_wicp_mixed_takes_one_core_from_each_l3(topo, name):
    t = topo(name)
    per_l3 = {d.id: sum(1 for c in t.cores if c.l3 == d.id) for d in t.l3_domains}
    local = plan.plan(t, "wicp")
    mixed = plan.plan(t, "wicp-mixed")
    assert sorted(i.cores for i in mixed.instances) == sorted(i.cores for i in local.instances)
    for i in mixed.instances:
        l3s = [t.core_of_cpu[c].l3 for c in i.cpus]
        assert len(l3s) == len(set(l3s)), "one core from each L3"
        assert len(l3s) == min(per_l3.values())
        assert i.mem_policy == "interleave" and len(i.numa_nodes) == 1


@pytest.mark.parametrize("name", [n for n, s in MACHINES.items() if s.expect["nodes"] - s.expect.get("cpuless", 0) > 1])
def test_spread_puts_each_instance_on_different_nodes(topo, name):
    t = topo(name)
    win, sp = plan.plan(t, "win"), plan.plan(t, "spread")
    assert len(sp.instances) == len(win.instances)
    assert sorted(i.cores for i in sp.instances) == sorted(i.cores for i in win.instances)
    for i in sp.instances:
        # its cores come from as many different nodes as possible (every node, or one node per core)
        assert len(i.numa_nodes) == min(i.cores, len(t.cpu_nodes))


def test_snc4_plans_keep_the_socket_l3_whole(topo):
    """One L3 per socket holding 4 nodes: wicp = one instance per socket L3 bound to its 4 nodes,
    win = one per node (the finer unit), wicp-mixed = wicp, n packs inside one node of the L3."""
    t = topo("spr8480x2_snc4")
    wicp = plan.plan(t, "wicp")
    assert [i.mem_nodes for i in wicp.instances] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [i.cores for i in wicp.instances] == [56, 56]
    assert any("span several NUMA nodes" in n for n in wicp.notes)
    win = plan.plan(t, "win")
    assert [i.mem_nodes for i in win.instances] == [(n,) for n in range(8)]
    assert [i.l3_domains for i in win.instances] == [(0,)] * 4 + [(1,)] * 4
    mixed = plan.plan(t, "wicp-mixed")
    assert [i.cpus for i in mixed.instances] == [i.cpus for i in wicp.instances]
    assert any("wicp-mixed is the same as wicp" in n for n in mixed.notes)
    n8 = plan.plan(t, "n", instances=8)
    assert [i.numa_nodes for i in n8.instances] == [(n,) for n in range(8)]
    n4 = plan.plan(t, "n", instances=4)
    assert [i.l3_domains for i in n4.instances] == [(0,), (0,), (1,), (1,)]
    assert [i.numa_nodes for i in n4.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    sp = plan.plan(t, "spread")
    assert all(len(i.numa_nodes) == 8 for i in sp.instances)
    auto = plan.plan(t, "auto")
    assert auto.policy == "win"
    assert any("sub-NUMA clustering" in r and "finer" in r for r in auto.reasons)


def test_mixed_l3_layouts_in_one_machine():
    """Socket 0 has two L3s in one node; socket 1 has one L3 over two nodes (hwloc synthetic can't
    say this, so build it from facts): each policy follows each socket's own nesting."""
    from tilewise.topology.build import RawNode, RawPU, build

    pus = [RawPU(c, c // 4, ("core", c), c % 4, 0 if c < 4 else (1 if c < 6 else 2), ("l3", c // 2 if c < 4 else 2))
           for c in range(8)]
    t = build(pus, [RawNode(n, 2**30) for n in range(3)], distances=None, source="test")
    assert [d.numa_nodes for d in t.l3_domains] == [(0,), (0,), (1, 2)]
    assert [i.cpus for i in plan.plan(t, "wicp").instances] == [(0, 1), (2, 3), (4, 5, 6, 7)]
    assert [i.mem_nodes for i in plan.plan(t, "wicp").instances] == [(0,), (0,), (1, 2)]
    mixed = plan.plan(t, "wicp-mixed")
    assert [i.cpus for i in mixed.instances] == [(0, 3), (1, 2), (4, 5, 6, 7)]  # j-th core of L3 (i + j) mod 2
    assert [i.mem_nodes for i in plan.plan(t, "win").instances] == [(0,), (1,), (2,)]
    auto = plan.plan(t, "auto")  # 3 L3s over 3 nodes: no unit is finer everywhere; per node
    assert auto.policy == "win" and auto.reasons
    for pol in ("wim", "win", "wicp", "wicp-mixed", "wic", "spread"):
        assert_partition(t, plan.plan(t, pol))


def test_spread_on_one_node_is_an_error(topo):
    with pytest.raises(UsageError, match="spread needs at least 2 NUMA nodes"):
        plan.plan(topo("graviton3"), "spread")


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_auto_choice(topo, name):
    p = plan.plan(topo(name), "auto")
    assert p.policy == MACHINES[name].expect["auto"]
    assert p.requested == "auto" and p.reasons


def test_epyc_wicp_instance_is_one_ccd(topo):
    t = topo("epyc7713x2")
    p = plan.plan(t, "wicp")
    assert p.instances[0].cpus == tuple(range(8))
    assert plan.plan(t, "wicp", smt=True).instances[0].cpus == tuple(range(8)) + tuple(range(128, 136))
    assert p.instances[15].cpus == tuple(range(120, 128)) and p.instances[15].mem_nodes == (1,)


def test_cpuless_node_never_gets_an_instance_but_can_be_a_memory_target(topo):
    t = topo("epyc9654_cxl")
    assert all(1 not in i.numa_nodes for i in plan.plan(t, "wic").instances)
    p = plan.plan(t, "wim", mem="interleave", mem_nodes=(0, 1))
    assert p.instances[0].mem_nodes == (0, 1)


def test_n_instances_packed_by_l3(topo):
    t = topo("epyc7713x2")
    p = plan.plan(t, "n", instances=32)
    assert [i.cores for i in p.instances] == [4] * 32
    assert all(len(i.l3_domains) == 1 for i in p.instances)
    p3 = plan.plan(t, "n", instances=3)
    assert sum(i.cores for i in p3.instances) == 128 and len(p3.instances) == 3
    with pytest.raises(UsageError, match="only 128 cores"):
        plan.plan(t, "n", instances=129)


def test_auto_working_set_rules():
    t = synthetic.load("Package:1 [NUMANode(memory=64GB)] L3Cache:8(size=32MiB) Core:8 PU:2")
    small = plan.plan(t, "auto", hints=plan.AutoHints(working_set_bytes=16 * 2**20))
    mid = plan.plan(t, "auto", hints=plan.AutoHints(working_set_bytes=200 * 2**20))
    big = plan.plan(t, "auto", hints=plan.AutoHints(working_set_bytes=10 * 2**30))
    assert (small.policy, mid.policy, big.policy) == ("wicp", "wicp-mixed", "wicp")
    assert plan.plan(t, "auto", hints=plan.AutoHints(engine_threads="single")).policy == "wic"
    assert plan.plan(t, "auto", hints=plan.AutoHints(skewed=True)).policy == "wim"


def test_auto_uses_measured_latency():
    t = synthetic.load("Package:1 [NUMANode] L3Cache:2 Core:2 PU:1")
    flat = [[0 if i == j else 50 for j in range(4)] for i in range(4)]
    t.measurements["latency_ns"] = {"cpus": [0, 1, 2, 3], "values": flat}
    p = plan.plan(t, "auto")
    assert p.policy == "wim" and "below" in " ".join(p.reasons)
    gap = [[0 if i == j else (20 if i // 2 == j // 2 else 90) for j in range(4)] for i in range(4)]
    t.measurements["latency_ns"] = {"cpus": [0, 1, 2, 3], "values": gap}
    p = plan.plan(t, "auto")
    assert p.policy == "wicp" and "4.50x" in " ".join(p.reasons)


def test_allowed_cpus_restrict_the_plan():
    t = synthetic.load("Package:1 [NUMANode] L3Cache:2 Core:2 PU:1")
    t2 = topology.model.Topology(t.packages, t.numa_nodes, t.l3_domains, t.cores, t.distances, "x", allowed_cpus=(0, 1, 2))
    assert plan.plan(t2, "wic").instances[-1].cpus == (2,)
    assert len(plan.plan(t2, "wic").instances) == 3


def test_bad_requests():
    t = synthetic.load("Core:2 PU:1")
    with pytest.raises(UsageError, match="unknown policy"):
        plan.plan(t, "nope")
    with pytest.raises(UsageError, match="unknown memory policy"):
        plan.plan(t, "wim", mem="everywhere")
    with pytest.raises(UsageError, match="do not exist"):
        plan.plan(t, "wim", mem_nodes=(3,))
    with pytest.raises(UsageError, match="--instances applies to policy n"):
        plan.plan(t, "wic", instances=2)


def test_plan_json_round_trip(topo):
    p = plan.plan(topo("spr8480x2_snc4"), "win")
    assert plan.Plan.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_plan_cli(cli):
    xml = str(FIXTURES / "epyc7713x2.xml")
    doc = json.loads(cli("plan", "--topology", xml, "--policy", "wicp", "--json", check=True).stdout)
    assert doc["policy"] == "wicp" and len(doc["instances"]) == 16
    assert doc["instances"][0]["cpus"] == list(range(8)) and doc["instances"][0]["mem_nodes"] == [0]
    assert doc["instances"][0]["mem_policy"] == "membind"
    auto = json.loads(cli("plan", "--topology", xml, "--json", check=True).stdout)
    assert auto["policy"] == "wicp" and auto["reasons"]
    text = cli("plan", "--topology", xml, "--policy", "auto", check=True).stdout
    assert "because" in text and "wicp" in text
    k = json.loads(cli("plan", "--topology", xml, "--instances", "4", "--json", check=True).stdout)
    assert k["policy"] == "n" and len(k["instances"]) == 4


@pytest.mark.parametrize("args,msg", [
    (["--policy", "bogus"], "unknown policy"),
    (["--instances", "999"], "only 128 cores"),
    (["--policy", "wicp", "--mem", "sideways"], "unknown memory policy"),
])
def test_plan_cli_errors(cli, args, msg):
    cp = cli("plan", "--topology", str(FIXTURES / "epyc7713x2.xml"), *args)
    assert cp.returncode != 0 and msg in cp.stderr
    assert cp.stderr.startswith("Error: ") and "Traceback" not in cp.stderr


def test_plan_cli_on_malformed_file(cli, tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("not xml")
    cp = cli("plan", "--topology", str(bad))
    assert cp.returncode != 0 and cp.stderr.startswith("Error: ") and "Traceback" not in cp.stderr


# ---- policy gpu: one tile per GPU (fixtures: tests/fixtures/devices) -----------------------------

GPU_FIX = FIXTURES / "devices"


def _gpu_topo(name):
    return topology.load(str(GPU_FIX / f"{name}.xml"))


def test_policy_gpu_one_tile_per_gpu_node_cores_shared_fairly():
    t = _gpu_topo("g4dn-metal")  # 8 T4, 4 per node, 24 cores per node
    p = plan.plan(t, "gpu")
    assert p.policy == "gpu" and len(p.instances) == 8
    for i, inst in enumerate(p.instances):
        node = i // 4
        assert inst.numa_nodes == (node,) and inst.mem_policy == "membind" and inst.mem_nodes == (node,)
        assert inst.cores == 6 and inst.gpu == t.gpus[i].address and inst.gpu_uuid == t.gpus[i].uuid
    assert [inst.cpus for inst in p.instances[:2]] == [tuple(range(6)), tuple(range(6, 12))]
    assert not set(p.instances[0].cpus) & set(p.instances[1].cpus)
    assert "node 0: 4 GPUs share its 24 cores fairly (6, 6, 6, 6 cores)" in p.reasons
    smt = plan.plan(t, "gpu", smt=True)  # siblings follow their cores
    assert smt.instances[0].cpus == (0, 1, 2, 3, 4, 5, 48, 49, 50, 51, 52, 53)
    doc = p.to_json()["instances"][3]
    assert doc["gpu"] == "0000:36:00.0" and plan.Plan.from_json(p.to_json()).instances[3] == p.instances[3]
    assert "gpu" not in plan.plan(t, "win").to_json()["instances"][0]  # CPU tiles keep their document


def test_policy_gpu_uneven_and_short_of_cores():
    t = _gpu_topo("g4dn-metal")
    odd = replace(t, allowed_cpus=tuple(range(22)) + tuple(range(24, 48)))  # node 0: 22 cores for 4 GPUs
    assert [i.cores for i in plan.plan(odd, "gpu").instances[:4]] == [6, 6, 5, 5]
    few = replace(t, allowed_cpus=(0, 1, 24, 25, 26, 27))  # node 0: 2 cores for 4 GPUs
    p = plan.plan(few, "gpu")
    assert [i.cpus for i in p.instances[:4]] == [(0,), (1,), (0,), (1,)]
    assert any("tiles share cores" in n for n in p.notes)


def test_policy_gpu_node_unknown_picks_by_local_cpus_or_refuses():
    ws = plan.plan(_gpu_topo("workstation-1gpu"), "gpu")  # -1 on a one-node desktop: that node
    assert [(i.numa_nodes, i.cores) for i in ws.instances] == [((0,), 8)]
    assert "no UUID known" in " ".join(ws.notes)
    t = _gpu_topo("two-socket-gpu-no-node")
    with pytest.raises(UsageError, match=r"0000:c1:00.0: the firmware reports no NUMA node \(-1\) and its local CPUs "
                                         r"0-15 span nodes 0-1: its node is unknown"):
        plan.plan(t, "gpu")
    known = replace(t, devices=tuple(d for d in t.devices if d.address != "0000:c1:00.0"))
    p = plan.plan(known, "gpu")  # 81:00.0: node -1 in sysfs, local CPUs of node 0 (hwloc hangs it there)
    assert [(i.gpu, i.numa_nodes, i.cores) for i in p.instances] == [("0000:81:00.0", (0,), 8), ("0000:07:00.0", (1,), 8)]


def test_policy_gpu_without_gpus_is_one_error(topo, cli):
    with pytest.raises(UsageError, match="--policy gpu: no GPU in this topology"):
        plan.plan(topo("epyc7713x2"), "gpu")
    cp = cli("plan", "--topology", str(FIXTURES / "epyc7713x2.xml"), "--policy", "gpu")
    assert cp.returncode == 2 and cp.stderr.startswith("Error: --policy gpu: no GPU in this topology")
    assert len(cp.stderr.strip().splitlines()) == 1


def test_auto_considers_gpus_when_the_workload_can_use_them(topo):
    t = _gpu_topo("g4dn-metal")
    p = plan.plan(t, "auto", hints=plan.AutoHints(uses_gpu=True))
    assert p.policy == "gpu" and "one tile per GPU" in p.reasons[0]
    cpu = plan.plan(t, "auto")
    assert cpu.policy == "win" and "the engine runs on CPUs: GPUs are not planned" in cpu.reasons[0]
    none = plan.plan(topo("epyc7713x2"), "auto", hints=plan.AutoHints(uses_gpu=True))
    assert none.policy != "gpu" and "has none: CPU tiles" in none.reasons[0]


def test_gpu_tile_binding_env_and_verification(tmp_path):
    from tilewise import binding, verification

    inst = plan.plan(_gpu_topo("g4dn-metal"), "gpu").instances[5]
    b = binding.Binding.from_instance(inst)
    assert b.gpu == "GPU-84bc1679-aa5f-9954-5afe-8c689c01ec13" and "GPU GPU-84bc" in b.describe()
    env = binding.child_env(b, {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == b.gpu and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "environ").write_bytes(b"PATH=/bin\0CUDA_VISIBLE_DEVICES=" + b.gpu.encode() + b"\0")
    check = verification.check_gpu
    assert check(42, b.gpu, str(proc), nvml=lambda pid: ([b.gpu], "NVML")).state == verification.VERIFIED
    assert check(42, b.gpu, str(proc), nvml=lambda pid: (["GPU-other"], "NVML")).state == verification.MISMATCH
    assert "no CUDA context" in check(42, b.gpu, str(proc), nvml=lambda pid: ([], "NVML")).detail
    none = check(42, b.gpu, str(proc), nvml=lambda pid: (None, "no NVIDIA driver"))
    assert none.state == verification.NOT_CHECKABLE and "verified; which GPU it runs on: no NVIDIA driver" in none.detail
    assert check(42, "GPU-x", str(proc), nvml=lambda pid: ([b.gpu], "NVML")).state == verification.MISMATCH


def test_policy_gpu_on_hwloc_test_suite_exports():
    p8 = plan.plan(_gpu_topo("power8-4gpu"), "gpu", smt=True)  # 2 P100 per node, 4 cores SMT2 per node
    assert [(i.numa_nodes, i.cores, i.cpus) for i in p8.instances[:2]] == [((0,), 2, (0, 1, 8, 9)), ((0,), 2, (16, 17, 24, 25))]
    dgx = plan.plan(_gpu_topo("nvidia-dgx2"), "gpu")  # 8 V100 per node, 2 cores per node in this file
    assert len(dgx.instances) == 16 and [i.cpus for i in dgx.instances[:3]] == [(0,), (1,), (0,)]
    assert [i.cpus for i in dgx.instances[8:10]] == [(24,), (25,)]
    assert "node 0 has 8 GPUs but 2 usable core(s): tiles share cores" in " ".join(dgx.notes)


def test_plan_cli_gpu_tiles_and_the_unknown_node_refusal(cli):
    doc = json.loads(cli("plan", "--topology", str(GPU_FIX / "g4dn-metal.xml"), "--policy", "gpu", "--json").stdout)
    assert doc["policy"] == "gpu" and [i["gpu"] for i in doc["instances"]][:2] == ["0000:18:00.0", "0000:19:00.0"]
    assert doc["instances"][0]["gpu_uuid"] == "GPU-029490c8-a116-638b-7018-1a6b7a9002ef"
    cp = cli("plan", "--topology", str(GPU_FIX / "two-socket-gpu-no-node.xml"), "--policy", "gpu")
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1
    assert "0000:c1:00.0: the firmware reports no NUMA node (-1) and its local CPUs 0-15 span nodes 0-1" in cp.stderr


def test_policy_gpu_skips_gpus_whose_node_has_no_allowed_core():
    t = _gpu_topo("g4dn-metal")
    p = plan.plan(replace(t, allowed_cpus=tuple(range(24, 48))), "gpu")  # a container on node 1 only
    assert [i.gpu for i in p.instances] == [g.address for g in t.gpus[4:]]
    assert any("no usable core there" in n for n in p.notes)
    two = _gpu_topo("power8-4gpu")
    with pytest.raises(UsageError, match="have no usable core here"):
        plan.plan(replace(two, devices=two.gpus[:2], allowed_cpus=(80, 81)), "gpu")
