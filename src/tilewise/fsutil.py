"""Crash-safe file writes: a temp file in the same directory, fsync, rename, fsync of the directory.

A reader (or a restarted tilewise) sees the old file or the new one, never half of either. Every
result, journal, state file and plot tilewise writes goes through here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path

from tilewise.errors import UsageError


_MADE: list[Path] = []  # folders ensure_writable_dir created in this process, outermost first


def ensure_writable_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """Create the output folder and prove it takes a file, before any measurement starts. The
    folders it creates are remembered: a command that then fails removes them while still empty
    (discard_made_dirs), so a refusal leaves no empty --out behind."""
    d = Path(path)
    try:
        make_dirs(d)
        probe = d / f".tilewise-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to {what} {d}: {e.strerror or e}", f"pick another {what}") from None
    return d


def make_dirs(d: Path) -> Path:
    """mkdir -p that remembers the folders it created, for discard_made_dirs: a command that fails
    leaves no empty folder it made (an --out, a data or layout store's table folder)."""
    d = Path(d)
    missing = [p for p in (d, *d.parents) if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    _MADE.extend(reversed(missing))
    return d


def discard_made_dirs() -> list[Path]:
    """Remove the folders ensure_writable_dir created that are still empty (innermost first): what a
    command that fails leaves of its --out. Returns what was removed."""
    removed = []
    for p in reversed(_MADE):
        try:
            p.rmdir()  # only an empty folder
            removed.append(p)
        except OSError:
            pass
    _MADE.clear()
    return removed


def atomic_write(path: str | os.PathLike, data: str | bytes, *, mode: int = 0o644) -> Path:
    """data into path, whole or not at all (a temporary file renamed over it). Only a regular file is
    replaced: a device, FIFO or socket at path (/dev/null) is refused, never swapped for a file."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path} is not a regular file; tilewise writes its files whole, by replacing them",
                         "name a file instead")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def replace_dir(src: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Put the finished directory src (a sibling of target) in target's place by rename: a reader sees
    the old directory or the new one, never half of either. An old target is renamed aside first, then
    deleted."""
    import shutil

    src, target = Path(src), Path(target)
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(src, target)
    return target


def atomic_write_json(path: str | os.PathLike, doc, *, indent: int | None = 2, mode: int = 0o644,
                      **dump_kwargs) -> Path:
    return atomic_write(path, json.dumps(doc, indent=indent, **dump_kwargs) + "\n", mode=mode)


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """Render a matplotlib figure to PNG in memory, then write it atomically and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=savefig_kwargs.pop("dpi", 110), **savefig_kwargs)
    finally:
        plt.close(fig)
    return atomic_write(path, buf.getvalue())


def remove_run_dir(root: str | os.PathLike) -> bool:
    """Remove a run's working directory; on the way out of an error (an Exception being handled or
    propagating; not an interrupt) that names a log in it, its `logs` folder stays where the error
    says, and everything else (sockets, spill, data) goes. Returns True when logs were kept."""
    import shutil
    import sys

    root = Path(root)
    failing = sys.exc_info()[1]
    named = isinstance(failing, Exception) and str(root / "logs") in str(failing)
    if not named or not (root / "logs").is_dir():
        shutil.rmtree(root, ignore_errors=True)
        return False
    for p in root.iterdir():
        if p.name == "logs":
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def locked_file(path: str | os.PathLike, *, cannot, timeout_s: float | None = None, busy: Exception | None = None,
                remove_after=lambda: True):
    """Hold an exclusive flock on the lock file at path for the block (waiting up to timeout_s, then
    raising `busy`; None: as long as it takes). The file goes with what it guards: when remove_after()
    is true at the end it is unlinked while still held, and a waiter that then gets the lock on the
    unlinked file sees that its inode is no longer the path's and opens the path again (a lock on a
    file no longer at the path guards nothing). cannot(OSError) -> the exception to raise when the
    file cannot be made (a full or read-only disk, a missing permission)."""
    path = Path(path)
    while True:
        try:
            fh = open(path, "a")
        except OSError as e:
            raise cannot(e) from None
        try:
            _flock(fh, timeout_s, busy)
            if os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        except BaseException:
            fh.close()
            raise
        fh.close()
    try:
        yield fh
    finally:
        try:
            if remove_after():
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            fh.close()


def _flock(fh, timeout_s: float | None, busy: Exception | None) -> None:
    import fcntl
    import time

    if timeout_s is None:
        fcntl.flock(fh, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise busy from None
            time.sleep(0.05)
