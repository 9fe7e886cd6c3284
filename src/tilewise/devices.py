"""PCI devices attached to NUMA nodes: GPUs and other accelerators first, NICs with them.

Read from sysfs always (/sys/bus/pci/devices/*/{class,vendor,device,numa_node,local_cpulist}),
and from NVML (nvidia-ml-py) where an NVIDIA driver is loaded: name, memory, UUID and the CUDA
index. A device whose firmware reports no node (numa_node = -1) keeps node None and its
local_cpulist, so a caller can say so and pick by CPUs or refuse.

`resolve_cuda` turns `--device cuda`, `cuda:N` or `cuda:GPU-<uuid>` into one GPU, or one `Error:`
line that says what is here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from tilewise import cpulist
from tilewise.errors import TilewiseError, UsageError

VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x15B3: "Mellanox", 0x14E4: "Broadcom",
           0x1AF4: "Red Hat (virtio)", 0x1DED: "Alibaba", 0x1E52: "Tenstorrent", 0x1D0F: "Amazon"}
# PCI class (base class, subclass) -> kind
KINDS = {(0x03, 0x00): "gpu", (0x03, 0x02): "gpu", (0x12, 0x00): "accelerator", (0x02, 0x00): "nic",
         (0x02, 0x07): "nic", (0x02, 0x80): "nic"}


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

    def label(self) -> str:
        what = self.name or f"{self.vendor or hex(self.vendor_id)} device {self.device_id:04x}"
        idx = f"GPU {self.index}: " if self.index is not None else ""
        return f"{idx}{what} at {self.address}"

    def to_json(self) -> dict:
        return {"address": self.address, "kind": self.kind, "vendor_id": f"0x{self.vendor_id:04x}",
                "device_id": f"0x{self.device_id:04x}", "class": f"0x{self.class_code:06x}", "vendor": self.vendor,
                "name": self.name, "numa_node": self.numa_node, "local_cpus": cpulist.format(self.local_cpus),
                "uuid": self.uuid, "memory_bytes": self.memory_bytes, "index": self.index,
                "os_devices": list(self.os_devices)}


def normalize_address(addr: str) -> str:
    """NVML's 00000000:17:00.0 and sysfs's 0000:17:00.0 as one form (4-digit domain, lower case)."""
    a = addr.strip().lower()
    dom, sep, rest = a.partition(":")
    if sep and rest.count(":") == 1 and len(dom) > 4:
        a = f"{int(dom, 16):04x}:{rest}"
    return a


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def read_sysfs(sysfs: str | os.PathLike = "/sys", kinds: tuple[str, ...] = ("gpu", "accelerator", "nic")) -> list[PciDevice]:
    """The PCI devices of the given kinds under sysfs/bus/pci/devices, in address order."""
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
        kind = KINDS.get((cls >> 16, (cls >> 8) & 0xFF), "other")
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
        for sub in ("net", "drm"):
            try:
                osdevs += sorted(x.name for x in (d / sub).iterdir())
            except OSError:
                pass
        out.append(PciDevice(normalize_address(d.name), kind, vendor, device, cls,
                             node if node is not None and node >= 0 else None, cpus, VENDORS.get(vendor),
                             os_devices=tuple(osdevs)))
    return out


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    pci_address: str


def read_nvml() -> tuple[list[NvmlGpu] | None, str]:
    """NVML's GPUs, or (None, why not): no nvidia-ml-py, no driver, or an NVML error."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"no NVIDIA driver (NVML: {_nvml_text(e)})"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append(NvmlGpu(i, _s(pynvml.nvmlDeviceGetUUID(h)), _s(pynvml.nvmlDeviceGetName(h)),
                               int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                               normalize_address(_s(pynvml.nvmlDeviceGetPciInfo(h).busId))))
        return out, f"NVIDIA driver {_s(pynvml.nvmlSystemGetDriverVersion())}"
    except Exception as e:  # noqa: BLE001
        return None, f"NVML failed: {_nvml_text(e)}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml_text(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def merge_nvml(devs: list[PciDevice], nvml: list[NvmlGpu]) -> list[PciDevice]:
    """sysfs devices with NVML's facts added by PCI address (an NVML GPU sysfs lacks is added)."""
    by_addr = {g.pci_address: g for g in nvml}
    out = []
    for d in devs:
        g = by_addr.pop(d.address, None)
        if g is not None:
            d = replace(d, name=g.name, uuid=g.uuid, memory_bytes=g.memory_bytes, index=g.index,
                        os_devices=tuple(dict.fromkeys((*d.os_devices, f"cuda{g.index}", f"nvml{g.index}"))))
        out.append(d)
    for g in by_addr.values():
        out.append(PciDevice(g.pci_address, "gpu", 0x10DE, 0, 0x030200, None, (), "NVIDIA", g.name, g.uuid,
                             g.memory_bytes, g.index, (f"cuda{g.index}", f"nvml{g.index}")))
    return sorted(out, key=lambda d: d.address)


@dataclass(frozen=True)
class Gpus:
    devices: tuple[PciDevice, ...]  # every GPU-class device (CUDA-usable or not)
    driver: str  # what NVML said: "NVIDIA driver 550.54" or why there is none

    @property
    def cuda(self) -> tuple[PciDevice, ...]:
        """The GPUs CUDA can use (NVML knows them), in CUDA index order."""
        return tuple(sorted((d for d in self.devices if d.uuid), key=lambda d: d.index))


def discover(sysfs: str | os.PathLike = "/sys", *, nvml: bool = True) -> Gpus:
    devs = read_sysfs(sysfs, kinds=("gpu", "accelerator"))
    if not nvml:
        return Gpus(tuple(devs), "NVML not asked")
    found, why = read_nvml()
    return Gpus(tuple(merge_nvml(devs, found) if found is not None else devs), why)


def describe_absence(g: Gpus) -> str:
    nv = [d for d in g.devices if d.vendor_id == 0x10DE]
    if nv and not g.cuda:
        return (f"sysfs shows {len(nv)} NVIDIA GPU(s) ({', '.join(d.address for d in nv)}) but CUDA cannot use them: "
                f"{g.driver}")
    others = [d for d in g.devices if d.vendor_id != 0x10DE]
    extra = f"; other display/accelerator devices: {', '.join(d.label() for d in others)}" if others else ""
    return f"no NVIDIA GPU in sysfs and {g.driver}{extra}"


def cuda_env(env: dict, uuid: str | None) -> dict:
    """The environment of a process that must see only the GPU `uuid` (None: no GPU at all is
    hidden or chosen; an inherited CUDA_VISIBLE_DEVICES is dropped either way)."""
    e = dict(env)
    e.pop("CUDA_VISIBLE_DEVICES", None)
    if uuid:
        e["CUDA_VISIBLE_DEVICES"] = uuid
        e["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return e


def resolve_cuda(spec: str, g: Gpus, flag: str = "--device") -> PciDevice:
    """`cuda`, `cuda:N` (CUDA index) or `cuda:GPU-...` (a UUID or a unique prefix of one)."""
    head, sep, which = spec.strip().partition(":")
    if head.lower() != "cuda" or (sep and not which.strip()):
        raise UsageError(f"{flag} {spec!r}: not a device", "use cpu, cuda, cuda:N or cuda:GPU-<uuid>")
    if not g.cuda:
        raise TilewiseError(f"{flag} {spec}: no CUDA GPU here: {describe_absence(g)}",
                            "use --device cpu, or run where an NVIDIA GPU and its driver are present")
    listing = "; ".join(f"{d.index} ({d.name}, {d.uuid})" for d in g.cuda)
    which = which.strip()
    if not which:
        return g.cuda[0]
    if which.isdigit():
        i = int(which)
        for d in g.cuda:
            if d.index == i:
                return d
        raise UsageError(f"{flag} {spec}: there is no GPU {i} here", f"GPUs here: {listing}")
    matches = [d for d in g.cuda if d.uuid.lower().startswith(which.lower())
               or d.uuid.lower().startswith("gpu-" + which.lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"{flag} {spec}: no GPU has UUID {which}", f"GPUs here: {listing}")
    raise UsageError(f"{flag} {spec}: {which} is the start of {len(matches)} GPUs' UUIDs", "give more of the UUID")
