"""The process edge: own groups, stopping whole trees (escaped ones too), exec's signals and exit codes."""

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

from tilewise import changes, launch, procs, verification
from tilewise.binding import Binding
from tilewise.errors import UsageError
from tilewise.procs import ProcId

TILEWISE = str(Path(sys.executable).parent / "tilewise")
NONE = Binding(None)


def _wait(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _descendants(pid: int) -> list[ProcId]:
    table = procs.scan()
    return [table[p].id for p in procs.descendants([pid], table)]


def test_every_child_gets_its_own_session_and_a_token():
    c = launch.spawn(["sleep", "30"], NONE)
    try:
        st = procs.stat(c.pid)
        assert st.pgrp == c.pid and st.session == c.pid
        assert c.ident == ProcId(c.pid, st.start)
        assert c.pid in procs.carrying(procs.SPAWN_VAR, [c.token], procs.scan())[c.token]
    finally:
        rep = procs.stop(c)
    assert rep.ok and [p["pid"] for p in rep.stopped] == [c.pid] and rep.stopped[0]["by"] == "SIGTERM"


def test_stop_reaches_descendants_that_left_the_group_and_lost_their_parent():
    # the middle shell starts a daemon-like grandchild in a session of its own, then exits:
    # the grandchild is neither in the group nor a descendant any more; only the token finds it
    c = launch.spawn(["sh", "-c", "setsid sleep 60 & echo $!; sleep 60"], NONE, stdout=subprocess.PIPE, text=True)
    escaped_pid = int(c.stdout.readline())
    _wait(lambda: procs.stat(escaped_pid) and procs.stat(escaped_pid).comm == "sleep", what="escaped sleep")
    escaped = ProcId.of(escaped_pid)
    assert procs.stat(escaped_pid).pgrp != c.pid
    rep = procs.stop(c, grace=2)
    assert rep.ok, rep.summary()
    assert escaped.pid in [p["pid"] for p in rep.stopped]
    assert not escaped.alive()


def test_stop_works_when_the_leader_has_already_exited():
    # the old kill_tree returned at once when the leader was gone, leaving its children running
    c = launch.spawn(["sh", "-c", "sleep 60 & sleep 60 & exit 0"], NONE)
    _wait(lambda: c.poll() is not None, what="leader exit")
    table = procs.scan()
    left = [s.id for s in table.values() if s.pgrp == c.pid and s.state not in "ZX"]
    assert len(left) == 2
    rep = procs.stop(c, grace=2)
    assert rep.ok and sorted(p["pid"] for p in rep.stopped) == sorted(i.pid for i in left)
    assert not any(i.alive() for i in left)


def test_stop_escalates_to_sigkill_and_reports_only_after_checking():
    c = launch.spawn(["sh", "-c", "trap '' TERM; sleep 60 & wait"], NONE)
    _wait(lambda: len(_descendants(c.pid)) == 1, what="child")
    t0 = time.monotonic()
    rep = procs.stop(c, grace=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert rep.ok
    by = {p["name"]: p["by"] for p in rep.stopped}
    assert by["sh"] == "SIGKILL"  # it ignored SIGTERM
    assert c.returncode == -signal.SIGKILL


def test_stop_resumes_a_stopped_process_so_sigterm_ends_it_within_the_grace_period():
    c = launch.spawn([sys.executable, "-c", "import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up', flush=True)\ntime.sleep(60)"],
                     NONE, stdout=subprocess.PIPE, text=True)
    assert c.stdout.readline().strip() == "up"
    os.kill(c.pid, signal.SIGSTOP)  # what SIGSTOP on a server does: it would act on SIGTERM only when continued
    _wait(lambda: procs.stat(c.pid).state in ("T", "t"), what="stopped")
    t0 = time.monotonic()
    rep = procs.stop(c, grace=10)
    assert time.monotonic() - t0 < 5 and rep.ok  # not the whole grace period, and no SIGKILL needed
    assert [p["by"] for p in rep.stopped] == ["SIGTERM"] and c.returncode == 0


def test_stop_never_signals_a_reused_pid():
    victim = subprocess.Popen(["sleep", "30"])
    try:
        fake = procs.Tree(ProcId(victim.pid, procs.start_time(victim.pid) - 1))  # same pid, other start
        rep = procs.stop(fake, grace=0.2)
        assert rep.stopped == [] and rep.survived == []
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_survivors_are_reported(monkeypatch):
    c = launch.spawn(["sleep", "30"], NONE)
    monkeypatch.setattr(procs, "_signal", lambda *a: None)
    monkeypatch.setattr(os, "killpg", lambda *a: None)
    rep = procs.stop(c, grace=0.1, kill_wait=0.1)
    monkeypatch.undo()
    assert not rep.ok and [p["pid"] for p in rep.survived] == [c.pid]
    assert "could not stop 1" in rep.summary()
    assert procs.stop(c).ok


def test_supervisor_stop_all_reports_what_it_stopped():
    with launch.Supervisor() as sup:
        sup.start("a", ["sh", "-c", "sleep 30 & wait"], NONE, verify_binding=False)
        sup.start("b", ["sleep", "30"], NONE, verify_binding=False)
        _wait(lambda: len(_descendants(sup.children[0].pid)) == 1, what="child of a")
        [j] = (changes.state_dir() / "journals").glob("*.json")  # both starts journaled first
        assert [c["target"]["kind"] for c in json.loads(j.read_text())["changes"]] == ["process", "process"]
    assert sup.report.ok and sorted(p["name"] for p in sup.report.stopped) == ["sh", "sleep", "sleep"]
    assert not j.exists()  # all stopped and checked: nothing left to restore


def test_a_bad_binding_is_one_line_before_anything_starts():
    with pytest.raises(UsageError, match="unknown memory policy 'bogus'"):
        launch.spawn(["true"], Binding((0,), "bogus"))
    with pytest.raises(UsageError, match="needs at least one NUMA node"):
        launch.spawn(["true"], Binding((0,), "membind", ()))
    with pytest.raises(UsageError, match="node.*cannot be used here"):
        launch.spawn(["true"], Binding((0,), "membind", (63,)))


def test_a_binding_the_kernel_refuses_says_why():
    with pytest.raises(launch.LaunchError, match=r"could not bind true .*sched_setaffinity\(4095\): Invalid argument"):
        launch.spawn(["true"], Binding((4095,)))


# ---- one process identity: pid + start time -----------------------------------------------------

def _fake_stat(proc: Path, pid: int, start: int, btime: int = 1_700_000_000) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")
    rest = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(start)] + ["0"] * 20  # field 22: start
    (proc / str(pid) / "stat").write_text(f"{pid} (a) b) {' '.join(rest)}\n")


def test_a_record_names_its_process_by_pid_and_start_time_and_old_records_are_upgraded(tmp_path):
    proc = tmp_path / "proc"
    _fake_stat(proc, 4242, start=123_456)
    ident = ProcId(4242, 123_456)
    assert ProcId.of(4242, str(proc)) == ident
    created = ident.wall_clock(str(proc))
    assert created == 1_700_000_000 + 123_456 / procs.TICKS_PER_S
    assert ProcId.recorded(4242, start=123_456) == ident  # what tilewise writes now
    # records from before start times carry psutil's create_time (boot time + start, in seconds)
    assert ProcId.recorded(4242, None, created + 0.4, str(proc)) == ident
    assert ProcId.recorded(4242, None, created - 5, str(proc)) is None  # the pid now names another process
    assert ProcId.recorded(4243, None, created, str(proc)) is None  # gone
    assert ProcId.recorded(4242, None, None, str(proc)) is None  # a pid alone names nothing
    (proc / "stat").write_text("cpu  1 2 3 4\n")
    assert ident.wall_clock(str(proc)) is None and ProcId.recorded(4242, None, created, str(proc)) is None


def test_psutils_create_time_in_an_old_cluster_record_still_finds_the_live_member():
    import psutil

    from tilewise.engines import procgroup

    child = launch.spawn(["sleep", "30"])
    try:
        old = {"role": "worker", "instance": 0, "pid": child.pid, "create_time": psutil.Process(child.pid).create_time(),
               "binding": {"cpus": None}, "log": ""}  # no "start": written before start times were kept
        m = procgroup.Member.from_json(old)
        assert m.start == child.ident.start and m.alive() == (True, "")
        assert procgroup.Member.from_json(m.to_json()).start == child.ident.start
    finally:
        procs.stop(child)
    assert m.alive() == (False, "exited")
    gone = procgroup.Member.from_json(old)  # loaded after the process ended
    assert gone.start is None and gone.alive()[0] is False


# ---- tilewise exec: signals, exit codes -------------------------------------------------------

def _exec(*cmd, **kw):
    return subprocess.Popen([TILEWISE, "exec", "--policy", "wim", "--", *cmd], stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_exec_forwards_the_signal_and_leaves_no_process(sig, status):
    p = _exec("sh", "-c", "sleep 300 & wait")
    try:
        _wait(lambda: any(s.comm == "sleep" for s in map(procs.stat, procs.descendants([p.pid], procs.scan())) if s),
              what="the command's sleep")
        table = procs.scan()
        tree = [table[x].id for x in procs.descendants([p.pid], table)]
        assert len(tree) == 2  # sh and its background sleep
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == status, err
    assert "Traceback" not in err
    assert not [i for i in tree if i.alive()], "a process of the command survived"
    if sig == signal.SIGINT:  # a non-interactive sh leaves its background job immune to SIGINT
        assert "stopped 1 process" in err and "(sleep)" in err


def test_exec_kills_a_command_that_ignores_sigterm_after_the_grace_period():
    p = _exec("sh", "-c", "trap '' TERM HUP; sleep 300 & wait")
    try:
        _wait(lambda: len(procs.descendants([p.pid], procs.scan())) == 2, what="command started")
        table = procs.scan()
        tree = [table[x].id for x in procs.descendants([p.pid], table)]
        p.send_signal(signal.SIGHUP)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGKILL, err
    assert not [i for i in tree if i.alive()]


def test_exec_json_reports_forwarded_signals_and_leftovers():
    p = subprocess.Popen([TILEWISE, "exec", "--policy", "wim", "--json", "--", "sh", "-c", "sleep 300 & exit 5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 5, err
    doc = json.loads(out)
    assert doc["exit_status"] == 5 and doc["returncode"] == 5
    [left] = doc["leftovers"]["stopped"]  # the background job (still "sh" if it had not exec'd sleep yet)
    assert left["name"] in ("sh", "sleep") and doc["leftovers"]["ok"]
    assert doc["verification"]["state"] in ("verified", "not checkable")


@pytest.mark.parametrize("cmd,status,msg", [
    (["/nonexistent/cmd"], 127, "command not found: /nonexistent/cmd"),
    (["no-such-command-tilewise"], 127, "command not found"),
    (["{tmp}/plain.txt"], 126, "permission denied"),
    (["{tmp}/garbage"], 126, "Exec format error"),
    (["/"], 126, ""),
    (["sh", "-c", "kill -TERM $$"], 143, None),
    (["sh", "-c", "kill -KILL $$"], 137, None),
    (["sh", "-c", "exit 42"], 42, None),
])
def test_exec_exit_codes(cli, tmp_path, cmd, status, msg):
    (tmp_path / "plain.txt").write_text("not a program\n")
    (tmp_path / "garbage").write_bytes(b"\x00\x01\x02 not a program")
    (tmp_path / "garbage").chmod(0o755)
    cmd = [c.format(tmp=tmp_path) for c in cmd]
    cp = cli("exec", "--policy", "wim", "--", *cmd)
    assert cp.returncode == status, cp.stderr
    if msg is not None:
        assert cp.stderr.startswith("Error: ") and msg in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


def test_exec_rejects_a_bogus_memory_policy_from_a_config_in_one_line(cli, tmp_path):
    cfg = tmp_path / "tuned.json"
    from tilewise.tune import knobs

    cfg.write_text(json.dumps({"format": "x"}))
    good = knobs.Config()
    doc = knobs.TunedFile(good, {"command": ["true"]}, {}, "fp").to_json()
    doc["config"]["mem"] = "bogus"
    cfg.write_text(json.dumps(doc))
    cp = cli("exec", "--policy", "wim", "--config", str(cfg), "--", "true")
    assert cp.returncode in (1, 2) and cp.stderr.startswith("Error: ") and "preexec_fn" not in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1


# ---- tri-state verification -------------------------------------------------------------------

def _fake_proc(tmp_path, numa_maps: str | None, state="S (sleeping)", maps=""):
    d = tmp_path / "proc" / "4242"
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tx\nState:\t{state}\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n")
    if numa_maps is not None:
        (d / "numa_maps").write_text(numa_maps)
    (d / "maps").write_text(maps)
    return str(tmp_path / "proc")


@pytest.mark.parametrize("numa_maps,state,why", [
    ("", "S (sleeping)", "numa_maps is empty"),
    (None, "S (sleeping)", "numa_maps unreadable"),
    ("7f00 bind:0 anon=1\n", "Z (zombie)", "exited before its memory policy could be read"),
])
def test_verification_never_says_verified_for_what_it_could_not_read(tmp_path, numa_maps, state, why):
    proc = _fake_proc(tmp_path, numa_maps, state)
    v = verification.verify(4242, Binding((0, 1), "membind", (0,)), proc=proc)
    assert v.checks["cpus"].state == "verified"
    assert v.checks["memory"].state == "not checkable" and why in v.checks["memory"].detail
    assert v.ok and not v.verified and v.state == "not checkable" and v.verdict is None
    assert "memory bind:0 not checkable" in v.summary()
    assert v.to_json()["checks"]["memory"]["state"] == "not checkable"


def test_verification_reads_the_policy_most_mappings_show(tmp_path):
    maps = "1000 bind:1 anon=1\n2000 interleave:0 anon=1\n3000 interleave:0 anon=1\n"
    v = verification.verify(4242, Binding(None, "interleave", (0,)), proc=_fake_proc(tmp_path, maps))
    assert v.checks["memory"].state == "verified" and "cpus" not in v.checks
    v = verification.verify(4242, Binding(None, "membind", (0,)), proc=str(tmp_path / "proc"))
    assert v.checks["memory"].state == "mismatch" and v.verdict is False


def test_verification_of_an_allocator_that_is_not_mapped_is_a_mismatch(tmp_path):
    from tilewise import allocators

    name = next((n for n in allocators.names() if n != "system" and allocators.find_library(n)), None)
    if name is None:
        pytest.skip("no preloadable allocator installed")
    proc = _fake_proc(tmp_path, "1000 default anon=1\n", maps="7f00 r-xp /usr/lib/libc.so.6\n")
    v = verification.verify(4242, Binding(None, "first-touch", (), name), allocator_wait_s=0.0, proc=proc)
    assert v.checks["allocator"].state == "mismatch" and v.allocator_loaded is False
    (tmp_path / "proc/4242/status").write_text("State:\tZ (zombie)\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    v = verification.verify(4242, Binding(None, "first-touch", (), name), allocator_wait_s=0.0, proc=proc)
    assert v.checks["allocator"].state == "not checkable"


def test_bench_records_a_failed_status_call_as_not_checkable():
    from tilewise import plan, topology
    from tilewise.bench import harness
    from tilewise.engines.contract import InstanceStatus

    p = plan.plan(topology.load(None), "wim")

    class Broken:
        def status(self):
            raise RuntimeError("worker unreachable")

    [d] = harness._instances(Broken(), p)
    assert d["binding_verified"] is None and d["verification"] == "not checkable"
    assert "status call failed: worker unreachable" in d["detail"]

    class Mixed:
        def status(self):
            return [InstanceStatus(0, 1, (0,), (0,), "first-touch", None, True, "memory default not checkable (x)")]

    [d] = harness._instances(Mixed(), p)
    assert d["verification"] == "not checkable" and d["binding_verified"] is None


def test_kill_9_of_exec_then_restore_stops_what_the_command_left(cli):
    # tilewise dies at once; its direct child dies with it (parent-death signal) but not the
    # child's background job: the journaled start lets `tilewise restore` find it by its token
    p = subprocess.Popen([TILEWISE, "exec", "--policy", "wim", "--", "sh", "-c", "sleep 300 & wait"],
                         stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: any((s := procs.stat(x)) and s.comm == "sleep" for x in procs.descendants([p.pid], procs.scan())),
              what="the command's sleep")
        table = procs.scan()
        tree = [table[x].id for x in procs.descendants([p.pid], table)]
    finally:
        p.kill()
        p.wait()
    _wait(lambda: sum(i.alive() for i in tree) == 1, what="sh to die with tilewise")
    [orphan] = [i for i in tree if i.alive()]
    cp = cli("restore", "--json")
    assert cp.returncode == 0, cp.stderr
    [j] = json.loads(cp.stdout)["journals"]
    assert j["state"] == "restored" and j["owner"]["pid"] == p.pid and j["purpose"] == "exec sh"
    assert [o["result"] for o in j["undo"]["outcomes"]] == ["restored"]
    assert not orphan.alive()


def test_a_clean_exec_leaves_no_journal(cli):
    from tilewise import changes

    assert cli("exec", "--policy", "wim", "--", "sh", "-c", "sleep 300 & exit 0").returncode == 0
    assert not list((changes.state_dir() / "journals").glob("*.json"))


def test_a_signal_swallowed_in_a_weakref_callback_is_delivered_again():
    """Ctrl-C landing in a callback Python may not raise from (a weakref callback run by the garbage
    collector: "Exception ignored") is not lost: the signal comes again, outside it."""
    code = textwrap.dedent("""
        import time, weakref
        from tilewise import signals
        signals.install()
        class T: pass
        def callback(ref):
            raise KeyboardInterrupt  # what the handler does when SIGINT arrives right here
        t = T(); r = weakref.ref(t, callback); del t  # the callback runs, its exception is ignored
        try:
            time.sleep(5)
        except KeyboardInterrupt:
            print("interrupted again")
        """)
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0 and cp.stdout.strip() == "interrupted again", cp.stderr
    assert time.monotonic() - t0 < 4 and "Exception ignored" not in cp.stderr
