"""The change-and-undo layer: journal first, no-op records nothing, reverse undo past failures,
locks naming their holder, signals held while undoing, restore after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tilewise import changes, launch, procs
from tilewise.binding import Binding
from tilewise.errors import TilewiseError


def files(tmp_path, n, value="a"):
    out = []
    for i in range(n):
        p = tmp_path / f"f{i}"
        p.write_text(value + "\n")
        out.append(changes.FileValue(str(p)))
    return out


def journals():
    return sorted((changes.state_dir() / "journals").glob("*.json"))


def test_change_journals_first_then_writes_and_verifies(tmp_path):
    [f] = files(tmp_path, 1)
    s = changes.Session("test")
    c = s.change(f, "value", "b")
    assert (c.old, c.new) == ("a", "b") and f.get("value") == "b"
    [j] = journals()
    doc = json.loads(j.read_text())
    assert doc["format"] == "tilewise-journal" and doc["version"] == 1
    assert doc["owner"]["pid"] == os.getpid() and doc["owner"]["start"] == procs.start_time(os.getpid())
    assert doc["changes"][0]["old"] == "a" and doc["changes"][0]["target"]["kind"] == "file"
    s.change(f, "value", "c")  # a later change of the same item keeps the first old value
    assert [x.old for x in s.changes] == ["a"]
    rep = s.close()
    assert rep.ok and f.get("value") == "a" and not journals()


def test_a_change_to_the_value_already_there_records_nothing(tmp_path):
    [f] = files(tmp_path, 1)
    with changes.Session("test") as s:
        assert s.change(f, "value", "a") is None
        assert s.changes == [] and not journals()


def test_what_cannot_be_read_is_not_changed(tmp_path):
    f = changes.FileValue(str(tmp_path / "missing"))
    with changes.Session("test") as s:
        with pytest.raises(TilewiseError, match="refusing to change"):
            s.change(f, "value", "x")
    assert not (tmp_path / "missing").exists()


def test_a_write_that_does_not_read_back_is_an_error_and_stays_journaled(tmp_path):
    class Sticky(changes.FileValue):
        def set(self, key, value):  # a kernel that ignores the write
            pass

    f = Sticky(str(tmp_path / "f"))
    (tmp_path / "f").write_text("a\n")
    s = changes.Session("test")
    with pytest.raises(TilewiseError, match="reads back as a after writing b"):
        s.change(f, "value", "b")
    assert len(s.changes) == 1  # journaled before the write; undo finds it unchanged
    rep = s.close()
    assert rep.ok and [o.result for o in rep.outcomes] == ["unchanged"]


def test_undo_is_reverse_order_and_keeps_going_past_a_failure(tmp_path):
    a, b, c = files(tmp_path, 3)
    s = changes.Session("test")
    for f in (a, b, c):
        s.change(f, "value", "z")
    os.unlink(b.path)
    os.mkdir(b.path)  # b cannot be restored now
    rep = s.close()
    assert [o.change.target for o in rep.outcomes] == [c, b, a]
    assert [o.result for o in rep.outcomes] == ["restored", "gone" if not os.path.isdir(b.path) else "failed", "restored"]
    assert a.get("value") == "a" and c.get("value") == "a"
    [j] = journals()  # only what failed is left
    assert [x["target"]["path"] for x in json.loads(j.read_text())["changes"]] == [b.path]
    # its lock is kept too: nobody else may take b while it is not restored
    assert changes.read_lock(changes.state_dir(), b.lock_key())


def test_a_second_controller_of_a_target_refuses_naming_the_holder(tmp_path):
    [f] = files(tmp_path, 1)
    script = textwrap.dedent(f"""
        import sys, time
        from tilewise import changes
        s = changes.Session("holder")
        s.change(changes.FileValue({f.path!r}), "value", "held")
        print("held", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script, "--holder-arg"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        s = changes.Session("second")
        with pytest.raises(changes.Busy) as e:
            s.change(f, "value", "mine")
        msg = str(e.value)
        assert f"{f.path} is already controlled by pid {p.pid} (" in msg and "--holder-arg" in msg and " since " in msg
        assert "\n" not in msg
        assert f.get("value") == "held" and s.changes == []
    finally:
        p.kill()
        p.wait()
    # the holder died with its change in place: the next controller undoes it first, then takes over
    s = changes.Session("third")
    c = s.change(f, "value", "mine")
    assert c.old == "a" and any("undid what a run that did not exit cleanly left" in n for n in s.notes)
    s.close()
    assert f.get("value") == "a" and not journals()


def test_locks_are_per_target_and_released(tmp_path):
    a, b = files(tmp_path, 2)
    s1, s2 = changes.Session("one"), changes.Session("two")
    s1.change(a, "value", "x")
    s2.change(b, "value", "y")  # another target: fine
    with pytest.raises(changes.Busy, match="another part of this run"):
        s2.lock(a)
    s1.close()
    s2.lock(a)  # released
    s2.close()
    assert not list((changes.state_dir() / "locks").glob("*.json"))


def test_affinity_change_of_a_process_and_its_undo():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    p = subprocess.Popen([sys.executable, "-c", "import threading,time\n"
                          "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]\n"
                          "time.sleep(30)"])
    try:
        time.sleep(0.3)
        before = os.sched_getaffinity(p.pid)
        t = changes.ProcessAffinity.of(p.pid)
        one = [min(before)]
        with changes.Session("test") as s:
            s.change(t, "cpus", one)
            tids = os.listdir(f"/proc/{p.pid}/task")
            assert len(tids) == 4 and all(os.sched_getaffinity(int(x)) == set(one) for x in tids)
        assert all(os.sched_getaffinity(int(x)) == before for x in os.listdir(f"/proc/{p.pid}/task"))
    finally:
        p.kill()
        p.wait()
    # the process is gone: undoing its change is "gone", not a failure
    rep = changes.undo_one(changes.Change(t, "cpus", sorted(before), one))
    assert rep.result == "gone"


def test_protect_restores_a_side_effect_after_the_change_that_caused_it(tmp_path):
    a, b = files(tmp_path, 2)
    s = changes.Session("test")
    s.protect(b, "value")  # b will change as a side effect of a
    s.change(a, "value", "x")
    Path(b.path).write_text("side effect\n")
    rep = s.close()
    assert [(o.change.target, o.result) for o in rep.outcomes] == [(a, "restored"), (b, "restored")]
    assert b.get("value") == "a"


def test_commit_keeps_the_changes_and_forgets_them(tmp_path):
    [f] = files(tmp_path, 1)
    s = changes.Session("up")
    s.change(f, "value", "kept")
    s.commit()
    assert f.get("value") == "kept" and not journals()
    assert s.close().outcomes == []


def test_started_process_is_stopped_on_undo():
    c = launch.spawn(["sh", "-c", "sleep 60 & wait"], Binding(None))
    t = changes.StartedProcess(c.pid, c.ident.start, c.token, name="sh")
    s = changes.Session("up")
    s.record(t, "state", "stopped", "running")
    rep = s.close()
    assert [o.result for o in rep.outcomes] == ["restored"]
    c.wait(timeout=5)
    assert not procs.members([c.tree()], "/proc")


# ---- in another process: kill -9, signals during undo -------------------------------------------

SCRIPT = """
import os, sys, time
from pathlib import Path
from tilewise import changes, signals

class Slow(changes.FileValue):
    kind = "slow-file"
    def set(self, key, value):
        if value == "a":  # undoing: slow, and say so
            print("undoing", self.path, flush=True)
            time.sleep(0.4)
        super().set(key, value)

changes.kind(Slow)
signals.install()
paths = sys.argv[1:]
s = changes.Session("double-term")
try:
    for p in paths:
        s.change(Slow(p), "value", "z")
    print("changed", flush=True)
    time.sleep(60)
except signals.Terminated:
    pass
finally:
    try:
        rep = s.close()
        print("restored", len(rep.restored), flush=True)
    except signals.Terminated as e:  # a signal held during the restore acts once it is done
        print("restored", sum(Slow(p).get("value") == "a" for p in paths), "then", e, flush=True)
sys.exit(130)
"""


def test_a_second_sigterm_during_restore_does_not_abort_it(tmp_path):
    fs = files(tmp_path, 4)
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, *[f.path for f in fs]], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "changed"
        assert all(f.get("value") == "z" for f in fs)
        p.send_signal(signal.SIGTERM)
        assert p.stdout.readline().startswith("undoing")
        p.send_signal(signal.SIGTERM)  # while restoring: held until the restore is done
        p.send_signal(signal.SIGHUP)
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    # all four restored; the signals that came while it was already stopping for the first one are
    # not raised again afterwards (they would cut short whatever clean-up comes after the restore)
    assert "restored 4\n" in out and " then " not in out, out
    assert all(f.get("value") == "a" for f in fs)
    assert p.returncode in (130, -signal.SIGTERM, 128 + signal.SIGTERM)
    assert not journals()


def test_kill_9_after_a_change_then_restore_undoes_it(tmp_path, cli):
    fs = files(tmp_path, 2)
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, *[f.path for f in fs]], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "changed"
    finally:
        p.kill()
        p.wait()
    assert all(f.get("value") == "z" for f in fs) and journals()
    cp = cli("restore")
    assert cp.returncode != 0 and "unknown kind of change 'slow-file'" in cp.stdout + cp.stderr  # unknown to the CLI
    doc = json.loads(journals()[0].read_text())  # as a tilewise that knows the kind would, undo it here
    for c in doc["changes"]:
        c["target"]["kind"] = "file"
    journals()[0].write_text(json.dumps(doc))
    cp = cli("restore")
    assert cp.returncode == 0, cp.stderr
    assert "undid what double-term" in cp.stdout and f"pid {p.pid}" in cp.stdout
    assert all(f.get("value") == "a" for f in fs) and not journals()
    assert "nothing to restore" in cli("restore").stdout


def test_restore_leaves_a_live_owner_alone(tmp_path, cli):
    [f] = files(tmp_path, 1)
    s = changes.Session("alive")
    s.change(f, "value", "z")
    cp = cli("restore", "--json")
    assert cp.returncode == 0
    [j] = json.loads(cp.stdout)["journals"]
    assert j["state"] == "running" and j["owner"]["pid"] == os.getpid()
    assert f.get("value") == "z"
    s.close()
