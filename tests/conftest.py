"""Shared pytest setup: slow/device/root tests are skipped by default; topology fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")
    parser.addoption("--run-device", action="store_true", help="run tests that need a 16+ core machine")


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--run-slow") or os.environ.get("TILEWISE_SLOW") == "1"
    run_device = config.getoption("--run-device") or os.environ.get("TILEWISE_DEVICE") == "1"
    # markers, not keywords: keywords also hold directory names (a checkout in a folder named vm...)
    vm_skip = None
    if any(item.get_closest_marker("vm") for item in items):
        vm_skip = _vm_skip_reason()
    for item in items:
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --run-slow or TILEWISE_SLOW=1"))
        if item.get_closest_marker("device") and not run_device:
            item.add_marker(pytest.mark.skip(reason="device: needs a 16+ core machine (--run-device)"))
        if item.get_closest_marker("root") and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root"))
        if item.get_closest_marker("vm") and vm_skip:
            item.add_marker(pytest.mark.skip(reason=vm_skip))


def _vm_skip_reason() -> str | None:
    """Why the QEMU guest tests cannot run here (None: they run)."""
    if os.environ.get("TILEWISE_VM") == "0":
        return "vm: TILEWISE_VM=0"
    from vm import harness

    why = harness.missing_prerequisites()
    return f"vm: {why}" if why else None


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch):
    """Journals and locks of every test go to its own directory, never to /run/tilewise."""
    d = tmp_path / "tilewise-state"
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(d))
    return d


def run_cli(*args: str, check: bool = False, timeout: float = 300, env: dict | None = None, input: str | None = None):
    """Run the real `tilewise` CLI in a subprocess (end-to-end), returning CompletedProcess."""
    exe = shutil.which("tilewise", path=str(Path(sys.executable).parent)) or "tilewise"
    full_env = dict(os.environ)
    full_env.update(env or {})
    cp = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=full_env, input=input)
    if check and cp.returncode != 0:
        raise AssertionError(f"tilewise {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def jcch_sf01(tmp_path_factory):
    """A JCC-H SF 0.1 set (seed 0), generated once per test session into a tmp dir (~10 s)."""
    from tilewise.data import jcch

    return jcch.dataset(0.1, tmp_path_factory.mktemp("jcch-data"), seed=0)
