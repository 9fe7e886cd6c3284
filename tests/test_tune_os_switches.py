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

from tilewise import changes
from tilewise.errors import TilewiseError, UsageError
from tilewise.tune.os_switches import SWITCHES, OsSwitches

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


def thp_now(root: Path) -> str | None:
    """THP as a test polls it while tilewise writes the fake file: a regular file is truncated, then
    written (the kernel's file never shows empty), so an empty read is "not yet", never a value."""
    text = raw(root, THP)
    return SWITCHES["thp"].parse(text) if text else None


def journals() -> list[Path]:
    return sorted((changes.state_dir() / "journals").glob("*.json"))


def dead_owner() -> changes.Owner:
    """The identity of a process that has exited (its journal is what a killed run leaves)."""
    p = subprocess.Popen(["sleep", "0"])
    start = changes.procs.start_time(p.pid)
    p.wait()
    return changes.Owner(p.pid, start or 1, changes.procs.boot_id(), "tilewise tune (killed)", time.time())


def leave_journal(root: Path, items, owner=None, boot=None) -> Path:
    """What a run killed after its changes leaves: a journal of a dead owner (and the values it set)."""
    o = owner or dead_owner()
    if boot:
        o = changes.Owner(o.pid, o.start, boot, o.command, o.since)
    sw = OsSwitches(str(root))
    j = changes.Journal(changes.state_dir() / "journals" / f"{o.pid}-{o.start}-1.json", o, "tune --apply-os",
                        [changes.Change(sw.target(k), "value", old, new) for k, old, new in items])
    j.save()
    return j.path


def test_state_reads_both_switches(root):
    st = OsSwitches(str(root)).state()
    assert (st["thp"].value, st["thp"].shown) == ("madvise", "madvise")
    assert (st["autonuma"].value, st["autonuma"].shown) == ("1", "on")


def test_applied_changes_then_restores_and_removes_journal(root):
    sw = OsSwitches(str(root))
    with sw.applied({"thp": "never", "autonuma": "off"}) as made:
        assert [c.target.path for c in made] == [str(root / THP), str(root / NB)]
        assert sw.read("thp") == "never" and sw.read("autonuma") == "0"
        [j] = journals()
        doc = json.loads(j.read_text())
        assert doc["version"] == 1 and [c["old"] for c in doc["changes"]] == ["madvise", "1"]
        assert doc["owner"]["pid"] == os.getpid() and doc["owner"]["start"] and doc["owner"]["boot_id"]
    assert thp(root) == "madvise" and raw(root, NB) == "1"
    assert not journals()


def test_restored_on_exception_in_the_block(root):
    sw = OsSwitches(str(root))
    with pytest.raises(KeyboardInterrupt):
        with sw.applied({"thp": "always"}):
            raise KeyboardInterrupt
    assert sw.read("thp") == "madvise" and not journals()


def test_no_op_change_records_nothing(root):
    sw = OsSwitches(str(root))
    assert sw.plan({"thp": "madvise", "autonuma": "on"}) == []
    with sw.applied({"thp": "madvise"}) as made:
        assert made == []
        assert not journals()  # nothing journaled
    assert thp(root) == "madvise"


def test_refuses_to_change_what_cannot_be_read(root):
    (root / THP).unlink()
    sw = OsSwitches(str(root))
    with pytest.raises(TilewiseError, match="refusing"):
        sw.plan({"thp": "never"})
    with pytest.raises(TilewiseError, match="refusing"):
        with sw.applied({"thp": "never"}):
            pass
    assert sw.state()["thp"].value is None and not (root / THP).exists()


def test_journal_is_written_before_the_write(root):
    sw = OsSwitches(str(root))
    (root / NB).unlink()
    os.mkfifo(root / NB)  # a read blocks until a writer opens it: the test plays the kernel
    seen = {}

    def kernel():
        with open(root / NB, "w") as f:  # serve the read of the old value
            f.write("1\n")
        time.sleep(0.3)
        seen["journal"] = [json.loads(p.read_text()) for p in journals()]
        with open(root / NB) as f:  # take the write
            seen["written"] = f.read().strip()
        with open(root / NB, "w") as f:  # serve the read-back
            f.write(seen["written"] + "\n")

    import threading

    t = threading.Thread(target=kernel)
    t.start()
    s = changes.Session("test")
    s.change(sw.target("autonuma"), "value", "0")
    t.join()
    assert seen["written"] == "0"
    [doc] = seen["journal"]  # on disk while the write was still pending
    assert [(c["old"], c["new"]) for c in doc["changes"]] == [("1", "0")]
    s.journal.changes = []  # the fifo cannot play the undo
    s.close()


def test_crash_recovery_from_a_leftover_journal(root):
    write_value(root / THP, "thp", "never")  # what the killed run set
    write_value(root / NB, "autonuma", "0")
    leave_journal(root, [("thp", "madvise", "never"), ("autonuma", "1", "0")])
    [rep] = changes.restore_all()
    assert rep.state == "restored"
    assert [o.change.target.path for o in rep.undo.restored] == [str(root / NB), str(root / THP)]  # reverse order
    assert thp(root) == "madvise" and raw(root, NB) == "1"
    assert not journals() and changes.restore_all() == []


def test_a_new_run_undoes_a_dead_runs_changes_to_its_switch_first(root):
    write_value(root / THP, "thp", "never")
    path = leave_journal(root, [("thp", "madvise", "never")])
    sw = OsSwitches(str(root))
    # the dead run's lock, as it left it
    owner = changes.Journal.load(path).owner
    lockfile = changes._lock_path(changes.state_dir(), sw.target("thp").lock_key())
    changes.atomic_write_json(lockfile, {"format": changes.LOCK_FORMAT, "key": sw.target("thp").lock_key(),
                                         "owner": owner.to_json(), "session": "x", "journal": str(path)})
    with sw.applied({"thp": "always"}) as made:
        assert [c.old for c in made] == ["madvise"]  # not the dead run's "never"
    assert thp(root) == "madvise" and not journals()


def test_undo_continues_past_a_failure_and_keeps_it_in_the_journal(root):
    write_value(root / NB, "autonuma", "0")
    sw = OsSwitches(str(root))
    o = dead_owner()
    bad = changes.Change(changes.FileValue(str(root / "missing/enabled"), "bracketed"), "value", "madvise", "never")
    j = changes.Journal(changes.state_dir() / "journals" / "dead.json", o, "tune",
                        [bad, changes.Change(sw.target("autonuma"), "value", "1", "0")])
    j.save()
    (root / "missing").mkdir()
    (root / "missing/enabled").mkdir()  # a directory: cannot be read nor written
    [rep] = changes.restore_all()
    assert rep.state == "failed"
    assert [o.result for o in rep.undo.outcomes] == ["restored", "failed"]
    assert raw(root, NB) == "1"
    left = json.loads(j.path.read_text())
    assert [c["target"]["path"] for c in left["changes"]] == [str(root / "missing/enabled")]


def test_journal_from_an_earlier_boot_is_discarded(root):
    write_value(root / THP, "thp", "always")
    leave_journal(root, [("thp", "madvise", "never")], boot="boot-old")
    [rep] = changes.restore_all()
    assert rep.state == "earlier-boot" and thp(root) == "always"
    assert not journals()


def test_unknown_journal_version_is_an_error(root):
    d = changes.state_dir() / "journals"
    d.mkdir(parents=True)
    (d / "x.json").write_text(json.dumps({"format": "tilewise-journal", "version": 7, "changes": []}))
    [rep] = changes.restore_all()
    assert rep.state == "unreadable" and "version" in rep.detail


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
    assert not journals()


def test_cli_tune_restores_after_a_failing_command(cli, root, tmp_path):
    cp = cli("tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1", "--apply-os", "--thp", "always",
             "--os-root", str(root), "--out", str(tmp_path / "out"), "--", "false")
    assert cp.returncode != 0 and "Error:" in cp.stderr and "Traceback" not in cp.stderr
    assert thp(root) == "madvise" and not journals()


def _tilewise():
    return str(Path(sys.executable).parent / "tilewise")


def _sleep_when_changed(root: Path) -> list[str]:
    """The default configuration (OS untouched) runs first and returns at once; the changed one sleeps."""
    return ["sh", "-c", f"if [ \"$(cat {root / THP})\" = never ]; then exec sleep 30; fi"]


def _wait_for(cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _tune(root, tmp_path, name="o", **kw):
    return subprocess.Popen([_tilewise(), "tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1",
                             "--apply-os", "--thp", "never", "--os-root", str(root), "--out", str(tmp_path / name),
                             "--", *_sleep_when_changed(root)], text=True, **kw)


def test_sigint_restores(root, tmp_path):
    proc = _tune(root, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: thp_now(root) == "never")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert thp(root) == "madvise" and not journals()


def test_two_apply_os_runs_the_second_refuses_naming_the_first(root, tmp_path):
    first = _tune(root, tmp_path, "a", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: thp_now(root) == "never")
        second = _tune(root, tmp_path, "b", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1, err
        assert err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err
        assert f"already controlled by pid {first.pid} (" in err and "tilewise tune" in err and " since " in err
        assert thp(root) == "never"  # the first run's state was not touched
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
    assert first.returncode == 130
    assert thp(root) == "madvise" and not journals()


def test_sigkill_then_restore_command(root, tmp_path, cli):
    proc = _tune(root, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: thp_now(root) == "never")
        time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # tilewise dies at once, with its journal on disk
        proc.wait(timeout=10)
    assert thp(root) == "never" and journals()
    cp = cli("restore", "--json")
    assert cp.returncode == 0, cp.stderr
    found = json.loads(cp.stdout)["journals"]
    assert all(j["state"] == "restored" and j["owner"]["pid"] == proc.pid for j in found)
    [j] = [j for j in found if j["purpose"] == "tune --apply-os"]
    assert [o["change"]["target"]["path"] for o in j["undo"]["outcomes"]] == [str(root / THP)]
    # the run it was timing was journaled too (already gone: its parent-death signal took it)
    assert [o["result"] for j in found if j["purpose"].startswith("tune run") for o in j["undo"]["outcomes"]] \
        in ([], ["unchanged"])
    assert thp(root) == "madvise" and not journals()
    again = cli("tune", "--restore")  # the old spelling: same command
    assert again.returncode == 0 and "nothing to restore" in again.stdout
