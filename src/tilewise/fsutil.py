"""Crash-safe file writes: a temp file in the same directory, fsync, rename, fsync of the directory.

A reader (or a restarted tilewise) sees the old file or the new one, never half of either. Every
result, journal, state file and plot tilewise writes goes through here.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

from tilewise.errors import UsageError


def ensure_writable_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """Create the output folder and prove it takes a file, before any measurement starts."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".tilewise-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to {what} {d}: {e.strerror or e}", f"pick another {what}") from None
    return d


def atomic_write(path: str | os.PathLike, data: str | bytes, *, mode: int = 0o644) -> Path:
    path = Path(path)
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
