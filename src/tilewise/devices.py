"""GPUs here: the topology model's PCI devices (tilewise.topology.pci, read from sysfs) with NVML's
facts added where an NVIDIA driver is loaded (nvidia-ml-py): name, memory, UUID and the CUDA index.
A device whose firmware reports no node (numa_node = -1) keeps node None and its local_cpulist,
so a caller can say so and pick by CPUs or refuse (pci.locate).

`resolve_cuda` turns `--device cuda`, `cuda:N` or `cuda:GPU-<uuid>` into one GPU, or one `Error:`
line that says what is here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from tilewise.errors import TilewiseError, UsageError
from tilewise.topology.pci import VENDORS, PciDevice, kind_of, normalize_address, read_sysfs  # noqa: F401 - this module's API


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    pci_address: str


def _nvml_session(per_gpu, done: str | None = None):
    """Run per_gpu(pynvml, index, handle) over NVML's GPUs in one init/shutdown: (results, what
    answered), or (None, why not): no nvidia-ml-py, no driver, or an NVML error."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (run `tilewise extras install tensor`)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"no NVIDIA driver (NVML: {_nvml_text(e)})"
    try:
        out = [per_gpu(pynvml, i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        return out, done or f"NVIDIA driver {_s(pynvml.nvmlSystemGetDriverVersion())}"
    except Exception as e:  # noqa: BLE001
        return None, f"NVML failed: {_nvml_text(e)}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def read_nvml() -> tuple[list[NvmlGpu] | None, str]:
    """NVML's GPUs, or (None, why not)."""
    return _nvml_session(lambda nv, i, h: NvmlGpu(
        i, _s(nv.nvmlDeviceGetUUID(h)), _s(nv.nvmlDeviceGetName(h)), int(nv.nvmlDeviceGetMemoryInfo(h).total),
        normalize_address(_s(nv.nvmlDeviceGetPciInfo(h).busId))))


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
                        os_devices=tuple(dict.fromkeys((*d.os_devices, f"cuda{g.index}", f"nvml{g.index}"))),
                        source=f"{d.source}+nvml")
        out.append(d)
    for g in by_addr.values():
        out.append(PciDevice(g.pci_address, "gpu", 0x10DE, 0, 0x030200, None, (), "NVIDIA", g.name, g.uuid,
                             g.memory_bytes, g.index, (f"cuda{g.index}", f"nvml{g.index}"), "nvml"))
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


def with_nvml(t):
    """This machine's topology with NVML's facts (name, memory, UUID, CUDA index) added to its GPUs,
    where a driver is loaded; unchanged otherwise."""
    found, _ = read_nvml()
    if not found:
        return t
    return replace(t, devices=tuple(merge_nvml(list(t.devices), found)))


def process_gpus(pid: int) -> tuple[list[str] | None, str]:
    """The UUIDs of the GPUs on which NVML sees pid with a compute context, or (None, why not)."""
    found, why = _nvml_session(lambda nv, i, h: _s(nv.nvmlDeviceGetUUID(h)) if any(
        p.pid == pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)) else None, "NVML")
    return ([u for u in found if u] if found is not None else None), why
