"""PCI devices (GPUs, accelerators, NICs) from sysfs and NVML; `--device cuda[:N|:UUID]` resolution;
`probe gpu`'s cases, summary and table; its one-line refusal where no GPU is present."""

from __future__ import annotations

import json

import pytest

from tilewise import devices, topology
from tilewise.errors import TilewiseError, UsageError

# The sysfs attributes of four real PCI functions (class, vendor, device as the kernel prints them):
# an NVIDIA A100-SXM4 (10de:20b0) on node 1, an H100 (10de:2330) whose firmware reports no node,
# a Mellanox ConnectX-6 (15b3:101b) and a virtio network device (1af4:1041, this build machine's).
SYSFS = {
    "0000:07:00.0": ("0x030200", "0x10de", "0x20b0", "1", "16-31"),
    "0000:c1:00.0": ("0x030200", "0x10de", "0x2330", "-1", "0-31"),
    "0000:41:00.0": ("0x020700", "0x15b3", "0x101b", "0", "0-15"),
    "0000:00:03.0": ("0x020000", "0x1af4", "0x1041", "-1", "0-1"),
    "0000:00:00.0": ("0x060000", "0x8086", "0x0d57", "-1", "0-1"),  # a host bridge: not listed
}


def _sysfs(tmp_path):
    for addr, (cls, ven, dev, node, cpus) in SYSFS.items():
        d = tmp_path / "bus" / "pci" / "devices" / addr
        d.mkdir(parents=True)
        for k, v in (("class", cls), ("vendor", ven), ("device", dev), ("numa_node", node), ("local_cpulist", cpus)):
            (d / k).write_text(v + "\n")
    (tmp_path / "bus" / "pci" / "devices" / "0000:41:00.0" / "net" / "ib0").mkdir(parents=True)
    return tmp_path


def test_sysfs_devices_with_nodes_and_local_cpus(tmp_path):
    devs = devices.read_sysfs(_sysfs(tmp_path))
    by = {d.address: d for d in devs}
    assert list(by) == ["0000:00:03.0", "0000:07:00.0", "0000:41:00.0", "0000:c1:00.0"]
    a100 = by["0000:07:00.0"]
    assert (a100.kind, a100.vendor, a100.numa_node, a100.local_cpus[:2]) == ("gpu", "NVIDIA", 1, (16, 17))
    h100 = by["0000:c1:00.0"]
    assert h100.numa_node is None and len(h100.local_cpus) == 32  # node -1: say so, keep local_cpulist
    assert by["0000:41:00.0"].kind == "nic" and by["0000:41:00.0"].os_devices == ("ib0",)
    assert [d.address for d in devices.read_sysfs(tmp_path, kinds=("gpu",))] == ["0000:07:00.0", "0000:c1:00.0"]
    assert devices.read_sysfs(tmp_path / "missing") == []


def _gpus(tmp_path) -> devices.Gpus:
    nvml = [devices.NvmlGpu(0, "GPU-5a0b3d41-1f3c-0c1e-9a86-2f0f6f1f0a11", "NVIDIA A100-SXM4-40GB", 40 * 2**30,
                            devices.normalize_address("00000000:07:00.0")),
            devices.NvmlGpu(1, "GPU-9c2e7f00-aaaa-bbbb-cccc-0123456789ab", "NVIDIA H100 80GB HBM3", 80 * 2**30,
                            devices.normalize_address("00000000:C1:00.0"))]
    devs = devices.merge_nvml(devices.read_sysfs(_sysfs(tmp_path), kinds=("gpu",)), nvml)
    return devices.Gpus(tuple(devs), "NVIDIA driver 550.54.15")


def test_nvml_facts_join_sysfs_by_pci_address(tmp_path):
    g = _gpus(tmp_path)
    a100, h100 = g.cuda
    assert (a100.index, a100.name, a100.numa_node, a100.os_devices) == (0, "NVIDIA A100-SXM4-40GB", 1, ("cuda0", "nvml0"))
    assert h100.memory_bytes == 80 * 2**30 and h100.numa_node is None
    assert json.loads(json.dumps(h100.to_json()))["local_cpus"] == "0-31"


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
    with pytest.raises(TilewiseError, match=r"sysfs shows 2 NVIDIA GPU\(s\) \(0000:07:00.0, 0000:c1:00.0\) but CUDA cannot "
                                            r"use them: no NVIDIA driver"):
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
    from tilewise.results import gpu as kind

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
    doc = {"size_bytes": 2**28, "reps": 1, "cases": results, "summary": [s]}
    con = Console(record=True, width=160)
    kind.render(doc, con)
    text = con.export_text()
    assert "24.0 (24.0)" in text and "0.50x of the local node's" in text
    assert len(kind.metrics(doc)) == 8 and kind.csv_files(doc)["gpu.csv"].count("\n") == 9


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
