"""The data cache: one directory per generated set, built whole or not at all.

A set is <root>/<name>/{<table>.parquet..., manifest.json}. It is built into a temporary sibling
directory and renamed into place, under a lock per set, so a crash never leaves half a set and two
generators of the same set never race (the second waits and reuses). A set whose manifest, file
sizes or Parquet footers do not check out is rebuilt. The manifest names the format of the set
(which generator, which rules), the generator versions and every table's rows and bytes.

``ensure_dir`` is the mechanism for any directory built whole (a set here, one table's copy in a
layout, tilewise.data.layouts): the temporary sibling ``.<name>.tmp-XXXX`` is removed on every
error or interrupt, and what a killed builder (SIGKILL, power loss) left is swept by the next
builder under the same lock, so partial output is never read and never accumulates.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tilewise import dirs, fsutil
from tilewise import launch, procs
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import atomic_write_json, replace_dir

MANIFEST = "manifest.json"

# progress(task, done, total): what a long build reports (total None: unknown)
Progress = Callable[[str, float, "float | None"], None]


def find_tool(name: str) -> str:
    """A generator installed with tilewise's Python (a pip package's executable, e.g. tpchgen-cli),
    else on PATH; a one-line error naming the install when it is in neither."""
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not exe:
        raise TilewiseError(f"{name} not found", f"install it with `pip install {name}` (make setup does)")
    return exe


def cache_root(kind: str) -> Path:
    """~/.cache/tilewise/<kind> (XDG_CACHE_HOME honoured)."""
    return dirs.cache_dir(kind)


def read_manifest(d: Path) -> dict | None:
    try:
        return json.loads((Path(d) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_valid(d: Path, fmt: str, tables: tuple[str, ...]) -> bool:
    """True when d holds a complete set of format fmt: manifest, every table, sizes and footers match."""
    return problem(d, fmt, tables) is None


def problem(d: Path, fmt: str | None, tables: tuple[str, ...]) -> str | None:
    """What is wrong with the set in d (None: it is complete and intact): "no set" when it holds none,
    else the first damage found (a table missing, cut short, or not what its manifest says)."""
    man = read_manifest(d)
    if not isinstance(man, dict):
        return "no set"
    if fmt is not None and man.get("format") != fmt:
        return f"a set of another format ({man.get('format')!r})"
    try:
        import pyarrow.parquet as pq

        for t in tables:
            f = Path(d) / f"{t}.parquet"
            info = man["tables"][t]
            if not f.exists():
                return f"{f.name} is missing"
            if f.stat().st_size != info["bytes"]:
                return f"{f.name} is {f.stat().st_size:,} bytes where its manifest says {info['bytes']:,}"
            if pq.read_metadata(f).num_rows != info["rows"]:
                return f"{f.name} holds other rows than its manifest says"
        return None
    except Exception as e:  # any unreadable piece means "rebuild"
        return f"it cannot be read ({' '.join(str(e).split())[:120]})"


def table_info(d: Path, tables: tuple[str, ...]) -> dict:
    """{table: {rows, bytes}} of the Parquet files in d (each must exist)."""
    import pyarrow.parquet as pq

    out = {}
    for t in tables:
        f = Path(d) / f"{t}.parquet"
        if not f.exists():
            raise TilewiseError(f"the generator did not write {f.name}")
        out[t] = {"rows": pq.read_metadata(f).num_rows, "bytes": f.stat().st_size}
    return out


def ensure(target: Path, fmt: str, build: Callable[[Path], dict], *, what: str, tables: tuple[str, ...],
           log=None) -> Path:
    """The set at target, built by build(tmp_dir) -> manifest fields when missing or invalid
    (`tables`: the Parquet files the set holds; the 8 TPC-H tables unless told)."""
    def make(tmp: Path) -> None:
        t0 = time.monotonic()
        extra = build(tmp)
        man = {"format": fmt, **extra, "tables": table_info(tmp, tables), "generated_s": round(time.monotonic() - t0, 2)}
        atomic_write_json(tmp / MANIFEST, man)

    return ensure_dir(Path(target), lambda d: is_valid(d, fmt, tables), make, what=what, log=log)


def locked(target: Path, option: str = "--data-dir"):
    """Hold target's lock (a file beside it, in its parent directory) for the block; the file is
    removed after it (fsutil.locked_file), so a data folder keeps no lock file of a build; a
    UsageError names the directory, and the option that chooses it, when it cannot be made."""
    def cannot(e: OSError) -> UsageError:
        why = ("a part of the path is a file, not a folder" if e.errno in (errno.EEXIST, errno.ENOTDIR)
               else e.strerror)
        return UsageError(f"cannot use directory {target.parent}: {why}", f"pass {option} DIR")

    try:
        fsutil.make_dirs(target.parent)
    except OSError as e:
        raise cannot(e) from None
    return fsutil.locked_file(target.parent / f".{target.name}.lock", cannot=cannot)


def stale_builds(target: Path) -> list[Path]:
    """Temporary directories a builder of target left behind (it was killed: SIGKILL, power loss).
    Only meaningful while holding target's lock: every live builder holds it while its directory exists."""
    return sorted(p for p in target.parent.glob(f".{target.name}.tmp-*") if p.is_dir())


def ensure_dir(target: Path, valid: Callable[[Path], bool], build: Callable[[Path], None], *, what: str,
               log=None, option: str = "--data-dir") -> Path:
    """The directory target, built whole or not at all: when valid(target) fails, build(tmp) fills a
    temporary sibling which is then renamed into place; under a lock per target (a second builder
    waits and reuses), with what a killed builder left swept first. On any error or interrupt the
    temporary directory is removed: a reader never sees half a build, and a failed one leaves nothing."""
    target = Path(target)
    if valid(target):
        return target
    with locked(target, option):  # one builder per target at a time; others wait and reuse
        if valid(target):
            return target
        for old in stale_builds(target):  # a crashed builder's partial output: never read, removed
            if log:
                log(f"removing {old.name}, left by a build that did not finish")
            shutil.rmtree(old, ignore_errors=True)
        if log:
            log(f"generating {what} into {target}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            replace_dir(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_with_size_progress(cmd: list[str], out_dir: Path, *, task: str, expected_bytes: float | None,
                           progress: Progress | None, what: str) -> None:
    """Run a generator subprocess; while it runs, report the bytes it has written under out_dir.
    Raises TilewiseError with the tail of its stderr when it fails; kills it on any exception."""
    import subprocess

    proc = launch.spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if progress:
                progress(task, float(_tree_bytes(out_dir)), expected_bytes)
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        procs.stop(proc, grace=0)  # the generator and anything it started
        raise
    reader.join(timeout=5)
    if proc.returncode != 0:
        raise TilewiseError(f"{what} failed: {''.join(err).strip()[-300:]}")
    if progress:
        size = float(_tree_bytes(out_dir))
        progress(task, size, size)


def _tree_bytes(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
