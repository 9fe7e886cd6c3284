"""Memory allocators that can be preloaded (LD_PRELOAD), from Debian's packages."""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass

from tilewise.errors import UsageError


@dataclass(frozen=True)
class Allocator:
    name: str
    package: str  # Debian package that ships it
    libraries: tuple[str, ...]  # sonames to preload, first found wins


ALLOCATORS: dict[str, Allocator] = {
    a.name: a
    for a in (
        Allocator("system", "libc6", ()),  # glibc ptmalloc2: nothing to preload
        Allocator("jemalloc", "libjemalloc2", ("libjemalloc.so.2",)),
        Allocator("tcmalloc", "libtcmalloc-minimal4", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")),
        Allocator("mimalloc", "libmimalloc2.0", ("libmimalloc.so.2", "libmimalloc.so")),
        Allocator("tbbmalloc", "libtbbmalloc2", ("libtbbmalloc_proxy.so.2",)),
    )
}
ALIASES = {"ptmalloc": "system", "glibc": "system", "default": "system", "tbb": "tbbmalloc"}
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def names() -> tuple[str, ...]:
    return tuple(ALLOCATORS)


def get(name: str) -> Allocator:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ALLOCATORS:
        raise UsageError(f"unknown allocator {name!r}", f"choose one of {', '.join(ALLOCATORS)}")
    return ALLOCATORS[key]


def _ldconfig() -> dict[str, str]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        if "=>" in line:
            left, _, path = line.partition("=>")
            found.setdefault(left.split()[0], path.strip())
    return found


def find_library(name: str) -> str | None:
    """Absolute path of the allocator's library, or None for the system allocator."""
    a = get(name)
    if not a.libraries:
        return None
    for lib in a.libraries:
        for d in SEARCH_DIRS:
            for p in glob.glob(os.path.join(d, lib)):
                return os.path.realpath(p)
    cache = _ldconfig()
    for lib in a.libraries:
        if lib in cache:
            return os.path.realpath(cache[lib])
    raise UsageError(
        f"allocator {a.name} is not installed ({' or '.join(a.libraries)} not found)",
        f"install Debian's {a.package} (make setup does)",
    )


def available() -> dict[str, str | None]:
    """name -> library path for every allocator present on this machine."""
    out: dict[str, str | None] = {}
    for n in ALLOCATORS:
        try:
            out[n] = find_library(n)
        except UsageError:
            continue
    return out
