"""Shared pytest setup: slow/device/root tests are skipped by default; topology fixtures."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")
    parser.addoption("--run-device", action="store_true", help="run tests that need a 16+ core machine or a GPU")


def run_slow(config) -> bool:
    """Whether this session runs the slow tests (and the guests' slow checks)."""
    return bool(config.getoption("--run-slow") or os.environ.get("TILEWISE_SLOW") == "1")


def pytest_collection_modifyitems(config, items):
    slow = run_slow(config)
    # timing-sensitive tests last (a stable sort): by then the guests have ended (_quiet waits for them)
    items.sort(key=lambda item: item.get_closest_marker("quiet") is not None)
    run_device = config.getoption("--run-device") or os.environ.get("TILEWISE_DEVICE") == "1"
    # markers, not keywords: keywords also hold directory names (a checkout in a folder named vm...)
    vm_skip = None
    if any(item.get_closest_marker("vm") for item in items):
        vm_skip = _vm_skip_reason()
    for item in items:
        if item.get_closest_marker("slow") and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --run-slow or TILEWISE_SLOW=1"))
        if item.get_closest_marker("device") and not run_device:
            item.add_marker(pytest.mark.skip(reason="device: needs a 16+ core machine or a GPU (--run-device)"))
        if item.get_closest_marker("root") and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root"))
        if item.get_closest_marker("vm") and vm_skip:
            item.add_marker(pytest.mark.skip(reason=vm_skip))
        if item.get_closest_marker("trino"):
            why = _trino_missing()
            if why and os.environ.get("TILEWISE_TRINO_E2E") != "1":
                item.add_marker(pytest.mark.skip(reason=f"trino: {why}"))
            # under TILEWISE_TRINO_E2E=1 (CI) a missing Trino fails the test instead of skipping it


def pytest_collection_finish(session):
    """Start the QEMU guests as soon as the tests are known, when a selected test will read one: they
    boot two at a time beside the host's tests (about 12 minutes of guest time on 2 cores) instead of
    after them."""
    config = session.config
    if config.option.collectonly or getattr(config, "_tilewise_vm_guests", None) is not None:
        return
    if not any("guests" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("skip")
               for item in session.items):
        return
    from vm.guests import of_session

    of_session(config, run_slow(config)).start()


def pytest_sessionfinish(session):
    g = getattr(session.config, "_tilewise_vm_guests", None)
    if g is not None:
        g.close()


@pytest.fixture(autouse=True)
def _quiet(request):
    """A `quiet` test starts once the session's QEMU guests have ended (they run at the session's end,
    so this rarely waits)."""
    g = getattr(request.config, "_tilewise_vm_guests", None)
    if g is not None and request.node.get_closest_marker("quiet"):
        g.wait()


def _vm_skip_reason() -> str | None:
    """Why the QEMU guest tests cannot run here (None: they run)."""
    if os.environ.get("TILEWISE_VM") == "0":
        return "vm: TILEWISE_VM=0"
    from vm import harness

    why = harness.missing_prerequisites()
    return f"vm: {why}" if why else None


def _trino_missing() -> str | None:
    """Why the Trino tests cannot run here (None: they can); computed once."""
    global _TRINO_WHY
    if _TRINO_WHY is None:
        from tilewise.engines.trino import install as trino_install

        _TRINO_WHY = [trino_install.missing()]
    return _TRINO_WHY[0]


_TRINO_WHY = None


@pytest.fixture
def trino_ready():
    """Fails (not skips) when Trino is missing: only reached when the test was not skipped."""
    why = _trino_missing()
    if why:
        pytest.fail(f"TILEWISE_TRINO_E2E=1 but Trino cannot run: {why}")


@pytest.fixture(autouse=True)
def _dev_null_stays():
    """No test may replace /dev/null (a command told to write a file there once did: every later
    process that opened it got a regular file). Checked after each test, and put back."""
    yield
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        if os.geteuid() == 0:
            os.unlink("/dev/null")
            os.mknod("/dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod("/dev/null", 0o666)
        pytest.fail("this test replaced /dev/null with a regular file (put back)")


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch):
    """Journals and locks of every test go to its own directory, never to /run/tilewise."""
    d = tmp_path / "tilewise-state"
    monkeypatch.setenv("TILEWISE_STATE_DIR", str(d))
    return d


def run_cli(*args: str, check: bool = False, timeout: float = 300, env: dict | None = None, input: str | None = None,
            cwd=None):
    """Run the real `tilewise` CLI in a subprocess (end-to-end), returning CompletedProcess."""
    exe = shutil.which("tilewise", path=str(Path(sys.executable).parent)) or "tilewise"
    full_env = dict(os.environ)
    full_env.update(env or {})
    cp = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=full_env, input=input,
                        cwd=cwd)
    if check and cp.returncode != 0:
        raise AssertionError(f"tilewise {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp


def tagged(var: str, value: str) -> list:
    """Live processes whose environment has var=value (children inherit it: every JVM, executor, server)."""
    from tilewise.engines.procgroup import tagged_processes

    return tagged_processes(value, var)


def wait_gone(var: str, value: str, timeout: float = 20.0) -> list:
    """Wait until no process carries var=value; returns what is left after timeout."""
    import time

    deadline = time.monotonic() + timeout
    while (left := tagged(var, value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def state_env(tmp_path):
    """A private cluster state directory; whatever the test started there is killed afterwards,
    even when the test failed (every process carries TILEWISE_CLUSTER_DIR in its environment)."""
    import psutil

    d = str(tmp_path / "clusters")
    yield {"TILEWISE_CLUSTER_DIR": d, "TILEWISE_STATE_DIR": str(tmp_path / "state")}
    for p in tagged("TILEWISE_CLUSTER_DIR", d):
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="session")
def tpch_sf001(tmp_path_factory):
    """A TPC-H SF 0.01 data set shared by the tests that start engines on it (an engine's cached load,
    PostgreSQL's, lives beside it and is made once)."""
    from tilewise.benchmarks.tpch import data as tpch_data

    root = tmp_path_factory.mktemp("tpch-sf001")
    tpch_data.ensure_data(0.01, root)
    return root


@pytest.fixture
def forking_env(tmp_path, state_env):
    """The process-per-connection stand-in engine `forking` (tests/fixtures/forking_engine: a server
    that forks a child per connection, the shape of PostgreSQL) and the SQLite engine it is built on,
    on PYTHONPATH with their entry points, as `pip install` would leave them."""
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "engine_plugin", site)
    shutil.copytree(FIXTURES / "forking_engine", site, dirs_exist_ok=True)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**state_env, "PYTHONPATH": path, "TILEWISE_TEST_TAG": str(tmp_path)}


@pytest.fixture
def sleeper():
    """A process of ours that sleeps (a target to bind, move or refuse)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def jcch_sf01(tmp_path_factory):
    """A JCC-H SF 0.1 set (seed 0), generated once per test session into a tmp dir (~10 s)."""
    from tilewise.benchmarks.jcch import data as jcch

    return jcch.dataset(0.1, tmp_path_factory.mktemp("jcch-data"), seed=0)


def elastic_groups() -> set[str]:
    """The elastic daemons' groups (tilewise-elastic-<pid>-<random>) anywhere in the cgroup v1 cpuset tree."""
    from tilewise.cgroups import mounts

    root = mounts()["v1"]
    return {os.path.join(r, d) for r, dirs, _ in os.walk(root) for d in dirs
            if d.startswith("tilewise-elastic-")} if root else set()
