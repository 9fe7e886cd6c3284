"""THP and AutoNUMA changes and their restoration, on a FAKE sysfs/procfs root (never the real one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilewise.errors import TilewiseError, UsageError
from tilewise.tune.os_switches import JOURNAL_REL, SWITCHES, Change, Journal, OsSwitches

THP = "sys/kernel/mm/transparent_hugepage/enabled"
NB = "proc/sys/kernel/numa_balancing"


def write_value(path: Path, key: str, value: str) -> None:
    """Emulate the kernel: THP shows all modes with the current one in brackets."""
    if key == "thp":
        path.write_text(" ".join(f"[{m}]" if m == value else m for m in SWITCHES["thp"].choices) + "\n")
    else:
        path.write_text(value + "\n")


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / THP).parent.mkdir(parents=True)
    (r / NB).parent.mkdir(parents=True)
    write_value(r / THP, "thp", "madvise")
    write_value(r / NB, "autonuma", "1")
    (r / "proc/sys/kernel/random").mkdir(parents=True)
    (r / "proc/sys/kernel/random/boot_id").write_text("boot-a\n")
    return r


def raw(root: Path, rel: str) -> str:
    return (root / rel).read_text().strip()


def thp(root: Path) -> str:
    return SWITCHES["thp"].parse(raw(root, THP))


def test_state_reads_both_switches(root):
    st = OsSwitches(str(root)).state()
    assert (st["thp"].value, st["thp"].shown) == ("madvise", "madvise")
    assert (st["autonuma"].value, st["autonuma"].shown) == ("1", "on")


def test_applied_changes_then_restores_and_removes_journal(root):
    sw = OsSwitches(str(root))
    with sw.applied({"thp": "never", "autonuma": "off"}) as changes:
        assert [c.key for c in changes] == ["thp", "autonuma"]
        assert sw.read("thp") == "never" and sw.read("autonuma") == "0"
        j = json.loads((root / JOURNAL_REL).read_text())
        assert j["version"] == 1 and [c["old"] for c in j["changes"]] == ["madvise", "1"]
    assert thp(root) == "madvise" and raw(root, NB) == "1"
    assert not (root / JOURNAL_REL).exists()


def test_restored_on_exception_in_the_block(root):
    sw = OsSwitches(str(root))
    with pytest.raises(KeyboardInterrupt):
        with sw.applied({"thp": "always"}):
            raise KeyboardInterrupt
    assert sw.read("thp") == "madvise" and not (root / JOURNAL_REL).exists()


def test_no_op_change_records_nothing(root):
    sw = OsSwitches(str(root))
    assert sw.plan({"thp": "madvise", "autonuma": "on"}) == []
    with sw.applied({"thp": "madvise"}) as changes:
        assert changes == []
        assert not (root / JOURNAL_REL).exists()  # nothing journaled
    assert thp(root) == "madvise"


def test_refuses_to_change_what_cannot_be_read(root):
    (root / THP).unlink()
    sw = OsSwitches(str(root))
    with pytest.raises(TilewiseError, match="refusing"):
        sw.plan({"thp": "never"})
    assert sw.state()["thp"].value is None


def test_journal_is_written_before_the_write(root):
    sw = OsSwitches(str(root))
    j = Journal.create(sw.journal_path, "boot-a")
    os.chmod(root / NB, 0o444)  # the write will fail (unless root, which ignores modes)
    try:
        if os.geteuid() == 0:
            (root / NB).unlink()
            (root / NB).mkdir()  # a directory: the write fails even for root
            c = Change("autonuma", str(root / NB), "1", "0")
        else:
            c = sw.plan({"autonuma": "off"})[0]
        with pytest.raises(TilewiseError):
            sw.apply([c], j)
        assert [x["new"] for x in json.loads(Path(sw.journal_path).read_text())["changes"]] == ["0"]
    finally:
        if (root / NB).is_file():
            os.chmod(root / NB, 0o644)


def test_crash_recovery_from_a_leftover_journal(root):
    sw = OsSwitches(str(root))
    write_value(root / THP, "thp", "never")  # what the crashed run set
    write_value(root / NB, "autonuma", "0")
    j = Journal(sw.journal_path, 2**22 + 12345, "boot-a",
                [Change("thp", str(root / THP), "madvise", "never"), Change("autonuma", str(root / NB), "1", "0")], 0)
    j.save()
    rep = OsSwitches(str(root)).recover()
    assert rep.ok and [c.key for c in rep.restored] == ["autonuma", "thp"]  # reverse order
    assert thp(root) == "madvise" and raw(root, NB) == "1"
    assert not (root / JOURNAL_REL).exists()
    assert OsSwitches(str(root)).recover() is None


def test_undo_continues_past_a_failure_and_keeps_it_in_the_journal(root):
    sw = OsSwitches(str(root))
    write_value(root / NB, "autonuma", "0")
    bad = Change("thp", str(root / "missing/enabled"), "madvise", "never")
    Journal(sw.journal_path, 2**22 + 12346, "boot-a", [Change("autonuma", str(root / NB), "1", "0"), bad], 0).save()
    rep = sw.recover()
    assert [c.key for c in rep.restored] == ["autonuma"] and [c.key for c, _ in rep.failed] == ["thp"]
    assert raw(root, NB) == "1"
    left = json.loads((root / JOURNAL_REL).read_text())
    assert [c["key"] for c in left["changes"]] == ["thp"]


def test_journal_from_an_earlier_boot_is_discarded(root):
    sw = OsSwitches(str(root))
    write_value(root / THP, "thp", "always")
    Journal(sw.journal_path, 2**22 + 12347, "boot-old", [Change("thp", str(root / THP), "madvise", "never")], 0).save()
    rep = sw.recover()
    assert rep.notes and not rep.restored and thp(root) == "always"
    assert not (root / JOURNAL_REL).exists()


def test_unknown_journal_version_is_an_error(root):
    p = root / JOURNAL_REL
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"format": "tilewise-os-journal", "version": 7, "changes": []}))
    with pytest.raises(TilewiseError, match="version"):
        OsSwitches(str(root)).recover()


def test_bad_values_are_usage_errors(root):
    with pytest.raises(UsageError):
        OsSwitches(str(root)).plan({"thp": "sometimes"})


def test_real_root_needs_root_user():
    if os.geteuid() == 0:
        pytest.skip("running as root")
    with pytest.raises(UsageError, match="root"):
        OsSwitches("/").check_permission()


# ---- end to end through the CLI (fake root via the hidden --os-root) ------------------------

def test_cli_workload_apply_os_restores(cli, root):
    cp = cli("workload", "W2", "--records", "5000", "--groups", "50", "--apply-os", "--thp", "never", "--autonuma", "off",
             "--os-root", str(root), "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["os_switches"]["thp"]["value"] == "never" and doc["os_switches"]["autonuma"]["value"] == "0"  # during
    assert thp(root) == "madvise" and raw(root, NB) == "1"  # after
    assert not (root / JOURNAL_REL).exists()


def test_cli_tune_restores_after_a_failing_command(cli, root, tmp_path):
    cp = cli("tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1", "--apply-os", "--thp", "always",
             "--os-root", str(root), "--out", str(tmp_path / "out"), "--", "false")
    assert cp.returncode != 0 and "Error:" in cp.stderr and "Traceback" not in cp.stderr
    assert thp(root) == "madvise" and not (root / JOURNAL_REL).exists()


def _tilewise():
    return str(Path(sys.executable).parent / "tilewise")


def _sleep_when_changed(root: Path) -> list[str]:
    """The default configuration (OS untouched) runs first and returns at once; the changed one sleeps."""
    return ["sh", "-c", f"if [ -e {root / JOURNAL_REL} ]; then exec sleep 30; fi"]


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_sigint_restores(root, tmp_path):
    proc = subprocess.Popen([_tilewise(), "tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1",
                             "--apply-os", "--thp", "never", "--os-root", str(root), "--out", str(tmp_path / "o"),
                             "--", *_sleep_when_changed(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(root / JOURNAL_REL)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert thp(root) == "madvise" and not (root / JOURNAL_REL).exists()


def test_sigkill_then_restore_command(root, tmp_path, cli):
    proc = subprocess.Popen([_tilewise(), "tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1",
                             "--apply-os", "--thp", "never", "--os-root", str(root), "--out", str(tmp_path / "o"),
                             "--", *_sleep_when_changed(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for(root / JOURNAL_REL)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # tilewise dies; its child follows (parent-death signal)
        proc.wait(timeout=10)
    assert thp(root) == "never"
    cp = cli("tune", "--restore", "--os-root", str(root), "--json")
    assert cp.returncode == 0, cp.stderr
    assert [c["key"] for c in json.loads(cp.stdout)["restored"]] == ["thp"]
    assert thp(root) == "madvise" and not (root / JOURNAL_REL).exists()
