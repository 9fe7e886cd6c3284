"""The elastic session as a use case (tilewise.elastic.session.run), called directly: admission
before anything is journaled, a partial run when a process that joins may not be re-bound (said
once, the rest stays controlled), and the quiet recovery of journals that changed nothing.
A second or two each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tilewise import admission, changes, launch
from tilewise.elastic import session

PARENT = r"""
import subprocess, sys, time
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
child = subprocess.Popen(sys.argv[2:])
print(child.pid, flush=True)
time.sleep(60)
"""


class Recorder(session.Reporter):
    def __init__(self):
        self.records, self.notes, self.summary = [], [], None

    def record(self, rec):
        self.records.append(rec)

    def note(self, text):
        self.notes.append(text)

    def done(self, summary):
        self.summary = summary


def journals() -> list:
    return sorted((changes.state_dir() / "journals").glob("*.json"))


def cfg(**kw) -> session.Config:
    return session.Config(**{"mode": "dense", "interval": 0.05, "duration": 0.3, "enforce": "affinity", **kw})


def test_own_process_runs_and_restores(sleeper):
    before = os.sched_getaffinity(sleeper.pid)
    rec = Recorder()
    s = session.run(cfg(pid=sleeper.pid), rec)
    assert s is rec.summary and s["restored"] and not s["partial"] and s["enforce"] == ["affinity"]
    assert rec.records[0]["event"] == "start" and os.sched_getaffinity(sleeper.pid) == before and not journals()


def test_another_users_process_is_refused_before_anything_is_journaled(sleeper, tmp_path):
    """The caller is injected: a user who owns nothing of the target and lacks CAP_SYS_NICE."""
    log = tmp_path / "el.jsonl"
    stranger = admission.Caller(4242, 4242)
    with pytest.raises(admission.Refused) as e:
        session.run(cfg(pid=sleeper.pid, log=str(log)), Recorder(), caller=stranger)
    msg = str(e.value)
    assert f"pid {sleeper.pid} (python" in msg and f"owned by {admission.user_name(os.getuid())}" in msg
    assert "CAP_SYS_NICE" in msg and "nothing was changed" in msg
    assert not journals() and not log.exists()


def test_pid_1_is_refused_unless_whole_machine():
    with pytest.raises(admission.Refused, match="pid 1 is init.*--whole-machine"):
        session.run(cfg(pid=1))
    assert not journals()


def test_a_dry_run_needs_no_admission(sleeper):
    s = session.run(cfg(pid=sleeper.pid, dry_run=True, enforce="auto"), caller=admission.Caller(4242, 4242))
    assert s["enforce"] == ["dry-run"] and s["ticks"] >= 1


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to start "
                    "a child owned by another user")
def test_a_child_of_another_user_is_said_once_and_the_run_is_partial(tmp_path):
    """The target (ours) starts, mid-run, a child owned by nobody. The caller is root without
    CAP_SYS_NICE (injected): the child is not ours to re-bind. It is said once (not per tick), the
    parent stays controlled, the summary lists it and the run ends Partial (exit 3)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "0.3", "setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", "sleep", "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        before = os.sched_getaffinity(parent.pid)
        rec = Recorder()
        caller = admission.Caller(0, 0, frozenset(), permitted=admission.caller().permitted)  # CAP_SYS_NICE not in effect
        with pytest.raises(session.Partial) as e:
            session.run(cfg(pid=parent.pid, duration=2.0, log=str(tmp_path / "el.jsonl")), rec, caller=caller)
        assert e.value.exit_code == 3
        child = int(parent.stdout.readline())
        s = rec.summary
        assert s["partial"] and len(s["uncontrolled"]) == 1 and f"pid {child} (" in s["uncontrolled"][0]
        assert "owned by nobody" in s["uncontrolled"][0] and "CAP_SYS_NICE" in s["uncontrolled"][0]
        said = [r for r in rec.records if r.get("event") == "not controlled"]
        assert len(said) == 1 and s["ticks"] > 5  # once, not per tick
        assert s["restored"] and not s["problems"] and os.sched_getaffinity(parent.pid) == before and not journals()
        end = json.loads((tmp_path / "el.jsonl").read_text().splitlines()[-1])
        assert end["event"] == "end" and end["uncontrolled"] == s["uncontrolled"]
        replayed = session.replay(str(tmp_path / "el.jsonl")).summary
        assert replayed["partial"] and replayed["uncontrolled"] == s["uncontrolled"]
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_journals_of_failed_starts_are_not_left_nor_recited(tmp_path):
    """A start that fails leaves no record (tune with a missing command left one per run, and the
    next elastic recited each as 'already at stopped'); a journal whose changes are all already
    undone is dropped in one line."""
    s = changes.Session("tune run x")
    with pytest.raises(launch.CommandNotFound):
        launch.spawn(["/nonexistent/cmd"], journal=s)
    assert not journals()
    s = changes.Session("left by a dead run")
    launch.journal_start(s, ["true"])
    dead = changes.Owner(2**22 + 1, 1, None, "tilewise tune", time.time())
    s.journal.owner = dead
    s.journal.save()
    notes = session.recovery_notes(changes.restore_all())
    assert notes == ["dropped 1 journal(s) of runs that had changed nothing still in place"] and not journals()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (a changed mask to undo)")
def test_restore_refuses_a_journal_it_may_not_undo_whole(sleeper):
    """Admission before an undo: a dead run's journal whose undo would re-bind a process this
    caller may not (injected: a stranger) is left alone whole, said in one line; the owner undoes it."""
    allcpus = sorted(os.sched_getaffinity(sleeper.pid))
    s = changes.Session("elastic pid")
    s.change(changes.ProcessAffinity.of(sleeper.pid), "cpus", allcpus[:1])
    s.journal.owner = changes.Owner(2**22 + 1, 1, None, "tilewise elastic", time.time())
    s.journal.save()
    [c] = s.journal.changes
    [r] = changes.undo_refusals([c], admission.Caller(4242, 4242))
    assert r.target.startswith(f"pid {sleeper.pid} (") and r.owner == admission.user_name(os.getuid())
    assert "CAP_SYS_NICE" in r.missing and "tilewise restore" in r.way_out
    assert changes.undo_refusals([c]) == []  # this process (its owner) may
    [rep] = changes.restore_all()
    assert rep.state == "restored" and sorted(os.sched_getaffinity(sleeper.pid)) == allcpus and not journals()
