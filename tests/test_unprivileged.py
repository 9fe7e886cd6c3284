"""tilewise as an unprivileged user: every command gives a working result or one honest line.

The commands run through `setpriv` as `nobody` (uid 65534; on a machine without that account, a
uid that has none), with no capabilities and no supplementary groups, a private HOME and
XDG_RUNTIME_DIR in a fresh directory of /tmp made theirs, so the default state and cache
directories of a plain user are used (not the suite's TILEWISE_STATE_DIR).
"Another user" is a second uid with no account (as a PostgreSQL server's `postgres` is to its
users). Needs root to switch users: skipped with the reason otherwise, and where `nobody` cannot
reach a Python with tilewise's dependencies (the suite's interpreter, or the system's of the same
version with the suite's site-packages).

Checked each time: the exit code, exactly one `Error:` line on a refusal, no traceback, nothing
journaled, and the target's CPU mask as it was. A few seconds each.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tilewise import cpulist
from tilewise.admission import user_name

SRC = Path(__file__).resolve().parents[1] / "src"
PATH = "/usr/local/bin:/usr/bin:/bin"
OTHER_UID = 65533  # "another user": no account, like a service user the caller is not
SETUID_TREE = r"""
import ctypes, os, sys, time
uid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
os.setresgid(uid, uid, 0)
os.setresuid(uid, uid, 0)  # owned by uid, saved uid root: a child may become root again
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:  # no capabilities left at all
    raise OSError(ctypes.get_errno(), "capset")
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/PID readable as for any process of uid
print("ready", flush=True)
# fork once the controller has acted on us (its first mask), so that the root child joins mid-run
# however long tilewise takes to start; argv[2]: the longest wait
start, deadline = os.sched_getaffinity(0), time.monotonic() + float(sys.argv[2])
while os.sched_getaffinity(0) == start and time.monotonic() < deadline:
    time.sleep(0.02)
pid = os.fork()
if pid == 0:
    os.setresuid(0, 0, 0)  # the new child is root's (without capabilities): not the user's to re-bind
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (and setpriv) to run commands as a throwaway user")


class User:
    def __init__(self, uid: int, gid: int, home: Path, python: str, pythonpath: str) -> None:
        self.uid, self.gid, self.home, self.python = uid, gid, home, python
        self.name = user_name(uid)  # as tilewise names it: "nobody", or "uid N" without an account
        # the suite's venv bin on PATH, as in a user's activated venv (tpchgen-cli lives there)
        self.env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run"), "PATH": f"{Path(sys.prefix) / 'bin'}:{PATH}",
                    "PYTHONPATH": pythonpath, "NO_COLOR": "1", "LANG": "C.UTF-8", "USER": self.name}

    def argv(self, *args: str) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--inh-caps=-all", *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(self.python, "-s", "-m", "tilewise", *args), env=self.env, cwd=self.home,
                              capture_output=True, text=True, timeout=timeout)

    def popen(self, *argv: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*argv), env=self.env, cwd=self.home, **kw)

    def journals(self) -> list[Path]:
        return sorted(self.home.rglob("journals/*.json"))


def _interpreter(uid: int, gid: int, home: Path) -> tuple[str, str] | str:
    """(python, PYTHONPATH) the user can run tilewise with, or why none."""
    site = sysconfig.get_paths()["purelib"]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    # it must also start itself again (engines' workers run sys.executable): a venv whose base
    # interpreter sits under root's 0700 home passes the first exec here and fails the second
    check = ("import subprocess, sys; subprocess.run([sys.executable, '-s', '-c', "
             "'import tilewise.cli, duckdb, psutil, rich, click'], check=True)")
    for py, path in ((sys.executable, str(SRC)), (f"/usr/bin/{ver}", f"{SRC}:{site}")):
        if not os.path.exists(py):
            continue
        cp = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", py, "-s", "-c", check],
                            env={"HOME": str(home), "PYTHONPATH": path, "PATH": PATH}, capture_output=True,
                            text=True, timeout=60)
        if cp.returncode == 0:
            return py, path
        tried.append(f"{py}: {(cp.stderr.strip().splitlines() or ['?'])[-1]}")
    return "no Python with tilewise's dependencies that nobody can run (" + "; ".join(tried) + ")"


def _throwaway_ids() -> tuple[int, int]:
    """nobody's uid and gid; on a machine without that account, a uid that has none (setpriv needs
    no account: the user exists for as long as its processes do)."""
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        pass
    for uid in range(65532, 60000, -1):
        if uid == OTHER_UID:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid, uid
    pytest.skip("no free uid for a throwaway user")


@pytest.fixture(scope="module")
def user():
    uid, gid = _throwaway_ids()
    home = Path(tempfile.mkdtemp(prefix="tilewise-unprivileged-"))
    try:
        (home / "run").mkdir()
        for d in (home, home / "run"):
            os.chown(d, uid, gid)
            d.chmod(0o700)
        got = _interpreter(uid, gid, home)
        if isinstance(got, str):
            pytest.skip(got)
        yield User(uid, gid, home, *got)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def clean(user):
    """After each test: nothing journaled by the user's run."""
    yield
    assert user.journals() == [], [p.read_text() for p in user.journals()]


def refused(cp: subprocess.CompletedProcess, *words: str) -> str:
    err = cp.stderr.strip()
    assert cp.returncode not in (0, None), (cp.returncode, cp.stdout, err)
    assert "Traceback" not in err and err.startswith("Error: ") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.fixture
def other_sleeper():
    p = subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "sleep", "60"])
    time.sleep(0.1)
    yield p
    p.kill()
    p.wait()


# ---- refusals ------------------------------------------------------------------------------------

def test_elastic_on_pid_1_is_refused_in_one_line(user, clean):
    before = os.sched_getaffinity(1)
    err = refused(user.run("elastic", "--pid", "1", "--duration", "5"), "pid 1", "every process on the machine", "--whole-machine",
                  "nothing was changed")
    assert os.sched_getaffinity(1) == before, err
    # meant: then it is the ownership (root's processes), still before anything changes
    refused(user.run("elastic", "--pid", "1", "--duration", "5", "--whole-machine"), "owned by root",
            "CAP_SYS_NICE", "run tilewise as root")


def test_elastic_on_another_users_process_is_refused(user, clean, other_sleeper):
    before = os.sched_getaffinity(other_sleeper.pid)
    refused(user.run("elastic", "--pid", str(other_sleeper.pid), "--duration", "5"),
            f"pid {other_sleeper.pid} (sleep)", f"owned by uid {OTHER_UID}", "CAP_SYS_NICE", "run tilewise as")
    assert os.sched_getaffinity(other_sleeper.pid) == before


def test_elastic_with_a_cgroup_not_delegated_is_refused(user, clean):
    sleeper = user.popen("sleep", "60")
    try:
        time.sleep(0.1)
        cp = user.run("elastic", "--pid", str(sleeper.pid), "--enforce", "cgroup", "--duration", "5")
        err = refused(cp)
        if cp.returncode == 2:  # a cpuset exists, but is not the user's
            assert "may not write" in err and "Delegate=yes" in err and "owned by root" in err, err
        else:  # no cgroup cpuset on this machine at all
            assert "cannot use a cgroup cpuset here" in err, err
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"), reason="no THP switch here")
def test_os_switches_are_refused(user, clean, tmp_path):
    before = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    out = user.home / "tune-refused"
    refused(user.run("tune", "-w", "W2", "--records", "5000", "--groups", "50", "--allocators", "system",
                     "--mem", "first-touch", "--apply-os", "--thp", "never", "--out", str(out)),
            "Transparent Hugepages", "owned by root", "re-run as root")
    refused(user.run("workload", "W2", "--records", "5000", "--groups", "50", "--apply-os", "--thp", "never"),
            "Transparent Hugepages", "re-run as root")
    assert Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text() == before and not out.exists()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (a changed mask to undo)")
def test_restore_leaves_a_journal_it_may_not_undo_whole(user, sleeper):
    """A journal in the user's state directory whose undo would re-bind root's process: refused
    in one line before any item is undone, the journal kept; root then undoes it."""
    from tilewise import changes

    state = user.home / "run" / "tilewise"
    allcpus = sorted(os.sched_getaffinity(sleeper.pid))
    s = changes.Session("elastic pid", base=state)
    s.change(changes.ProcessAffinity.of(sleeper.pid), "cpus", allcpus[:1])
    s.journal.owner = changes.Owner(2**22 + 1, 1, None, "tilewise elastic", time.time())
    s.journal.save()
    for d, _, files in os.walk(state):
        for p in [d, *(os.path.join(d, f) for f in files)]:
            os.chown(p, user.uid, user.gid)
    refused(user.run("restore"), "left alone", f"pid {sleeper.pid} (", "owned by root", "CAP_SYS_NICE",
            "tilewise restore` as root")
    assert sorted(os.sched_getaffinity(sleeper.pid)) == allcpus[:1] and len(user.journals()) == 1
    [rep] = changes.restore_all(state)
    assert rep.state == "restored" and sorted(os.sched_getaffinity(sleeper.pid)) == allcpus and not user.journals()


WEIGHTS = Path("/sys/kernel/mm/mempolicy/weighted_interleave")


@pytest.mark.skipif(not (WEIGHTS / "node0").exists(), reason="no weighted interleave in this kernel (Linux 6.9+)")
def test_weighted_interleave_weights_are_refused_before_anything(user, clean):
    """A saved plan that interleaves with weights: the weights are global sysfs switches, so exec
    refuses in one line before anything is journaled, started or written."""
    saved = user.home / "plan.json"
    cp = user.run("plan", "--mem", "interleave", "--mem-nodes", "0", "--save", str(saved), "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(saved.read_text())
    before = (WEIGHTS / "node0").read_text()
    doc["instances"][0].update(mem_policy="weighted-interleave", weights={"0": 7 if before.strip() != "7" else 8})
    saved.write_text(json.dumps(doc))
    refused(user.run("exec", "--plan", str(saved), "--", "true"), "weighted-interleave weight of node 0",
            "owned by root", f"you ({user.name}) may not write it", "nothing was changed", "re-run as root", "--mem interleave")
    assert (WEIGHTS / "node0").read_text() == before


# ---- what works -----------------------------------------------------------------------------------

def test_exec_restore_and_topo_work(user, clean):
    cp = user.run("exec", "--policy", "wim", "--json", "--", user.python, "-c", "print('hello')")
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["verification"]["ok"] and doc["exit_status"] == 0, doc
    cp = user.run("restore", "--json")
    assert cp.returncode == 0 and json.loads(cp.stdout)["journals"] == [], cp.stderr
    assert str(user.home / "run" / "tilewise") == json.loads(cp.stdout)["state_dir"]


def test_elastic_on_an_own_process(user, clean):
    """The user's own process: affinity (the cpuset is not theirs, and auto says why), restored."""
    sleeper = user.popen(user.python, "-c",
                         "import time\nwhile True: sum(range(10000)); time.sleep(0.001)")
    try:
        time.sleep(0.2)
        before = os.sched_getaffinity(sleeper.pid)
        cp = user.run("elastic", "--pid", str(sleeper.pid), "--duration", "1", "--interval", "0.1", "--json")
        assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr
        s = json.loads(cp.stdout)
        assert s["enforce"] == ["affinity"] and s["restored"] and not s["partial"] and s["ticks"] >= 3, s
        assert os.sched_getaffinity(sleeper.pid) == before
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (a core to take away)")
def test_a_child_that_becomes_root_mid_run_is_said_once_and_the_run_is_partial(user, clean):
    """The target is the user's; once elastic has bound it, it forks a child that takes back root
    (its saved uid): the kernel refuses to re-bind that child. Said once, the rest stays
    controlled, exit 3."""
    tree = subprocess.Popen([sys.executable, "-c", SETUID_TREE, str(user.uid), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout.readline().strip() == "ready"
        before = os.sched_getaffinity(tree.pid)
        cp = user.run("elastic", "--pid", str(tree.pid), "--mode", "dense", "--duration", "3", "--interval", "0.1",
                      "--enforce", "affinity", "--json")
        child = int(tree.stdout.readline())
        assert cp.returncode == 3, (cp.returncode, cp.stderr)
        err = cp.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error: the run was partial") and "Traceback" not in cp.stderr, err
        s = json.loads(cp.stdout)
        assert s["partial"] and s["restored"] and not s["problems"], s
        assert len(s["uncontrolled"]) == 1, s["uncontrolled"]
        [line] = s["uncontrolled"]
        assert f"pid {child} (python" in line and "owned by root" in line, line
        assert os.sched_getaffinity(tree.pid) == before  # restored; the child keeps what it was born with, as said
        assert f"it keeps CPUs {cpulist.format(sorted(os.sched_getaffinity(child)))})" in line, line
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(tree.pid)], check=False)
        tree.send_signal(signal.SIGKILL)
        tree.wait()


def test_bench_tpch_at_a_tiny_scale(user, clean):
    out = user.home / "bench"
    cp = user.run("bench", "tpch", "--sf", "0.01", "--policies", "wim", "--queries", "1,6", "--runs", "1",
                  "--no-warmup", "--tests", "power", "--no-refresh", "--no-plots", "--out", str(out), timeout=300)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["kind"] == "benchmark" and not doc["validation"]["wrong_answers"]


def test_up_elastic_instances_and_down(user, clean):
    """The user's own DuckDB servers: up, elastic on them as instances (affinity: they are the
    user's), down leaving nothing."""
    cp = user.run("up", "--engine", "duckdb", "--policy", "wim", "--sf", "0.01", "--name", "mine",
                  "--worker-memory", "256m", "--json", timeout=240)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    [w] = [m for m in json.loads(cp.stdout)["members"] if m["role"] == "worker"]
    try:
        before = os.sched_getaffinity(w["pid"])
        el = user.run("elastic", "--instances", "--cluster", "mine", "--duration", "1", "--interval", "0.2", "--json")
        assert el.returncode == 0 and "Traceback" not in el.stderr, el.stderr
        s = json.loads(el.stdout)
        assert s["target"] == ["instance mine/0"] and s["enforce"] == ["affinity"] and s["restored"], s
        assert os.sched_getaffinity(w["pid"]) == before
    finally:
        dn = user.run("down", "--name", "mine", "--json", timeout=120)
    assert dn.returncode == 0, dn.stderr
    deadline = time.monotonic() + 10
    while not _ended(w["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ended(w["pid"]), "the server outlived down"


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it (`up` detaches its servers)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_tune_black_box_and_a_failing_command_leave_no_journal(user, clean):
    """tune without --apply-os needs nothing special; a command that cannot start fails every
    configuration (exit 2) and leaves no journal behind for the next elastic to recite."""
    out = user.home / "tune"
    cp = user.run("tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "1", "--out", str(out),
                  "--json", "--", "true")
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    assert json.loads(cp.stdout)["files"]["config"] == str(out / "tuned.json")
    cp = user.run("tune", "--allocators", "system", "--mem", "first-touch", "--repeat", "2", "--out", str(out),
                  "--", "/nonexistent/engine")
    assert cp.returncode == 2 and cp.stderr.strip().splitlines()[-1].startswith("Error: every configuration failed")
    assert user.journals() == []
