"""Boot QEMU guests with a given NUMA/L3 topology and run commands inside them against this checkout.

Also a command: ``./.venv/bin/python tests/vm/harness.py --help`` (it uses tilewise.cpulist, so the
checkout's virtual environment).

How a guest is built:
- the kernel is the host's Debian kernel: the uncompressed ELF is extracted once from
  /boot/vmlinuz-* (its XZ payload) and booted through PVH, which skips the ~5 s self-decompression
  under TCG;
- a small initramfs (static busybox, the virtio/9p/overlay modules of that kernel and an init
  script) is built once and cached; each run appends a second tiny cpio archive holding the job
  (the command, its directory and environment, the cgroup layout);
- the guest mounts the host's ``/`` read-only over virtio-9p with a tmpfs overlay on top, so the
  checkout and its ``.venv`` work unchanged inside and nothing the guest writes reaches the host;
  its /tmp, /run and /dev/shm are its own fresh tmpfs, and the host directories the command needs
  there (its directory, the caches, ``share=`` paths) are shown on top of them the same way
  (:func:`guest_shares`), or the run fails before booting with one line naming the path;
- the command's stdout and stderr come back over the second and third serial ports; the exit code
  is printed on the console (first serial port) before the guest powers off.

Topologies are data (:class:`GuestTopology`): sockets, dies (one L3 each with
``-cpu max,vendor=GenuineIntel``: plain ``-cpu max`` presents an AMD CPU without topoext and gives
every CPU its own L3), cores, SMT threads, NUMA nodes with memory and CPU lists (CPU-less nodes
are memory tiers), a distance matrix and the cgroup layout (v1 as Debian 11 hosts, or cgroup2 only).
TCG by default; KVM when /dev/kvm can create a virtual machine (TILEWISE_VM_ACCEL=tcg|kvm forces one).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import glob
import gzip
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tilewise import cpulist, dirs, launch

QEMU = "qemu-system-x86_64"
EXIT_MARK = "TILEWISE-VM-EXIT"
READY_MARK = "TILEWISE-VM-READY"
# Modules the init script loads, in dependency order (resolved through modules.dep).
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
CACHE_ENV = "TILEWISE_VM_CACHE"
BOOT_TIMEOUT = 120  # seconds from QEMU start to the command starting (about 4 s under TCG here)


class VMError(Exception):
    """The guest could not be booted or did not report an exit code."""

    def __init__(self, msg: str, *, before_ready: bool = False):
        super().__init__(msg)
        self.before_ready = before_ready  # the guest never reached the command


class VMUnavailable(VMError):
    """This machine cannot run guests (no QEMU, no kernel, no busybox): the reason says what to install."""


class VMPathError(VMError):
    """A host path the command needs cannot be shown in the guest (found before booting)."""


# ---- topology as data ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    mem_mib: int
    cpus: tuple[int, ...] = ()  # empty: a CPU-less memory node (CXL-like tier)
    initiator: int | None = None  # with HMAT: the node whose CPUs are nearest to this CPU-less node


@dataclass(frozen=True)
class Hmat:
    """One firmware (ACPI HMAT) figure of the path from the CPUs of node ``initiator`` to the memory of
    node ``target``: QEMU's ``-numa hmat-lb,...,hierarchy=memory``. ``data_type`` is QEMU's:
    access-latency, read-latency, write-latency (``value`` in ns) or access-bandwidth,
    read-bandwidth, write-bandwidth (``value`` in MiB/s, passed as ``<value>M``)."""

    initiator: int
    target: int
    data_type: str
    value: int

    TYPES = ("access-latency", "read-latency", "write-latency", "access-bandwidth", "read-bandwidth", "write-bandwidth")

    def arg(self) -> str:
        v = f"latency={self.value}" if self.data_type.endswith("latency") else f"bandwidth={self.value}M"
        return f"hmat-lb,initiator={self.initiator},target={self.target},hierarchy=memory,data-type={self.data_type},{v}"


@dataclass(frozen=True)
class GuestTopology:
    """A guest machine. CPUs are numbered as QEMU (and so Linux) numbers them: threads fastest,
    then cores, dies, sockets: cpu = ((socket * dies + die) * cores + core) * threads + thread."""

    name: str
    sockets: int = 1
    dies: int = 1  # per socket; one L3 each
    cores: int = 1  # per die
    threads: int = 1  # per core (SMT)
    nodes: tuple[Node, ...] = ()  # empty: no -numa at all (the kernel makes one node)
    distances: tuple[tuple[int, ...], ...] | None = None  # SLIT; None: QEMU's default (10/20)
    cgroup: str = "v1"  # v1: cpuset (and the other v1 controllers) as on the host; v2: cgroup2 only
    mem_mib: int = 1024  # total memory when nodes is empty
    description: str = ""
    hmat: tuple[Hmat, ...] = ()  # firmware memory figures (-machine hmat=on); empty: no HMAT

    @property
    def ncpus(self) -> int:
        return self.sockets * self.dies * self.cores * self.threads

    @property
    def total_mem_mib(self) -> int:
        return sum(n.mem_mib for n in self.nodes) if self.nodes else self.mem_mib

    def cpu_location(self, cpu: int) -> tuple[int, int, int, int]:
        """(socket, die, core, thread) of a CPU number."""
        thread = cpu % self.threads
        core = (cpu // self.threads) % self.cores
        die = (cpu // (self.threads * self.cores)) % self.dies
        socket = cpu // (self.threads * self.cores * self.dies)
        return socket, die, core, thread

    def l3_groups(self) -> list[tuple[int, ...]]:
        """The CPU sets sharing one L3 (one per die), in CPU order."""
        per = self.cores * self.threads
        return [tuple(range(i * per, (i + 1) * per)) for i in range(self.sockets * self.dies)]

    def core_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(i * self.threads, (i + 1) * self.threads)) for i in range(self.ncpus // self.threads)]

    def node_cpus(self) -> dict[int, tuple[int, ...]]:
        if not self.nodes:
            return {0: tuple(range(self.ncpus))}
        return {i: tuple(n.cpus) for i, n in enumerate(self.nodes)}

    def distance_matrix(self) -> list[list[int]]:
        n = max(1, len(self.nodes))
        if self.distances is None:
            return [[10 if i == j else 20 for j in range(n)] for i in range(n)]
        return [list(r) for r in self.distances]

    def validate(self) -> None:
        if min(self.sockets, self.dies, self.cores, self.threads) < 1:
            raise ValueError(f"{self.name}: sockets, dies, cores and threads must be >= 1")
        if self.cgroup not in ("v1", "v2"):
            raise ValueError(f"{self.name}: cgroup must be v1 or v2")
        if self.nodes:
            cpus = sorted(c for n in self.nodes for c in n.cpus)
            if cpus != list(range(self.ncpus)):
                raise ValueError(f"{self.name}: node CPU lists must cover 0..{self.ncpus - 1} exactly once")
            for n in self.nodes:
                if n.mem_mib < 64:
                    raise ValueError(f"{self.name}: every node needs at least 64 MiB")
            for core in self.core_groups():  # a core (its SMT threads) lives in one node
                if len({i for i, n in enumerate(self.nodes) if set(core) & set(n.cpus)}) != 1:
                    raise ValueError(f"{self.name}: the threads of core {core} are in different nodes")
        if self.hmat:
            ids = range(len(self.nodes))
            for i, n in enumerate(self.nodes):
                if not n.cpus and n.initiator is None:
                    raise ValueError(f"{self.name}: with HMAT, CPU-less node {i} needs its initiator")
                if n.initiator is not None and (n.initiator not in ids or not self.nodes[n.initiator].cpus):
                    raise ValueError(f"{self.name}: node {i}'s initiator {n.initiator} is not a node with CPUs")
            for h in self.hmat:
                if h.data_type not in Hmat.TYPES or h.target not in ids or h.initiator not in ids \
                        or not self.nodes[h.initiator].cpus or h.value < 1:
                    raise ValueError(f"{self.name}: bad HMAT entry {h}")
        if self.distances is not None:
            k = max(1, len(self.nodes))
            if len(self.distances) != k or any(len(r) != k for r in self.distances):
                raise ValueError(f"{self.name}: the distance matrix must be {k}x{k}")
            if any(self.distances[i][i] != 10 for i in range(k)) or any(
                    self.distances[i][j] <= 10 for i in range(k) for j in range(k) if i != j):
                raise ValueError(f"{self.name}: distances are 10 on the diagonal and above 10 elsewhere (ACPI SLIT)")

    @classmethod
    def from_dict(cls, d: dict) -> GuestTopology:
        d = dict(d)
        d["nodes"] = tuple(Node(int(n["mem_mib"]), tuple(n.get("cpus", ())), n.get("initiator"))
                           for n in d.get("nodes", ()))
        d["hmat"] = tuple(Hmat(**h) for h in d.get("hmat", ()))
        if d.get("distances") is not None:
            d["distances"] = tuple(tuple(r) for r in d["distances"])
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def qemu_topology_args(t: GuestTopology) -> list[str]:
    t.validate()
    args = ["-smp", f"{t.ncpus},sockets={t.sockets},dies={t.dies},cores={t.cores},threads={t.threads}",
            "-m", f"{t.total_mem_mib}M"]
    for i, n in enumerate(t.nodes):
        args += ["-object", f"memory-backend-ram,id=mem{i},size={n.mem_mib}M"]
        spec = f"node,nodeid={i},memdev=mem{i}"
        for r in cpulist.format(n.cpus).split(",") if n.cpus else ():
            spec += f",cpus={r}"  # one cpus= per range
        if t.hmat:  # QEMU wants every node's initiator with hmat=on: a CPU node is its own
            spec += f",initiator={i if n.cpus else n.initiator}"
        args += ["-numa", spec]
    if t.nodes and t.distances is not None:
        for i, row in enumerate(t.distances):
            for j, v in enumerate(row):
                if i != j:
                    args += ["-numa", f"dist,src={i},dst={j},val={v}"]
    for h in t.hmat:  # after the node options, as QEMU requires
        args += ["-numa", h.arg()]
    return args


# ---- host prerequisites -------------------------------------------------------------------------

def cache_dir() -> Path:
    d = dirs.cache_dir("vm", override=CACHE_ENV)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _kernel_release(vmlinuz: str) -> str:
    return os.path.basename(vmlinuz)[len("vmlinuz-"):]


def find_kernel() -> tuple[str, str]:
    """(vmlinuz path, release) of the newest host kernel that has its modules installed."""
    forced = os.environ.get("TILEWISE_VM_KERNEL")
    candidates = [forced] if forced else sorted(glob.glob("/boot/vmlinuz-*"), key=_version_key, reverse=True)
    for k in candidates:
        rel = _kernel_release(k)
        if os.path.isfile(k) and os.access(k, os.R_OK) and os.path.isfile(f"/lib/modules/{rel}/modules.dep"):
            return k, rel
    raise VMUnavailable("no Linux kernel with modules in /boot and /lib/modules: install linux-image-amd64 "
                        "(make setup-all does)")


def _version_key(path: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path)]


def missing_prerequisites() -> str | None:
    """None when guests can run here, else one line saying what is missing and how to get it."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "VM tests need an x86_64 Linux host"
    if shutil.which(QEMU) is None:
        return f"{QEMU} not found: install qemu-system-x86 (make setup-all does)"
    if shutil.which("busybox") is None and not os.path.exists("/bin/busybox"):
        return "busybox not found: install busybox-static (make setup-all does)"
    if not _busybox_is_static():
        return "busybox is dynamically linked: install busybox-static (make setup-all does)"
    try:
        find_kernel()
    except VMUnavailable as e:
        return str(e)
    return None


def _busybox_path() -> str:
    return shutil.which("busybox") or "/bin/busybox"


def _busybox_is_static() -> bool:
    try:
        with open(_busybox_path(), "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return b"ld-linux" not in head and b"/lib64/ld" not in head


def kvm_usable() -> bool:
    """True when the CPU advertises hardware virtualisation and /dev/kvm can create a VM with a vCPU.

    Opening /dev/kvm is not enough: inside some virtual machines (nested KVM without vmx/svm) it
    creates VMs whose guests then hang or abort on MSR writes. run() also falls back to TCG when a
    KVM guest fails to boot."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    if not re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.M):
        return False
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        vm = fcntl.ioctl(fd, 0xAE01, 0)  # KVM_CREATE_VM
        try:
            vcpu = fcntl.ioctl(vm, 0xAE41, 0)  # KVM_CREATE_VCPU
            os.close(vcpu)
        finally:
            os.close(vm)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def accelerator() -> str:
    forced = os.environ.get("TILEWISE_VM_ACCEL")
    if forced in ("tcg", "kvm"):
        return forced
    return "kvm" if kvm_usable() else "tcg"


class _Lock:
    """An exclusive flock on a file in the cache (builds are shared by concurrent test runs)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _build_once(done: Path, build: Callable[[], None]) -> None:
    """Run build() unless `done` exists, under the cache lock (concurrent test runs share the cache)."""
    if done.exists():
        return
    with _Lock(cache_dir() / ".lock"):
        if not done.exists():
            build()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def kernel_image() -> Path:
    """The uncompressed kernel ELF (booted via PVH), extracted once from the host's vmlinuz."""
    vmlinuz, rel = find_kernel()
    out = cache_dir() / f"vmlinux-{rel}"

    def build() -> None:
        elf = _extract_elf(Path(vmlinuz).read_bytes())
        if elf is None:
            raise VMUnavailable(f"cannot find an uncompressed kernel inside {vmlinuz} (expected an XZ or gzip payload)")
        _atomic_write_bytes(out, elf)

    _build_once(out, build)
    return out


def _extract_elf(data: bytes) -> bytes | None:
    for magic, opener in ((b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08", "gz")):
        start = 0
        while (i := data.find(magic, start)) >= 0:
            start = i + 1
            try:
                if opener == "xz":
                    out = lzma.LZMADecompressor().decompress(data[i:])
                else:
                    out = gzip.GzipFile(fileobj=__import__("io").BytesIO(data[i:])).read()
            except (lzma.LZMAError, OSError, EOFError):
                continue
            if out[:4] == b"\x7fELF":
                return out
    return None


# ---- host paths the guest sees -------------------------------------------------------------------
# The guest sees the host's / (read-only 9p under a tmpfs overlay), except where it mounts its own:
# fresh tmpfs on these (its scratch space: nothing of the host's /tmp, /run or /dev/shm leaks in, such as
# state or cluster directories of tilewise runs on the host) -- keep in step with INIT...
PRIVATE_DIRS = ("/tmp", "/run", "/dev/shm")
# ...and its own kernel's /proc, /sys and /dev, where no host directory can be shown.
KERNEL_DIRS = ("/proc", "/sys", "/dev")
# Variables of the guest's environment naming host directories its commands read (the data caches
# live under HOME or XDG_CACHE_HOME; the guests' native tools in TILEWISE_BIN_DIR), and lists of them.
PATH_ENV_KEYS = ("HOME", "XDG_CACHE_HOME", "TILEWISE_BIN_DIR")
PATH_LIST_ENV_KEYS = ("PYTHONPATH",)


@dataclass(frozen=True)
class Share:
    """A host directory shown in the guest at ``mountpoint`` (inside its private /tmp, /run or /dev/shm)."""

    mountpoint: str  # the path the command uses
    source: str  # the host directory (symbolic links resolved)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hidden_by_kernel(path: str) -> str | None:
    """The guest-kernel directory (/proc, /sys, /dev) a path lies under, None when it can be shown."""
    if any(_under(path, d) for d in PRIVATE_DIRS):
        return None
    return next((d for d in KERNEL_DIRS if _under(path, d)), None)


def _unshowable(path: str) -> str | None:
    """Why a host path cannot be shown in the guest (None: it can)."""
    if not os.path.exists(path):
        return "it does not exist on the host"
    real = os.path.realpath(path)
    for p in (os.path.abspath(path), real):
        if top := _hidden_by_kernel(p):
            return f"it is under {top}, where the guest mounts its own kernel's files: use a directory elsewhere"
    if not os.access(real if os.path.isdir(real) else os.path.dirname(real), os.R_OK | os.X_OK):
        return "this user cannot read it (QEMU shows the host's / to the guest as this user): make it readable"
    return None


def guest_shares(needed: Iterable[str | os.PathLike], optional: Iterable[str | os.PathLike] = ()) -> list[Share]:
    """The host directories to show inside the guest's private /tmp, /run and /dev/shm.

    ``needed``: paths the command cannot do without (its directory, the ``share=`` paths): one that
    cannot be shown raises VMPathError, one line naming it and why, before anything boots.
    ``optional``: paths the command may use (absolute words of its argv, the directories in its
    environment): shown when they can be, else left to the guest (which then has its own, empty).
    A file is shown through its directory; a path is shown where the command names it and where its
    symbolic links lead (both inside the guest's private directories when they are); paths inside
    another shown directory are seen through it. Paths elsewhere need nothing: the guest sees them."""
    picked: dict[str, str] = {}
    for path, must in [(os.fspath(p), True) for p in needed] + [(os.fspath(p), False) for p in optional]:
        why = _unshowable(path)
        if why:
            if must:
                raise VMPathError(f"the guest cannot see {path}: {why}")
            continue
        named, real = os.path.abspath(path), os.path.realpath(path)
        if not os.path.isdir(real):
            named, real = os.path.dirname(named), os.path.dirname(real)
        for mountpoint in (real, named):
            if any(_under(mountpoint, d) for d in PRIVATE_DIRS):
                picked.setdefault(mountpoint, real)
    shares: list[Share] = []
    for mountpoint in sorted(picked):  # a directory sorts before the paths inside it
        if not any(_under(mountpoint, s.mountpoint) for s in shares):
            shares.append(Share(mountpoint, picked[mountpoint]))
    return shares


def env_paths(env: dict[str, str]) -> list[str]:
    """The host directories a guest environment names (PATH_ENV_KEYS, and the entries of PATH_LIST_ENV_KEYS)."""
    paths = [env[k] for k in PATH_ENV_KEYS if env.get(k)]
    return paths + [p for k in PATH_LIST_ENV_KEYS for p in env.get(k, "").split(os.pathsep) if p]


def command_paths(command: str | list[str]) -> list[str]:
    """The absolute paths a command names (its words that start with /; a shell string is split as sh would)."""
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError:
            return []
    return [w for w in command if w.startswith("/")]


def shares_script(shares: Sequence[Share]) -> str:
    """The init's step that shows each share (run with the guest root as $1, after the private tmpfs
    mounts): the host directory from the 9p mount, copy-on-write as the rest of the host's /, so the
    guest can write there and nothing reaches the host. Says which path failed on the command's stderr."""
    lines = ["R=$1",
             "fail() { echo \"tilewise-vm: cannot show the host's $1 in the guest (mount failed)\" | tee /dev/ttyS2; exit 1; }"]
    for i, s in enumerate(shares):
        stage, rw, mp = f"/mnt/share{i}", f"/mnt/rw/share{i}", shlex.quote(s.mountpoint)
        lines.append(f'mkdir -p {stage} {rw}/upper {rw}/work "$R"{mp} || fail {mp}')
        lines.append(f"mount -o bind {shlex.quote('/mnt/lower' + s.source)} {stage} || fail {mp}")
        lines.append(f'mount -t overlay overlay -o lowerdir={stage},upperdir={rw}/upper,workdir={rw}/work "$R"{mp} '
                     f"|| fail {mp}")
    return "\n".join(lines) + "\n"


# ---- initramfs ------------------------------------------------------------------------------------

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "init: insmod $m failed"; done
mkdir -p /mnt/lower /mnt/rw /mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /mnt/lower || { echo "init: cannot mount the host's / over 9p"; poweroff -f; }
mount -t tmpfs -o mode=755 rw /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /mnt/root || { echo "init: overlay mount failed"; poweroff -f; }
R=/mnt/root
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=755 run $R/run
stty -F /dev/ttyS1 raw -echo
stty -F /dev/ttyS2 raw -echo
/bin/sh /job/shares.sh $R || { echo "TILEWISE-VM-EXIT 125 $(cut -d' ' -f1 /proc/uptime)"; poweroff -f; }
if [ "$(cat /job/cgroup)" = v2 ]; then
  mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
else
  mount -t tmpfs -o mode=755 cgroup $R/sys/fs/cgroup
  for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
    mkdir -p $R/sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup $R/sys/fs/cgroup/$c
  done
  mkdir -p $R/sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 $R/sys/fs/cgroup/unified
fi
cp -a /job $R/run/tilewise-job
hostname tilewise-guest
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up || echo "init: no loopback interface"
echo "TILEWISE-VM-READY $(cut -d' ' -f1 /proc/uptime)"
chroot $R /bin/sh /run/tilewise-job/run.sh </dev/null >/dev/ttyS1 2>/dev/ttyS2
rc=$?
echo "TILEWISE-VM-EXIT $rc $(cut -d' ' -f1 /proc/uptime)"
poweroff -f
"""


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (directories have empty data)."""
    out = bytearray()
    ino = 1

    def add(name: str, mode: int, data: bytes) -> None:
        nonlocal ino
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out.extend(hdr.encode() + nb)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))
        ino += 1

    for name, mode, data in entries:
        add(name, mode, data)
    add("TRAILER!!!", 0, b"")
    out.extend(b"\0" * (-len(out) % 512))
    return bytes(out)


DIR, FILE, EXE, LINK = 0o040755, 0o100644, 0o100755, 0o120777


def _module_closure(release: str) -> list[str]:
    """Paths (relative to /lib/modules/REL) of MODULES and their dependencies, dependencies first."""
    base = Path("/lib/modules") / release
    deps: dict[str, list[str]] = {}
    for line in (base / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    by_name = {Path(m).name.split(".ko")[0].replace("-", "_"): m for m in deps}
    builtin = set()
    if (base / "modules.builtin").exists():
        builtin = {Path(m).name.split(".ko")[0].replace("-", "_") for m in (base / "modules.builtin").read_text().split()}
    order: list[str] = []

    def visit(m: str) -> None:
        if m in order:
            return
        for d in reversed(deps.get(m, [])):
            visit(d)
        order.append(m)

    for name in MODULES:
        key = name.replace("-", "_")
        if key in builtin:
            continue
        if key not in by_name:
            raise VMUnavailable(f"kernel {release} has no module {name}: use a kernel with virtio, 9p and overlayfs")
        visit(by_name[key])
    return order


def base_initramfs() -> Path:
    _, rel = find_kernel()
    busybox = Path(_busybox_path())
    mods = _module_closure(rel)
    h = hashlib.sha256()
    h.update(INIT.encode())
    h.update(busybox.read_bytes())
    for m in mods:
        h.update(m.encode())
        h.update(str(os.stat(Path("/lib/modules") / rel / m).st_mtime_ns).encode())
    out = cache_dir() / f"initramfs-{rel}-{h.hexdigest()[:12]}.cpio"

    def build() -> None:
        entries: list[tuple[str, int, bytes]] = [(d, DIR, b"") for d in ("bin", "dev", "proc", "sys", "mnt", "modules", "job")]
        entries.append(("bin/busybox", EXE, busybox.read_bytes()))
        entries.append(("bin/sh", LINK, b"busybox"))
        entries.append(("init", EXE, INIT.encode()))
        names = []
        for m in mods:
            name = Path(m).name
            names.append(name)
            entries.append((f"modules/{name}", FILE, (Path("/lib/modules") / rel / m).read_bytes()))
        entries.append(("modules.order", FILE, ("\n".join(names) + "\n").encode()))
        _atomic_write_bytes(out, _cpio(entries))

    _build_once(out, build)
    return out


def job_archive(command: str, cwd: str, env: dict[str, str], cgroup: str, shares: Sequence[Share] = ()) -> bytes:
    """The per-run archive appended to the base initramfs: /job/{run.sh,cgroup,shares.sh}."""
    lines = ["#!/bin/sh"]
    for k, v in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"bad environment variable name {k!r}")
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append(f"cd {shlex.quote(cwd)} || {{ echo 'tilewise-vm: the guest cannot see the command directory' >&2; exit 125; }}")
    lines.append(command)
    script = "\n".join(lines) + "\n"
    return _cpio([("job", DIR, b""), ("job/run.sh", EXE, script.encode()), ("job/cgroup", FILE, cgroup.encode()),
                  ("job/shares.sh", EXE, shares_script(shares).encode())])


# ---- native tools for guests -------------------------------------------------------------------------

PORTABLE_CXXFLAGS = "-O2 -march=x86-64-v2 -std=c++17 -Wall -Wextra -pthread"


def portable_native_bin(repo: Path) -> Path | None:
    """The project's native probes built for a baseline x86-64 CPU (make setup builds them with
    -march=native, whose AVX-512 a TCG guest CPU lacks), cached by source hash. None when the
    checkout has no native/ sources or no compiler."""
    src = repo / "native"
    if not (src / "Makefile").exists() or shutil.which("g++") is None or shutil.which("make") is None:
        return None
    h = hashlib.sha256(PORTABLE_CXXFLAGS.encode())
    for f in sorted(src.rglob("*")):
        if f.is_file() and f.suffix in (".cpp", ".hpp", ".h") or f.name == "Makefile":
            h.update(str(f.relative_to(src)).encode())
            h.update(f.read_bytes())
    out = cache_dir() / f"native-{h.hexdigest()[:12]}"

    def build() -> None:
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        cp = subprocess.run(["nice", "-n", "10", "make", "-s", "-C", str(src), f"OUT={tmp}", f"CXXFLAGS={PORTABLE_CXXFLAGS}"],
                            capture_output=True, text=True)
        if cp.returncode != 0:
            raise VMError(f"building the native tools for guests failed:\n{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
        (tmp / ".built").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)

    _build_once(out / ".built", build)
    return out


# ---- running ---------------------------------------------------------------------------------------

@dataclass
class GuestResult:
    topology: str
    returncode: int
    stdout: str
    stderr: str
    console: str
    accel: str
    boot_s: float  # QEMU start to the command starting (host clock)
    total_s: float  # QEMU start to QEMU exit
    guest_uptime_at_start: float | None = None

    def json(self):
        """The last line of stdout that parses as JSON (guest scripts print one document)."""
        for line in reversed(self.stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue
        raise VMError(f"guest {self.topology} printed no JSON document (exit {self.returncode}):\n"
                      f"stdout tail:\n{self.stdout[-3000:]}\nstderr tail:\n{self.stderr[-3000:]}")


# passed on to the guest: the caches (HOME, XDG_CACHE_HOME) and the sources (PYTHONPATH: a worktree's src
# before the shared virtual environment's) the host's commands use
DEFAULT_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TERM", "HOME", "USER", "PYTHONHASHSEED", "XDG_CACHE_HOME", "PYTHONPATH")


def guest_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in DEFAULT_ENV_KEYS if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.setdefault("HOME", "/root")
    env["TILEWISE_IN_VM"] = "1"
    env.update(extra or {})
    return env


def qemu_command(t: GuestTopology, *, kernel: Path, initrd: Path, out_dir: Path, accel: str) -> list[str]:
    append = " ".join([
        "console=ttyS0", "quiet", "loglevel=4", "panic=-1", "rdinit=/init", "8250.nr_uarts=4",
        "mitigations=off", "nokaslr", "tsc=reliable", "no_timer_check",
        # cgroup2-only guest: the v1 controllers cannot even be mounted
        *(["cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1"] if t.cgroup == "v2" else []),
    ])
    cpu = "max,vendor=GenuineIntel" if accel == "tcg" else "host,vendor=GenuineIntel,host-cache-info=off,l3-cache=on"
    accel_arg = "tcg,thread=multi" if accel == "tcg" else "kvm"
    return [
        QEMU, "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
        "-machine", "q35,hmat=on" if t.hmat else "q35", "-accel", accel_arg, "-cpu", cpu,
        *qemu_topology_args(t),
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
        "-chardev", f"file,id=con,path={out_dir / 'console'}",
        "-chardev", f"file,id=out,path={out_dir / 'stdout'}",
        "-chardev", f"file,id=err,path={out_dir / 'stderr'}",
        "-serial", "chardev:con", "-serial", "chardev:out", "-serial", "chardev:err",
        "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
    ]


# The guests this process is running: a test session starts them beside its other tests, which may
# count their own child processes or hold off process starts (START_GATE), and ends them when it
# ends early (stop_all) instead of waiting for minutes of guest time.
_LIVE: dict[int, subprocess.Popen] = {}
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()
START_GATE = threading.Lock()  # held around a QEMU start; hold it to see no guest start meanwhile


def live_pids() -> set[int]:
    """The QEMU processes this process has running now (each registered under START_GATE)."""
    with _LIVE_LOCK:
        return set(_LIVE)


def stop_all() -> None:
    """Kill every guest this process runs and start no more (their runs raise VMError)."""
    _STOPPING.set()
    with _LIVE_LOCK:
        running = list(_LIVE.values())
    for proc in running:
        if proc.poll() is None:
            proc.kill()


@dataclass(frozen=True)
class Job:
    """A guest run with everything it depends on resolved when it was prepared: it may run later on
    another thread while the preparing thread changes its environment, directory or temporary
    directory (tests do), and it reads none of them."""
    topology: GuestTopology
    command: str
    cwd: str
    env: dict[str, str]  # the guest command's
    shares: tuple[Share, ...]
    timeout: float
    accel: str
    auto: bool  # accel was chosen here (a KVM guest that cannot boot goes on under TCG)
    kernel: Path
    initramfs: Path
    scratch: str  # where the run's folder (initrd, console) goes
    qemu_env: dict[str, str]  # QEMU's own environment

    def run(self) -> GuestResult:
        try:
            return _run(self, self.accel)
        except VMError as e:
            if _STOPPING.is_set() or not e.before_ready or not (self.accel == "tcg" or self.auto):
                raise
            # A guest that never reached init: a KVM guest that cannot boot here goes on under TCG; a TCG
            # guest that hung before init (seen once in many boots: an empty console after 120 s) gets one
            # more boot. The command never started, so nothing ran twice; a second failure is raised.
            print(f"vm: {e}\nvm: booting guest {self.topology.name} once more under TCG", file=sys.stderr)
            return _run(self, "tcg")


def prepare(t: GuestTopology, command: str | list[str], *, cwd: str | os.PathLike | None = None,
            env: dict[str, str] | None = None, share: Iterable[str | os.PathLike] = (), timeout: float = 600,
            accel: str | None = None) -> Job:
    """A run of ``command`` in a guest with topology ``t`` (see run), checked and resolved now: raises
    VMUnavailable or VMPathError here, before anything boots; builds the cached kernel and initramfs."""
    why = missing_prerequisites()
    if why:
        raise VMUnavailable(why)
    if isinstance(command, (list, tuple)):
        command = shlex.join(command)
    cwd = os.path.abspath(cwd or os.getcwd())
    env = guest_env(env)
    shares = guest_shares([cwd, *share], [*command_paths(command), *env_paths(env)])
    auto = accel is None and os.environ.get("TILEWISE_VM_ACCEL") not in ("tcg", "kvm")
    return Job(t, command, cwd, env, tuple(shares), timeout, accel or accelerator(), auto, kernel_image(),
               base_initramfs(), tempfile.gettempdir(), dict(os.environ))


def run(t: GuestTopology, command: str | list[str], *, cwd: str | os.PathLike | None = None,
        env: dict[str, str] | None = None, share: Iterable[str | os.PathLike] = (), timeout: float = 600,
        accel: str | None = None) -> GuestResult:
    """Boot a guest with topology ``t``, run ``command`` (a shell string or an argv list) in ``cwd``
    (default: the current directory) and return its output and exit code. The guest sees the host's
    files; ``share`` names host paths the command needs besides ``cwd`` (e.g. pytest's tmp_path), which
    it sees even under /tmp, /run or /dev/shm (see guest_shares). Raises VMPathError before booting
    when one of them cannot be shown, VMError when the guest does not report an exit code (boot
    failure, timeout), with the console's tail."""
    return prepare(t, command, cwd=cwd, env=env, share=share, timeout=timeout, accel=accel).run()


SCRATCH_PREFIX = "tilewise-vm-guest-"


def _scratch_owner(path: Path) -> int | None:
    m = re.fullmatch(rf"{SCRATCH_PREFIX}(\d+)-.*", path.name)
    return int(m.group(1)) if m else None


def sweep(base: str | None = None) -> list[Path]:
    """Remove the guest folders (initrd, console) of runners that are gone: a runner stopped by SIGTERM
    runs no finally, and its QEMU dies with it (a death signal), but its folder stays until this sweep,
    which every guest run does first. Returns what it removed."""
    removed = []
    for d in Path(base or tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        owner = _scratch_owner(d)
        if owner is None or owner == os.getpid() or Path(f"/proc/{owner}").exists():
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _run(job: Job, accel: str) -> GuestResult:
    t, timeout = job.topology, job.timeout
    sweep(job.scratch)
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{t.name}-", dir=job.scratch) as d:
        out = Path(d)
        initrd = out / "initrd.cpio"
        initrd.write_bytes(job.initramfs.read_bytes() + job_archive(job.command, job.cwd, job.env, t.cgroup, job.shares))
        for name in ("console", "stdout", "stderr"):
            (out / name).write_bytes(b"")
        cmd = qemu_command(t, kernel=job.kernel, initrd=initrd, out_dir=out, accel=accel)
        with START_GATE:
            if _STOPPING.is_set():
                raise VMError(f"guest {t.name} not started: the guest runs were stopped")
            start = time.monotonic()
            # through the process edge: its own session, and SIGKILL when the Python that started it dies
            # (pytest stopped by a timeout's SIGTERM runs no finally: the guest must not outlive it)
            proc = launch.spawn(cmd, None, env=job.qemu_env, die_with_parent=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=d)
            with _LIVE_LOCK:
                _LIVE[proc.pid] = proc
        boot_s = None
        try:
            while True:
                try:
                    qemu_out, _ = proc.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if boot_s is None and READY_MARK in (out / "console").read_text(errors="replace"):
                    boot_s = time.monotonic() - start
                if boot_s is None and time.monotonic() - start > BOOT_TIMEOUT:
                    proc.kill()
                    said = proc.communicate()[0].decode(errors="replace").strip()[-1500:]
                    raise VMError(f"guest {t.name} ({accel}) did not boot within {BOOT_TIMEOUT} s; QEMU said: {said or '-'}; "
                                  "console tail:\n" + _tail((out / "console").read_text(errors="replace")), before_ready=True)
                if time.monotonic() - start > timeout:
                    proc.kill()
                    proc.communicate()
                    raise VMError(f"guest {t.name} did not finish within {timeout:.0f} s; console tail:\n"
                                  + _tail((out / "console").read_text(errors="replace")), before_ready=boot_s is None)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid, None)
        total = time.monotonic() - start
        console = (out / "console").read_text(errors="replace")
        stdout = _clean((out / "stdout").read_bytes())
        stderr = _clean((out / "stderr").read_bytes())
    m = re.search(rf"{EXIT_MARK} (\d+)", console)
    if not m:
        raise VMError(f"guest {t.name} reported no exit code (QEMU exit {proc.returncode}); "
                      f"QEMU said: {qemu_out.decode(errors='replace').strip()[-1500:]}\nconsole tail:\n{_tail(console)}"
                      f"\nstderr tail:\n{stderr[-2000:]}", before_ready=READY_MARK not in console)
    ready = re.search(rf"{READY_MARK} ([\d.]+)", console)
    return GuestResult(t.name, int(m.group(1)), stdout, stderr, console, accel,
                       boot_s if boot_s is not None else total, total,
                       float(ready.group(1)) if ready else None)


def _clean(b: bytes) -> str:
    return b.decode(errors="replace").replace("\r\n", "\n")


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


# ---- command line ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from topologies import TOPOLOGIES  # noqa: E402  (sibling module; stdlib only)

    ap = argparse.ArgumentParser(
        prog="python tests/vm/harness.py",
        description="Boot a QEMU guest with a NUMA topology and run a command inside it against this checkout.")
    ap.add_argument("--topology", "-t", default=None,
                    help=f"one of {', '.join(TOPOLOGIES)}, or a JSON file describing a GuestTopology")
    ap.add_argument("--accel", choices=("tcg", "kvm"), help="default: kvm when /dev/kvm works, else tcg")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--share", action="append", default=[], metavar="PATH",
                    help="a host path the command needs besides the current directory (repeatable): the guest sees it "
                         "even under /tmp, /run or /dev/shm")
    ap.add_argument("--list", action="store_true", help="list the topologies and exit")
    ap.add_argument("--times", action="store_true",
                    help="boot every topology (or --topology) to `true` REPEAT times; print boot seconds as JSON")
    ap.add_argument("--repeat", type=int, default=3, help="with --times: boots per topology (median reported)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="command to run (default: true)")
    a = ap.parse_args(argv)
    a.topology_given = a.topology is not None
    a.topology = a.topology or "two-socket-cxl"
    if a.list:
        for name, t in TOPOLOGIES.items():
            print(f"{name:18} {t.ncpus} CPUs, {max(1, len(t.nodes))} nodes, cgroup {t.cgroup}: {t.description}")
        return 0
    if a.times:
        return _times([TOPOLOGIES[a.topology]] if a.topology_given else list(TOPOLOGIES.values()), a)
    if a.topology in TOPOLOGIES:
        t = TOPOLOGIES[a.topology]
    elif os.path.isfile(a.topology):
        t = GuestTopology.from_dict(json.loads(Path(a.topology).read_text()))
    else:
        print(f"Error: unknown topology {a.topology!r}: use --list, or give a JSON file", file=sys.stderr)
        return 2
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        r = run(t, cmd or ["true"], share=a.share, timeout=a.timeout, accel=a.accel)
    except VMError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    print(f"[{t.name}: exit {r.returncode}, {r.accel}, boot {r.boot_s:.1f} s, total {r.total_s:.1f} s]", file=sys.stderr)
    return r.returncode


def _times(tops: list[GuestTopology], a) -> int:
    import statistics

    out = {}
    for t in tops:
        boots, totals = [], []
        for _ in range(max(1, a.repeat)):
            try:
                r = run(t, ["true"], timeout=a.timeout, accel=a.accel)
            except VMError as e:
                print(f"Error: {e}", file=sys.stderr)
                return 1
            boots.append(r.boot_s)
            totals.append(r.total_s)
        out[t.name] = {"accel": r.accel, "vcpus": t.ncpus, "boot_s_median": round(statistics.median(boots), 2),
                       "boot_s": [round(b, 2) for b in boots], "total_s": [round(x, 2) for x in totals]}
        print(f"{t.name:16} {r.accel} {t.ncpus} vCPUs: boot {out[t.name]['boot_s_median']:.2f} s (median of {len(boots)})",
              file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
