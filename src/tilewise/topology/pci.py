"""PCI devices in the topology model: GPUs and other accelerators, and NICs, in one device model.

A device has its vendor, name, memory, PCI address, UUID, NUMA node and local CPUs. Where they come
from:
- sysfs, always: /sys/bus/pci/devices/*/{class,vendor,device,numa_node,local_cpulist} and the OS
  devices below (net/eth0, drm/card0, infiniband/mlx5_0). A device whose firmware reports no node
  (numa_node = -1) keeps node None and its local_cpulist.
- hwloc XML: PCIDev objects and their OSDev children (cuda0, nvml0, eth0) under the object whose
  CPUs are the device's locality (a Package or a per-node Group; the Machine when the firmware
  gave no locality). hwloc's CUDA/NVML infos give the name, memory and UUID.
- NVML, where a driver is loaded: tilewise.devices adds name, memory, UUID and the CUDA index.

`locate` decides, purely, the node a device's tile runs on, or why there is none.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tilewise import cpulist
from tilewise.errors import UsageError

VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x15B3: "Mellanox", 0x14E4: "Broadcom",
           0x1AF4: "Red Hat (virtio)", 0x1DED: "Alibaba", 0x1E52: "Tenstorrent", 0x1D0F: "Amazon"}
KINDS_LISTED = ("gpu", "accelerator", "nic")  # what the model keeps (storage, bridges, USB: not)
MEMORY_INFO = "tilewise:memory_bytes"  # on an exported PCIDev whose memory no CUDA OSDev carries
# hwloc 2.x osdev_type numbers (3.0 writes a bit mask instead: see _osdev_kind)
OSDEV_GPU, OSDEV_NETWORK, OSDEV_OPENFABRICS, OSDEV_COPROC = 1, 2, 3, 5


def kind_of(class_code: int) -> str:
    """gpu | accelerator | nic | other, from the 24-bit PCI class (base class, subclass, prog-if)."""
    base, sub = class_code >> 16, (class_code >> 8) & 0xFF
    if base == 0x03 and sub in (0x00, 0x02, 0x80):  # VGA, 3D controller, other display (AMD Instinct)
        return "gpu"
    if base == 0x12:  # processing accelerators
        return "accelerator"
    if base == 0x02:  # Ethernet, InfiniBand, other network
        return "nic"
    return "other"


@dataclass(frozen=True)
class PciDevice:
    address: str  # domain:bus:device.function, e.g. 0000:17:00.0
    kind: str  # gpu | accelerator | nic | other
    vendor_id: int
    device_id: int
    class_code: int  # 24 bits: base class, subclass, prog-if
    numa_node: int | None  # None: the firmware attaches it to no node (-1) or nothing says
    local_cpus: tuple[int, ...] = ()
    vendor: str | None = None
    name: str | None = None
    uuid: str | None = None  # NVML's GPU-xxxxxxxx-... (what CUDA_VISIBLE_DEVICES takes)
    memory_bytes: int | None = None
    index: int | None = None  # NVML / CUDA index (CUDA_DEVICE_ORDER=PCI_BUS_ID order)
    os_devices: tuple[str, ...] = field(default_factory=tuple)  # cuda0, nvml0, eth0, ...
    source: str = "sysfs"  # sysfs | hwloc | nvml (+nvml when NVML's facts were added)

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "accelerator")

    def label(self) -> str:
        what = self.name or f"{self.vendor or hex(self.vendor_id)} device {self.device_id:04x}"
        idx = f"GPU {self.index}: " if self.index is not None else ""
        return f"{idx}{what} at {self.address}"

    def to_json(self) -> dict:
        return {"address": self.address, "kind": self.kind, "vendor_id": f"0x{self.vendor_id:04x}",
                "device_id": f"0x{self.device_id:04x}", "class": f"0x{self.class_code:06x}", "vendor": self.vendor,
                "name": self.name, "numa_node": self.numa_node, "local_cpus": cpulist.format(self.local_cpus),
                "uuid": self.uuid, "memory_bytes": self.memory_bytes, "index": self.index,
                "os_devices": list(self.os_devices), "source": self.source}


def normalize_address(addr: str) -> str:
    """NVML's 00000000:17:00.0 and sysfs's 0000:17:00.0 as one form (4-digit domain, lower case)."""
    a = addr.strip().lower()
    dom, sep, rest = a.partition(":")
    if sep and rest.count(":") == 1 and len(dom) > 4:
        a = f"{int(dom, 16):04x}:{rest}"
    return a


# ---- sysfs ---------------------------------------------------------------------------------

def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except (OSError, UnicodeError):
        return None


def read_sysfs(sysfs: str | os.PathLike = "/sys", kinds: tuple[str, ...] = KINDS_LISTED) -> list[PciDevice]:
    """The PCI devices of the given kinds under <sysfs>/bus/pci/devices, in address order."""
    base = Path(sysfs) / "bus" / "pci" / "devices"
    out = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    for d in entries:
        try:
            cls = int(_read(d / "class") or "", 16)
            vendor = int(_read(d / "vendor") or "", 16)
            device = int(_read(d / "device") or "", 16)
        except ValueError:
            continue
        kind = kind_of(cls)
        if kind not in kinds:
            continue
        node_text = _read(d / "numa_node")
        try:
            node = int(node_text) if node_text is not None else None
        except ValueError:
            node = None
        cpus_text = _read(d / "local_cpulist")
        try:
            cpus = tuple(cpulist.parse(cpus_text, what=f"{d.name}/local_cpulist")) if cpus_text else ()
        except UsageError:
            cpus = ()
        osdevs = []
        for sub in ("net", "infiniband", "drm", *sorted(x.name + "/net" for x in d.glob("virtio*"))):
            try:  # virtio functions hold their interface one level down (virtio0/net/eth0)
                osdevs += sorted(x.name for x in (d / sub).iterdir() if not x.name.startswith("controlD"))
            except OSError:
                pass
        out.append(PciDevice(normalize_address(d.name), kind, vendor, device, cls,
                             node if node is not None and node >= 0 else None, cpus, VENDORS.get(vendor),
                             os_devices=tuple(osdevs)))
    return out


def sysfs_root_of(system_dir: str | os.PathLike) -> Path | None:
    """The sysfs root (holding bus/pci) of a /sys/devices/system directory or a saved copy of one."""
    p = Path(system_dir)
    if p.name == "system" and p.parent.name == "devices":
        return p.parent.parent
    return None


# ---- hwloc XML ------------------------------------------------------------------------------

_PCI_TYPE = re.compile(r"\s*([0-9a-fA-F]{4})\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")


def _infos(obj: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in obj.findall("info")}


def from_hwloc(pcidev: ET.Element, node: int | None, local_cpus: tuple[int, ...], where: str) -> PciDevice | None:
    """A PCIDev object (with its OSDev children) as a device; None for kinds the model does not
    keep. node: the NUMA node of the object it hangs from (None under the Machine)."""
    busid = (pcidev.get("pci_busid") or "").strip()
    m = _PCI_TYPE.match(pcidev.get("pci_type") or "")
    if not re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]", busid) or not m:
        raise UsageError(f"{where}: PCIDev with pci_busid={busid[:20]!r} pci_type={(pcidev.get('pci_type') or '')[:30]!r}",
                         "hwloc writes pci_busid=\"0000:17:00.0\" and pci_type=\"0302 [10de:1eb8] ...\"; "
                         "produce the file with `lstopo --of xml FILE`")
    cls = int(m.group(1), 16) << 8
    kind = kind_of(cls)
    if kind not in KINDS_LISTED:
        return None
    vendor_id, device_id = int(m.group(2), 16), int(m.group(3), 16)
    infos = _infos(pcidev)
    name = infos.get("PCIDevice") or pcidev.get("name")
    uuid = memory = index = None
    osdevs = []
    for o in pcidev.findall("object"):
        if o.get("type") != "OSDev":
            continue
        oname = o.get("name", "")
        osdevs.append(oname)
        oi = _infos(o)
        name = oi.get("GPUModel") or name
        uuid = oi.get("NVIDIAUUID") or uuid
        if oi.get("CUDAGlobalMemorySize", "").isdigit():  # KiB, as hwloc writes it
            memory = int(oi["CUDAGlobalMemorySize"]) * 1024
        if (mm := re.fullmatch(r"(?:cuda|nvml)(\d+)", oname)) and index is None:
            index = int(mm.group(1))
    if infos.get(MEMORY_INFO, "").isdigit():
        memory = int(infos[MEMORY_INFO])
    return PciDevice(normalize_address(busid), kind, vendor_id, device_id, cls, node, tuple(local_cpus),
                     VENDORS.get(vendor_id) or infos.get("PCIVendor"), name, uuid, memory, index,
                     tuple(osdevs), "hwloc")


def _osdev(parent: ET.Element, name: str, typ: int, subtype: str | None, infos: dict[str, str]) -> None:
    a = {"type": "OSDev", "name": name, "osdev_type": str(typ)}
    if subtype:
        a["subtype"] = subtype
    o = ET.SubElement(parent, "object", a)
    for k, v in infos.items():
        ET.SubElement(o, "info", {"name": k, "value": v})


def to_hwloc(parent: ET.Element, d: PciDevice, gp_index) -> None:
    """Write d below parent as hwloc 2.x XML does: a host Bridge holding the PCIDev and its OSDevs."""
    dom, bus = d.address.split(":")[:2]
    hb = ET.SubElement(parent, "object", {"type": "Bridge", "gp_index": str(next(gp_index)), "bridge_type": "0-1",
                                          "depth": "0", "bridge_pci": f"{dom}:[{bus}-{bus}]"})
    pd = ET.SubElement(hb, "object", {
        "type": "PCIDev", "gp_index": str(next(gp_index)), "pci_busid": d.address,
        "pci_type": f"{d.class_code >> 8:04x} [{d.vendor_id:04x}:{d.device_id:04x}] [0000:0000] 00",
        "pci_link_speed": "0.000000"})
    if d.vendor:
        ET.SubElement(pd, "info", {"name": "PCIVendor", "value": d.vendor})
    if d.name:
        ET.SubElement(pd, "info", {"name": "PCIDevice", "value": d.name})
    cuda_mem = d.memory_bytes is not None and d.memory_bytes % 1024 == 0 and any(o.startswith("cuda") for o in d.os_devices)
    if d.memory_bytes is not None and not cuda_mem:
        ET.SubElement(pd, "info", {"name": MEMORY_INFO, "value": str(d.memory_bytes)})
    for o in d.os_devices:
        if o.startswith("cuda"):
            infos = {"Backend": "CUDA", "GPUVendor": d.vendor or "", "GPUModel": d.name or ""}
            if cuda_mem:
                infos["CUDAGlobalMemorySize"] = str(d.memory_bytes // 1024)
            _osdev(pd, o, OSDEV_COPROC, "CUDA", infos)
        elif o.startswith("nvml"):
            infos = {"Backend": "NVML", "GPUModel": d.name or ""}
            if d.uuid:
                infos["NVIDIAUUID"] = d.uuid
            _osdev(pd, o, OSDEV_GPU, "NVML", infos)
        elif o.startswith("opencl"):
            _osdev(pd, o, OSDEV_COPROC, "OpenCL", {"Backend": "OpenCL", "GPUModel": d.name or ""})
        elif d.kind == "nic":
            ib = o.startswith(("mlx", "ib", "rdma", "hfi", "efa"))
            _osdev(pd, o, OSDEV_OPENFABRICS if ib else OSDEV_NETWORK, None, {})
        elif o.startswith(("card", "renderD")):
            _osdev(pd, o, OSDEV_GPU, None, {})


# ---- decisions ------------------------------------------------------------------------------

def locate(d: PciDevice, node_cpus: dict[int, tuple[int, ...]]) -> tuple[int | None, str]:
    """The NUMA node a tile for d runs on, and how it was found (or why there is none).

    node_cpus: the topology's CPU nodes and their CPUs. The firmware's node when it gave one;
    otherwise the one node holding all of the device's local CPUs (local_cpulist); otherwise none."""
    if d.numa_node is not None:
        if d.numa_node not in node_cpus:
            return None, f"{d.label()} is on NUMA node {d.numa_node}, which has no CPUs in this topology"
        return d.numa_node, f"{d.label()} is on NUMA node {d.numa_node} (firmware)"
    local = set(d.local_cpus)
    holders = [n for n, cpus in node_cpus.items() if local and local <= set(cpus)]
    if len(holders) == 1:
        return holders[0], (f"{d.label()}: the firmware reports no NUMA node (-1); its local CPUs "
                            f"{cpulist.format(d.local_cpus)} are all on node {holders[0]}, so node {holders[0]}")
    if len(node_cpus) == 1:
        (only,) = node_cpus
        return only, f"{d.label()}: the firmware reports no NUMA node (-1); this machine has one node, {only}"
    spread = sorted(n for n, cpus in node_cpus.items() if local & set(cpus))
    why = (f"its local CPUs {cpulist.format(d.local_cpus)} span nodes {cpulist.format(spread)}" if local
           else "it lists no local CPUs")
    return None, f"{d.label()}: the firmware reports no NUMA node (-1) and {why}: its node is unknown"
