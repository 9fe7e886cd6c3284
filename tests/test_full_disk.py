"""A full disk on a write path is one `Error:` line naming where, never a traceback, and nothing is
left half-made: a small tmpfs stands in for the full disk (root: mount)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli, wait_gone

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts a small tmpfs)")


@contextlib.contextmanager
def _tmpfs(options: str):
    d = Path(tempfile.mkdtemp(prefix="tw-full-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True)
    if mounted.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


@pytest.fixture
def small_fs():
    with _tmpfs("size=256k") as d:
        yield d


def _fill(d: Path) -> None:
    """Fill the file system of d to the last byte."""
    with open(d / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * 4096)


def _one_error_line(cp) -> str:
    """The one Error line (progress lines may come before it), and no traceback."""
    lines = cp.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert cp.returncode in (1, 2) and errors == lines[-1:] and "Traceback" not in cp.stderr, cp.stderr[-3000:]
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


def test_a_layout_store_on_a_full_disk(small_fs, tmp_path):
    """`data layout --apply-layout` into a full layout store: one line, and no half-made layout there."""
    _fill(small_fs)
    store = small_fs / "layouts"
    cp = run_cli("data", "layout", "--benchmark", "tpch", "--sf", "0.01", "--data-dir", str(tmp_path / "data"),
                 "--queries", "6", "--layouts", "parquet-1", "--runs", "1", "--apply-layout", "parquet-1",
                 "--layout-dir", str(store), timeout=300)
    line = _one_error_line(cp)
    assert "not enough disk space" in line and "--layout-dir" in line, line
    assert not [p for p in small_fs.rglob("*") if p.name != "filler" and p.is_file()], list(small_fs.rglob("*"))


def test_references_on_a_full_data_disk_only_cost_recomputation(tpch_sf001, state_env, tmp_path):
    """The data set's disk is full: the reference answers cannot be cached beside it, so they are
    computed and used without being kept; every answer is still checked."""
    src = tpch_sf001 / "sf0.01"
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and "reference" not in p.parts)
    with _tmpfs(f"size={size // 1024 + 1024}k") as fs:
        shutil.copytree(src, fs / "sf0.01", ignore=shutil.ignore_patterns("reference", "refresh", "postgres"))
        _fill(fs)
        out = tmp_path / "res"
        cp = run_cli("bench", "tpch", "--sf", "0.01", "--data-dir", str(fs), "--queries", "1,6,13",
                     "--policies", "wim", "--runs", "1", "--no-warmup", "--tests", "power", "--no-refresh",
                     "--no-plots", "--out", str(out), "--json", env=state_env, timeout=300)
        assert cp.returncode == 0, cp.stderr[-3000:]
        qs = json.loads(cp.stdout)["policies"]["wim"]["queries"]
        assert sorted(qs) == ["q1", "q13", "q6"] and all(q["valid"] is True for q in qs.values()), qs
        assert not list((fs / "sf0.01").glob("reference/**/*.json"))


def test_a_full_state_directory_refuses_before_anything_starts(tpch_sf001, tmp_path):
    """The undo journal (and its lock) cannot be written: one line, nothing started, nothing made."""
    with _tmpfs("size=256k,nr_inodes=8") as fs:
        _fill(fs)
        for i in range(16):  # and no inode left for a lock or a journal file
            with contextlib.suppress(OSError):
                (fs / f"i{i}").touch()
        env = {"TILEWISE_STATE_DIR": str(fs / "state"), "TILEWISE_TEST_TAG": str(tmp_path)}
        cp = run_cli("bench", "tpch", "--sf", "0.01", "--data-dir", str(tpch_sf001), "--queries", "6",
                     "--policies", "wim", "--runs", "1", "--no-warmup", "--tests", "power", "--no-refresh",
                     "--no-plots", "--out", str(tmp_path / "res"), env=env, timeout=300)
        line = _one_error_line(cp)
        assert "No space left" in line or "cannot write" in line, line
        assert not wait_gone("TILEWISE_TEST_TAG", str(tmp_path), 5)
        # the results record the failed start (a run that failed says why), and nothing else is there
        doc = json.loads((tmp_path / "res" / "results.json").read_text())
        assert doc["complete"] is False and "state directory" in doc["policies"]["wim"]["error"]
        assert [p.name for p in (tmp_path / "res").iterdir()] == ["results.json"]


def test_a_lock_on_a_disk_without_inodes(tmp_path):
    """data generate: no inode for its lock file: one line, nothing generated."""
    with _tmpfs("size=1m,nr_inodes=3") as fs:
        for i in range(8):
            with contextlib.suppress(OSError):
                (fs / f"i{i}").touch()
        cp = run_cli("data", "generate", "--benchmark", "tpch", "--sf", "0.01", "--data-dir", str(fs), timeout=120)
        line = _one_error_line(cp)
        assert "No space left" in line or "cannot write" in line, line
        assert sorted(p.name for p in fs.iterdir()) == sorted(p.name for p in fs.iterdir() if p.name.startswith("i"))
