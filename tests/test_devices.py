"""PCI devices (GPUs, accelerators, NICs) from sysfs and NVML; `--device cuda[:N|:UUID]` resolution;
`probe gpu`'s cases, summary and table; its one-line refusal where no GPU is present."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tilewise import devices, nic, topology
from tilewise.errors import TilewiseError, UsageError
from tilewise.topology import hwloc_xml, pci

FIX = Path(__file__).parent / "fixtures" / "devices"
sys.path.insert(0, str(FIX))
import make as trees  # noqa: E402  (tests/fixtures/devices/make.py: the saved sysfs trees)

LSTOPO = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")


def _sysfs(tmp_path, name="two-socket-gpu-no-node"):
    return trees.build(name, tmp_path / name) / "sys"


def test_sysfs_devices_with_nodes_and_local_cpus(tmp_path):
    devs = devices.read_sysfs(_sysfs(tmp_path))
    by = {d.address: d for d in devs}
    assert list(by) == ["0000:07:00.0", "0000:41:00.0", "0000:81:00.0", "0000:c1:00.0"]
    a100 = by["0000:07:00.0"]
    assert (a100.kind, a100.vendor, a100.numa_node, a100.local_cpus[:2]) == ("gpu", "NVIDIA", 1, (8, 9))
    h100 = by["0000:c1:00.0"]
    assert h100.numa_node is None and len(h100.local_cpus) == 16  # node -1: say so, keep local_cpulist
    cx6 = by["0000:41:00.0"]
    assert cx6.kind == "nic" and cx6.os_devices == ("ib0", "mlx5_0")
    assert [d.address for d in devices.read_sysfs(_sysfs(tmp_path), kinds=("gpu",))] == ["0000:07:00.0", "0000:81:00.0",
                                                                                      "0000:c1:00.0"]
    assert devices.read_sysfs(tmp_path / "missing") == []


def test_sysfs_topology_carries_its_devices(tmp_path):
    t = topology.load(f"sysfs:{_sysfs(tmp_path, 'workstation-1gpu')}")
    assert [(d.kind, d.address, d.numa_node) for d in t.devices] == [("gpu", "0000:01:00.0", None),
                                                                      ("nic", "0000:05:00.0", None)]
    assert t.gpus[0].os_devices == ("card0", "renderD128") and t.nics[0].os_devices == ("enp5s0",)
    # one node: a GPU without firmware node is on it
    assert pci.locate(t.gpus[0], {n.id: n.cpus for n in t.cpu_nodes})[0] == 0


@pytest.mark.parametrize("name", sorted(trees.TREES))
def test_tilewise_places_sysfs_devices_where_lstopo_does(tmp_path, name):
    """The same tree read by tilewise (sysfs) and by real lstopo (the XML beside make.py): the same
    devices, and pci.locate picks the node hwloc hangs each device from (none for c1:00.0)."""
    t = topology.load(f"sysfs:{_sysfs(tmp_path, name)}")
    x = topology.load(str(FIX / f"{name}.xml"))
    assert [d.address for d in t.devices] == [d.address for d in x.devices]
    nodes = {n.id: n.cpus for n in t.cpu_nodes}
    for d, h in zip(t.devices, x.devices):
        hwloc_node = h.numa_node if len(t.numa_nodes) > 1 else 0 if h.numa_node is None else h.numa_node
        assert pci.locate(d, nodes)[0] == hwloc_node, d.address
        assert (d.vendor_id, d.device_id, d.class_code >> 8) == (h.vendor_id, h.device_id, h.class_code >> 8)


def test_g4dn_metal_export_has_8_gpus_4_per_node_and_the_nics():
    t = topology.load(str(FIX / "g4dn-metal.xml"))
    assert t.summary().startswith("2 packages, 2 NUMA nodes")
    assert [(g.index, g.numa_node) for g in t.gpus] == [(i, i // 4) for i in range(8)]
    g0 = t.gpus[0]
    assert (g0.name, g0.uuid, g0.memory_bytes, g0.address) == (
        "Tesla T4", "GPU-029490c8-a116-638b-7018-1a6b7a9002ef", 15472384 * 1024, "0000:18:00.0")
    assert g0.local_cpus == tuple(range(24)) + tuple(range(48, 72)) and g0.source == "hwloc"
    assert [(d.address, d.os_devices, d.numa_node) for d in t.nics] == [
        ("0000:c5:00.0", ("rdmap197s0",), 1), ("0000:c6:00.0", ("eth0",), 1)]
    assert nic.nic_numa_node("eth0", devices=t.devices) == 1  # one device model for NICs too


def test_export_keeps_devices_and_real_lstopo_reads_it(tmp_path):
    t = topology.load(str(FIX / "g4dn-metal.xml"))
    out = tmp_path / "g4dn-export.xml"
    hwloc_xml.save(t, out)
    back = topology.load(str(out))
    assert back.devices == tuple(replace(d, os_devices=d.os_devices) for d in t.devices)
    two = topology.load(str(FIX / "two-socket-gpu-no-node.xml"))
    hwloc_xml.save(two, tmp_path / "two.xml")
    assert [(d.address, d.numa_node) for d in topology.load(str(tmp_path / "two.xml")).devices] == [
        (d.address, d.numa_node) for d in two.devices]  # the node -1 GPU hangs from the Machine again
    if LSTOPO is None:
        pytest.skip("no lstopo here (apt-get install hwloc)")
    text = subprocess.run([LSTOPO, "--input", str(out), "--of", "console"], capture_output=True, text=True,
                          check=True).stdout
    assert text.count("(3D)") == 8 and 'CoProc(CUDA) "cuda7"' in text and 'GPU(NVML) "nvml0"' in text
    assert 'Net "eth0"' in text and 'OpenFabrics "rdmap197s0"' in text
    pkg1 = text.split("Package L#1", 1)[1]
    assert 'cuda4' in pkg1 and 'cuda3' not in pkg1  # each GPU under its node's package


def test_topo_shows_and_lists_devices(cli):
    cp = cli("topo", "--topology", str(FIX / "g4dn-metal.xml"))
    assert cp.returncode == 0, cp.stderr
    assert "GPU 0000:18:00.0 Tesla T4 [10de:1eb8]  NUMA P#0, local cpus 0-23,48-71" in cp.stdout
    assert "NIC 0000:c6:00.0 Elastic Network Adapter (ENA) [1d0f:ec20]  NUMA P#1" in cp.stdout
    doc = json.loads(cli("topo", "--topology", str(FIX / "two-socket-gpu-no-node.xml"), "--json").stdout)
    assert [(d["address"], d["kind"], d["numa_node"]) for d in doc["devices"]] == [
        ("0000:07:00.0", "gpu", 1), ("0000:41:00.0", "nic", 0), ("0000:81:00.0", "gpu", 0), ("0000:c1:00.0", "gpu", None)]


def _gpus(tmp_path) -> devices.Gpus:
    nvml = [devices.NvmlGpu(0, "GPU-5a0b3d41-1f3c-0c1e-9a86-2f0f6f1f0a11", "NVIDIA A100-SXM4-40GB", 40 * 2**30,
                            devices.normalize_address("00000000:07:00.0")),
            devices.NvmlGpu(1, "GPU-9c2e7f00-aaaa-bbbb-cccc-0123456789ab", "NVIDIA H100 80GB HBM3", 80 * 2**30,
                            devices.normalize_address("00000000:C1:00.0"))]
    devs = devices.merge_nvml(devices.read_sysfs(_sysfs(tmp_path), kinds=("gpu",)), nvml)
    return devices.Gpus(tuple(d for d in devs if d.address != "0000:81:00.0"), "NVIDIA driver 550.54.15")


def test_nvml_facts_join_sysfs_by_pci_address(tmp_path):
    g = _gpus(tmp_path)
    a100, h100 = g.cuda
    assert (a100.index, a100.name, a100.numa_node, a100.os_devices) == (0, "NVIDIA A100-SXM4-40GB", 1, ("cuda0", "nvml0"))
    assert h100.memory_bytes == 80 * 2**30 and h100.numa_node is None and h100.source == "sysfs+nvml"
    assert json.loads(json.dumps(h100.to_json()))["local_cpus"] == "0-15"


def test_resolve_cuda_by_index_and_uuid(tmp_path):
    g = _gpus(tmp_path)
    assert devices.resolve_cuda("cuda", g).index == 0
    assert devices.resolve_cuda("cuda:1", g).name.startswith("NVIDIA H100")
    assert devices.resolve_cuda("cuda:GPU-9c2e", g).index == 1
    assert devices.resolve_cuda("CUDA:5a0b3d41", g).index == 0  # a UUID without its GPU- prefix
    with pytest.raises(UsageError, match=r"there is no GPU 2 here; GPUs here: 0 \(NVIDIA A100"):
        devices.resolve_cuda("cuda:2", g)
    with pytest.raises(UsageError, match="no GPU has UUID GPU-ffff"):
        devices.resolve_cuda("cuda:GPU-ffff", g)
    with pytest.raises(UsageError, match="start of 2 GPUs"):
        devices.resolve_cuda("cuda:GPU-", g)
    with pytest.raises(UsageError, match="not a device"):
        devices.resolve_cuda("rocm:0", g)


def test_no_cuda_gpu_is_one_line_saying_what_is_here(tmp_path):
    g = devices.Gpus(tuple(devices.read_sysfs(_sysfs(tmp_path), kinds=("gpu",))), "no NVIDIA driver (NVML: Driver Not Loaded)")
    with pytest.raises(TilewiseError, match=r"sysfs shows 3 NVIDIA GPU\(s\) \(0000:07:00.0, 0000:81:00.0, 0000:c1:00.0\) but "
                                            r"CUDA cannot use them: no NVIDIA driver"):
        devices.resolve_cuda("cuda", g)
    with pytest.raises(TilewiseError, match="no NVIDIA GPU in sysfs"):
        devices.resolve_cuda("cuda:0", devices.Gpus((), "nvidia-ml-py is not installed"))


def test_this_machine_reads_without_assuming_anything():
    g = devices.discover()
    assert all(d.kind in ("gpu", "accelerator") for d in g.devices) and g.driver


# ---- probe gpu (the decisions and the table; the measurement needs a GPU) --------------------------------

def test_probe_gpu_cases_summary_and_table(tmp_path):
    from rich.console import Console

    from tilewise.probes import gpu as gp
    from tilewise.results.kinds import gpu as kind

    t = topology.load("synthetic:Package:2 [NUMANode(memory=64GB)] L3Cache:1 Core:4 PU:1")
    a100 = _gpus(tmp_path).cuda[0]  # on node 1
    cs = gp.cases(t, [a100])
    assert [(c.node, c.local, c.cpus) for c in cs] == [(0, False, (0, 1, 2, 3)), (1, True, (4, 5, 6, 7))]
    with pytest.raises(UsageError, match="node"):
        gp.cases(t, [a100], nodes=(7,))

    def fig(local):
        base = 24.0 if local else 12.0
        return {f"{d}_{m}": {"median": base / (1 if m == "pinned" else 2), "best": base, "reps": [base]}
                for d in gp.DIRECTIONS for m in gp.MEMORY}

    results = [c.to_json() | {"gbs": fig(c.local)} for c in cs]
    s = gp.summarize(results)[0]
    assert s["local_node"] == 1 and s["figures"]["h2d_pinned"]["remote_to_local"] == 0.5
    assert s["pinned_to_pageable"] == {"h2d": 2.0, "d2h": 2.0}
    doc = {"kind": "probe.gpu", "size_bytes": 2**28, "reps": 1, "cases": results, "summary": [s]}
    typed = kind.KIND.view(doc)
    assert typed.to_json() == doc  # the typed view keeps every key
    con = Console(record=True, width=160)
    kind.render(typed, con)
    text = con.export_text()
    assert "24.0 (24.0)" in text and "0.50x of the local node's" in text
    assert len(kind.metrics(typed)) == 8 and kind.csv_files(typed)["gpu.csv"].count("\n") == 9
    assert kind.plots(typed, tmp_path) == [tmp_path / "gpu.png"]


@pytest.mark.skipif(bool(devices.discover().cuda), reason="a CUDA GPU is present: the refusal does not apply")
def test_probe_gpu_refuses_in_one_line_without_a_gpu(cli):
    cp = cli("probe", "gpu")
    assert cp.returncode == 1 and cp.stderr.startswith("Error: --device cuda: no CUDA GPU here")
    assert len(cp.stderr.strip().splitlines()) == 1


@pytest.mark.device
@pytest.mark.skipif(not devices.discover().cuda, reason="no CUDA GPU here (NVML finds none)")
def test_probe_gpu_measures_pinned_and_pageable_per_node(cli, tmp_path):
    cp = cli("probe", "gpu", "--size", "64MiB", "--reps", "5", "--json", "--out", str(tmp_path), timeout=600)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["complete"] and any(c["local"] for c in doc["cases"])
    for c in doc["cases"]:
        assert c["verification"]["ok"] and c["gbs"]["h2d_pinned"]["median"] > 0
        assert c["pages_on_node"]["pinned"] > 0.9  # pinned host memory landed on the bound node
    assert (tmp_path / "gpu.csv").is_file()


@pytest.mark.device
@pytest.mark.skipif(not devices.discover().cuda, reason="no CUDA GPU here (NVML finds none)")
def test_exec_in_a_gpu_tile_sees_only_its_gpu_bound_to_its_node(cli):
    """On this machine: tile 0 of --policy gpu runs bound to its GPU's node, sees one GPU (its UUID),
    and verification reads the CPU mask, the memory policy and the GPU back."""
    pytest.importorskip("torch")
    code = ("import os, torch; torch.zeros(1, device='cuda'); "
            "print(torch.cuda.device_count(), os.environ['CUDA_VISIBLE_DEVICES'])")
    cp = cli("exec", "--policy", "gpu", "--instance", "0", "--json", "--", sys.executable, "-c", code, timeout=300)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    inst, v = doc["instance"], doc["verification"]
    assert inst["gpu_uuid"] and doc["binding"]["gpu"] == inst["gpu_uuid"]
    assert v["checks"]["cpus"]["state"] == "verified" and v["checks"]["memory"]["state"] == "verified"
    assert v["checks"]["gpu"]["state"] in ("verified", "not checkable") and v["ok"]
    assert cp.stderr.strip().splitlines()[-1] == f"1 {inst['gpu_uuid']}"


@pytest.mark.parametrize("name,gpus,per_node", [("power8-4gpu", 4, 2), ("nvidia-dgx2", 16, 8)])
def test_hwloc_test_suite_gpu_exports(name, gpus, per_node):
    """hwloc's own 3.0 exports (POWER8 + 4 P100, DGX-2 + 16 V100): tilewise reads their PCIDev/OSDev
    objects, and hwloc 3.0's 2.x rewrite of them, which Debian's lstopo reads, gives the same devices."""
    t = topology.load(str(FIX / f"{name}.xml"))
    v2 = topology.load(str(FIX / f"{name}-as-v2.xml"))
    assert [(g.address, g.numa_node, g.uuid) for g in t.gpus] == [(g.address, g.numa_node, g.uuid) for g in v2.gpus]
    assert len(t.gpus) == gpus and [g.numa_node for g in t.gpus] == [i // per_node for i in range(gpus)]
    assert all(g.uuid.startswith("GPU-") and g.name.startswith("Tesla") for g in t.gpus)
    assert [g.index for g in t.gpus] == list(range(gpus))
    assert all(d.is_gpu for d in t.devices)  # NVSwitches (class 0680) are not kept
    if name == "power8-4gpu":
        assert t.gpus[0].address == "0002:01:00.0" and t.gpus[0].memory_bytes == 16671616 * 1024
    if LSTOPO is not None:
        text = subprocess.run([LSTOPO, "--input", str(FIX / f"{name}-as-v2.xml"), "--of", "console"],
                              capture_output=True, text=True, check=True).stdout
        assert text.count("(3D)") == gpus


def test_nvml_reading_through_nvidia_ml_py(monkeypatch, tmp_path):
    """read_nvml/process_gpus/with_nvml against nvidia-ml-py's API (a stand-in module: no driver
    here), one NVML session each, shut down on every path."""
    import types

    calls = []
    gpus = [("GPU-aaaa", "NVIDIA A100-SXM4-40GB", 40 << 30, "00000000:07:00.0", [4242]),
            ("GPU-bbbb", "NVIDIA H100 80GB HBM3", 80 << 30, "00000000:C1:00.0", [])]
    nv = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(gpus), nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetUUID=lambda h: h[0].encode(), nvmlDeviceGetName=lambda h: h[1],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=h[2]),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=h[3].encode()),
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=p) for p in h[4]])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    found, why = devices.read_nvml()
    assert why == "NVIDIA driver 550.54.15" and [(g.index, g.uuid, g.pci_address) for g in found] == [
        (0, "GPU-aaaa", "0000:07:00.0"), (1, "GPU-bbbb", "0000:c1:00.0")]
    assert devices.process_gpus(4242) == (["GPU-aaaa"], "NVML") and devices.process_gpus(1) == ([], "NVML")
    t = topology.load(f"sysfs:{_sysfs(tmp_path)}")
    withn = devices.with_nvml(t)
    assert [(g.address, g.uuid, g.index) for g in withn.gpus] == [
        ("0000:07:00.0", "GPU-aaaa", 0), ("0000:81:00.0", None, None), ("0000:c1:00.0", "GPU-bbbb", 1)]
    assert calls.count("init") == calls.count("shutdown") == 4
    nv.nvmlDeviceGetCount = lambda: 1 / 0
    assert devices.read_nvml()[0] is None and "NVML failed" in devices.read_nvml()[1]
    assert calls.count("init") == calls.count("shutdown")


@pytest.mark.parametrize("attr,value", [("pci_busid", "zz"), ("pci_type", "nonsense"), ("pci_type", "")])
def test_malformed_pcidev_is_one_error(attr, value):
    text = (FIX / "workstation-1gpu.xml").read_text()
    old = 'pci_busid="0000:01:00.0"' if attr == "pci_busid" else 'pci_type="0300 [10de:2684] [10de:0000] f'
    start = text.index(old)
    end = text.index('"', start + len(attr) + 2) + 1
    with pytest.raises(UsageError, match="PCIDev with pci_busid="):
        hwloc_xml.load("bad.xml", text=text[:start] + f'{attr}="{value}"' + text[end:])


def test_a_pcidev_listed_twice_keeps_the_first_with_a_warning():
    text = (FIX / "workstation-1gpu.xml").read_text().replace('pci_busid="0000:05:00.0"', 'pci_busid="0000:01:00.0"')
    t = hwloc_xml.load("dup.xml", text=text)
    assert [d.kind for d in t.devices] == ["gpu"]
    assert {"level": "warning", "text": "two PCIDev objects with pci_busid 0000:01:00.0: the first is kept"} in t.notes
