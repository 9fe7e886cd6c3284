"""Building the tiles engine's native binary (native/tiles, Rust, on datafusion-distributed 4.x).

`tilewise engines install tiles` (and `make setup-all`, so `make test` and CI) runs cargo once per
version of the sources: the binary is cached outside the checkout, under
``<cache>/tiles/<key>/tilewise-tiles``, where the key is a digest of the crate's sources, its lock
file and the compiler's version; cargo's own target directory (``<cache>/tiles/target``) is shared
by every key and every checkout on the machine (a CI clone reuses it), so a change of our sources
recompiles our crate only (seconds), not the 300 crates below it; the binary copied out is checked
to be of these sources (`tilewise-tiles source-key`) (a cold build: 12-16 min on 2 cores with the `tilewise` profile, opt-level 1, 16 codegen
units, no LTO or debug info). A failed build raises one error with the compiler's first error and
the log's path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tilewise import dirs, envvars
from tilewise.errors import TilewiseError

CRATE = Path(__file__).resolve().parents[4] / "native" / "tiles"
BINARY = "tilewise-tiles"
PROFILE = "tilewise"
KEY_VAR = "TILEWISE_TILES_SOURCE_KEY"  # the sources' key, compiled into the binary (`source-key`)
CACHE = envvars.Var("TILEWISE_TILES_CACHE", envvars.directory, "a directory",
                     "set it to a writable directory for the engine's build, or unset it")
CACHE_VAR = CACHE.name
# how the workers compress what they send each other: unset, none over shm and unix (no network to
# save; measured faster, docs/tiles.md) and the crate's lz4 over tcp (between hosts too)
COMPRESSION = envvars.Var("TILEWISE_TILES_COMPRESSION", envvars.choice("none", "lz4", "zstd"), "none, lz4 or zstd",
                          "unset it for the measured default (none over shm and unix, lz4 over tcp)")
# over shm, how the batches travel: `direct` (the default) writes each one once into memory on the
# receiving tile's node and reads it there in place (native/tiles/src/exchange.rs); `grpc` sends
# them over the rings' gRPC like the control messages (to measure what the direct path saves)
SHM_DATA = envvars.Var("TILEWISE_TILES_SHM_DATA", envvars.choice("direct", "grpc"), "direct or grpc",
                       "unset it for the default (direct: one copy per hop)")


def cache_root() -> Path:
    return dirs.cache_dir("tiles", override=CACHE)


def _sources() -> list[Path]:
    return sorted([CRATE / "Cargo.toml", CRATE / "Cargo.lock", *(CRATE / "src").rglob("*.rs")])


@functools.lru_cache(maxsize=1)
def rustc_version() -> str | None:
    exe = shutil.which("rustc")
    if exe is None:
        return None
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return r.stdout.strip() or None


def source_key() -> str:
    h = hashlib.sha256()
    for p in _sources():
        h.update(str(p.relative_to(CRATE)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update((rustc_version() or "").encode())
    return h.hexdigest()[:16]


def binary_path() -> Path:
    return cache_root() / source_key() / BINARY


def missing() -> str | None:
    """Why the engine cannot run here (None: its binary for these sources is built)."""
    if not (CRATE / "Cargo.toml").is_file():
        return f"its sources are not here ({CRATE}): install tilewise from its checkout"
    if shutil.which("cargo") is None:
        return "cargo (Rust) is not installed: install rustup's stable toolchain, then `tilewise engines install tiles`"
    if not binary_path().is_file():
        return "its binary is not built for these sources: run `tilewise engines install tiles` (a first build takes 12-16 min on 2 cores)"
    return None


def first_error(log: str) -> str:
    """The compiler's first error line (with the line after it that says where), for the one-line message."""
    lines = log.splitlines()
    for i, ln in enumerate(lines):
        if re.match(r"^error(\[E\d+\])?:", ln):
            where = next((x.strip() for x in lines[i + 1:i + 3] if x.strip().startswith("-->")), "")
            return (ln.strip() + (f" ({where})" if where else ""))[:400]
    return (lines[-1].strip() if lines else "no output")[:400]


def build(message=lambda s: None) -> dict:
    """Build the binary for the current sources (nothing to do when it is cached); what happened."""
    key = source_key()
    out = cache_root() / key
    exe = out / BINARY
    if exe.is_file():
        return {"binary": str(exe), "key": key, "built": False}
    cargo = shutil.which("cargo")
    if cargo is None:
        raise TilewiseError("cannot build the tiles engine: cargo is not installed",
                            "install Rust (rustup, stable), then run `tilewise engines install tiles` again")
    target = cache_root() / "target"
    target.mkdir(parents=True, exist_ok=True)
    log = cache_root() / f"build-{key}.log"
    message(f"building {BINARY} (Rust, profile {PROFILE}) into {out}; cargo's target directory {target}")
    t0 = time.monotonic()
    with open(log, "w") as fh:
        r = subprocess.run([cargo, "build", "--locked", "--profile", PROFILE, "--bin", BINARY],
                           cwd=CRATE, env=dict(os.environ, CARGO_TARGET_DIR=str(target), **{KEY_VAR: key}),
                           stdout=fh, stderr=subprocess.STDOUT)
    seconds = round(time.monotonic() - t0, 1)
    if r.returncode != 0:
        raise TilewiseError(f"the tiles engine's build failed: {first_error(log.read_text(errors='replace'))}",
                            f"the whole log: {log}")
    built = target / PROFILE / BINARY
    # the target directory is shared by every checkout on this machine (a CI clone, a worktree), and
    # cargo gives two checkouts of one crate the same fingerprint: after another checkout's build it
    # took this one's changed sources for up to date and the other's binary was copied out (seen).
    # The crate reads the key (KEY_VAR), so cargo compiles it again whenever the key changes, and the
    # binary says which key it was built with: it must be this one.
    stamp = _stamp(built)
    if stamp != key:
        raise TilewiseError(f"the tiles engine's build left a binary of other sources in {built} "
                            f"(its key {stamp or 'unknown'}, these sources' {key})",
                            f"remove {target} and run `tilewise engines install tiles` again")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{BINARY}.tmp"
    shutil.copy2(built, tmp)
    os.replace(tmp, exe)
    doc = {"binary": str(exe), "key": key, "built": True, "seconds": seconds, "bytes": exe.stat().st_size,
           "rustc": rustc_version()}
    (out / "build.json").write_text(json.dumps(doc, indent=2) + "\n")
    log.unlink(missing_ok=True)
    doc["removed"] = prune(keep=KEEP)
    return doc


def _stamp(binary: Path) -> str | None:
    """The source key a built binary was compiled with (`tilewise-tiles source-key`)."""
    try:
        r = subprocess.run([str(binary), "source-key"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


KEEP = 2  # binaries kept: this one and the one before it (a branch switch back costs no rebuild)


def prune(keep: int = KEEP) -> list[str]:
    """Remove all but the `keep` newest binaries (each about 120 MB); cargo's target directory stays."""
    built = sorted((d for d in cache_root().iterdir() if (d / "build.json").is_file()),
                   key=lambda d: (d / "build.json").stat().st_mtime, reverse=True)
    gone = []
    for d in built[keep:]:
        shutil.rmtree(d, ignore_errors=True)
        gone.append(str(d))
    return gone
