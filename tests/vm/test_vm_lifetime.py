"""A guest's life is tied to the Python that booted it: when that process is stopped by SIGTERM
(what a timeout does to pytest, which then runs no finally), its QEMU goes too, instead of running
on as an orphan for the rest of the guest's timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tilewise import procs
from vm import harness

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

TESTS = Path(__file__).resolve().parent.parent

BOOT_AND_WAIT = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from vm import harness
from vm.topologies import TOPOLOGIES
harness.run(TOPOLOGIES["single-node"], "sleep 300", timeout=600)
"""


def _qemu_below(pid: int) -> list[procs.ProcId]:
    table = procs.scan()
    return [table[p].id for p in procs.descendants([pid], table) if table[p].comm.startswith("qemu")]


def test_a_guest_dies_with_the_python_that_booted_it():
    runner = subprocess.Popen([sys.executable, "-c", BOOT_AND_WAIT], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    guests: list[procs.ProcId] = []
    try:
        deadline = time.monotonic() + 120
        while not (guests := _qemu_below(runner.pid)):
            assert runner.poll() is None, "the runner ended before its guest started"
            assert time.monotonic() < deadline, "no QEMU started"
            time.sleep(0.2)
        time.sleep(1.0)
        runner.send_signal(signal.SIGTERM)  # Python's default: it dies at once, no finally runs
        assert runner.wait(timeout=30) == -signal.SIGTERM
        deadline = time.monotonic() + 20
        while [g for g in guests if g.alive()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [g for g in guests if g.alive()], "QEMU outlived the process that booted it"
        # its folder (initrd, console) is left by the dead runner; the next guest run's sweep removes it
        mine = list(Path(tempfile.gettempdir()).glob(f"{harness.SCRATCH_PREFIX}{runner.pid}-*"))
        assert mine, "the runner's guest folder was not where the sweep looks"
        assert set(mine) <= set(harness.sweep())
        assert not [d for d in mine if d.exists()]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        left = [g for g in guests if g.alive()]
        if left:  # the fix failed: do not leave them running either
            procs.stop([procs.Tree(g) for g in left])
