"""A full disk on a write path is one `Error:` line naming where, never a traceback, and nothing is
left half-made: a small tmpfs stands in for the full disk (root: mount)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli, wait_gone

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts a small tmpfs)")


@pytest.fixture
def small_fs():
    d = Path(tempfile.mkdtemp(prefix="tw-full-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True)
    if mounted.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


def _one_error_line(cp) -> str:
    """The one Error line (progress lines may come before it), and no traceback."""
    lines = cp.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert cp.returncode == 1 and errors == lines[-1:] and "Traceback" not in cp.stderr, cp.stderr[-3000:]
    return errors[0]


def test_data_generation_on_a_full_disk(small_fs):
    cp = run_cli("data", "generate", "--benchmark", "jcch", "--sf", "0.01", "--data-dir", str(small_fs), timeout=300)
    line = _one_error_line(cp)
    assert line.startswith("Error: ") and ("No space left" in line or "cannot write" in line), line
    assert not [p for p in small_fs.rglob("*") if p.is_file() and not p.name.startswith(".")], list(small_fs.rglob("*"))


def test_up_with_a_full_cluster_directory(small_fs, state_env):
    (small_fs / "filler").write_bytes(b"x" * (256 * 1024 - 4096 * 2))  # all but a page or two
    env = {**state_env, "TILEWISE_CLUSTER_DIR": str(small_fs / "clusters")}
    cp = run_cli("up", "--engine", "duckdb", "--policy", "wim", "--name", "full", env=env, timeout=120)
    line = _one_error_line(cp)
    assert "cannot" in line and ("No space left" in line or "clusters" in line), line
    assert not wait_gone("TILEWISE_CLUSTER_DIR", env["TILEWISE_CLUSTER_DIR"]), "a server outlived the failed up"
    assert not list((small_fs / "clusters").glob("*.json")) if (small_fs / "clusters").exists() else True


def test_the_elastic_state_directory_full(small_fs, sleeper):
    (small_fs / "filler").write_bytes(b"x" * (256 * 1024))
    cp = run_cli("elastic", "--pid", str(sleeper.pid), "--duration", "1", "--enforce", "affinity",
                 env={"TILEWISE_STATE_DIR": str(small_fs / "state")}, timeout=60)
    line = _one_error_line(cp)
    assert line.startswith("Error: "), line
