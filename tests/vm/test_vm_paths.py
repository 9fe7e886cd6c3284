"""The host paths a guest sees wherever they are: a checkout, caches and pytest's tmp_path under the
guest's private /tmp, /run or /dev/shm, paths with spaces; and a one-line error before booting where a
path cannot be shown. The planning is checked here on real directories (no guest); one short boot runs
the harness from a checkout copy under /tmp whose path holds spaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from vm import harness
from vm.harness import Share

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def under_tmp():
    """A fresh directory under /tmp itself (pytest's tmp_path may be elsewhere: --basetemp, TMPDIR)."""
    d = Path(tempfile.mkdtemp(prefix="tilewise-vm-paths-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---- which directories are shown (no guest) ---------------------------------------------------------

def test_a_checkout_under_tmp_with_spaces_is_shown_once(under_tmp):
    co = under_tmp / "my checkout" / "main"
    (co / ".venv" / "bin").mkdir(parents=True)
    (co / "script.py").write_text("")
    shares = harness.guest_shares([co], [co / ".venv" / "bin", co / "script.py"])
    assert shares == [Share(str(co), str(co))]  # the paths inside it are seen through it


def test_a_file_is_shown_through_its_directory(under_tmp):
    (under_tmp / "data").mkdir()
    (under_tmp / "data" / "t.parquet").write_text("")
    assert harness.guest_shares([], [under_tmp / "data" / "t.parquet"]) == [Share(str(under_tmp / "data"), str(under_tmp / "data"))]


def test_paths_outside_the_private_directories_need_nothing():
    assert harness.guest_shares(["/usr/bin", "/"], ["/usr/bin/env"]) == []


def test_symbolic_links_are_shown_where_named_and_where_they_lead(under_tmp):
    (under_tmp / "real").mkdir()
    (under_tmp / "link").symlink_to(under_tmp / "real")
    (under_tmp / "to-usr").symlink_to("/usr")
    shares = harness.guest_shares([under_tmp / "link", under_tmp / "to-usr"])
    assert shares == [Share(str(under_tmp / "link"), str(under_tmp / "real")),
                      Share(str(under_tmp / "real"), str(under_tmp / "real")),
                      Share(str(under_tmp / "to-usr"), "/usr")]


@pytest.mark.parametrize("path, why", [
    ("/proc/self", "it is under /proc, where the guest mounts its own kernel's files"),
    ("/sys/kernel", "it is under /sys, where the guest mounts its own kernel's files"),
    ("/dev/null", "it is under /dev, where the guest mounts its own kernel's files"),
    ("/tmp/tilewise-no-such-directory-26", "it does not exist on the host"),
])
def test_a_needed_path_that_cannot_be_shown_is_one_line_naming_it(path, why):
    with pytest.raises(harness.VMPathError) as e:
        harness.guest_shares(["/usr", path])
    assert str(e.value).startswith(f"the guest cannot see {path}: {why}") and "\n" not in str(e.value)
    assert harness.guest_shares(["/usr"], [path]) == []  # merely mentioned (argv, environment): left to the guest


def test_run_says_so_before_booting(monkeypatch, under_tmp):
    """harness.run raises VMPathError before anything boots (no kernel, no initramfs, no QEMU)."""
    monkeypatch.setattr(harness, "missing_prerequisites", lambda: None)

    def boot(*a, **k):
        raise AssertionError("a guest was booted")

    monkeypatch.setattr(harness, "_run", boot)
    monkeypatch.setattr(harness, "kernel_image", boot)
    t = harness.GuestTopology("single-node", cores=2)
    with pytest.raises(harness.VMPathError, match="^the guest cannot see /proc/1: it is under /proc"):
        harness.run(t, ["true"], cwd=under_tmp, share=["/proc/1"])
    with pytest.raises(harness.VMPathError, match=f"^the guest cannot see {under_tmp / 'gone'}: it does not exist"):
        harness.run(t, ["true"], cwd=under_tmp / "gone")


def test_run_shows_the_directory_the_argv_the_caches_and_the_shared_paths(monkeypatch, under_tmp):
    """What run() hands the guest: the command's directory, pytest's tmp_path (share=), the absolute paths
    of its argv, the data cache (XDG_CACHE_HOME), the sources (PYTHONPATH; both passed on) and the
    native tools (TILEWISE_BIN_DIR)."""
    for d in ("co", "tmp_path", "cache", "bin", "data", "src"):
        (under_tmp / d).mkdir()
    monkeypatch.setattr(harness, "missing_prerequisites", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(under_tmp / "cache"))
    monkeypatch.setenv("PYTHONPATH", f"{under_tmp / 'src'}{os.pathsep}/usr/lib{os.pathsep}{under_tmp / 'gone'}")
    monkeypatch.setattr(harness, "kernel_image", lambda: under_tmp / "vmlinuz")
    monkeypatch.setattr(harness, "base_initramfs", lambda: under_tmp / "initramfs")
    job = harness.prepare(harness.GuestTopology("single-node", cores=2), ["/usr/bin/env", str(under_tmp / "data"), "x"],
                          cwd=under_tmp / "co", env={"TILEWISE_BIN_DIR": str(under_tmp / "bin")},
                          share=[under_tmp / "tmp_path"])
    assert job.command == f"/usr/bin/env {under_tmp / 'data'} x" and job.cwd == str(under_tmp / "co")
    assert job.env["XDG_CACHE_HOME"] == str(under_tmp / "cache")
    assert job.env["PYTHONPATH"] == os.environ["PYTHONPATH"]
    assert job.shares == tuple(Share(str(under_tmp / d), str(under_tmp / d))
                               for d in ("bin", "cache", "co", "data", "src", "tmp_path"))
    # resolved when prepared: a later change of this thread's environment or directory is not seen
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")
    monkeypatch.chdir("/")
    assert job.qemu_env["XDG_CACHE_HOME"] == str(under_tmp / "cache") and job.scratch == tempfile.gettempdir()
    assert harness.command_paths(f"cat {under_tmp}/'a b' -n /etc/hosts") == [f"{under_tmp}/a b", "/etc/hosts"]


def test_the_init_step_mounts_exactly_the_named_paths(under_tmp):
    """shares_script, run by a real sh with mkdir and mount recorded: every path arrives as one
    argument, spaces and quotes included, mounted copy-on-write from the host's / at its own path."""
    odd = "/tmp/a b/it's \"here\""
    bin_ = under_tmp / "bin"
    bin_.mkdir()
    for tool in ("mkdir", "mount"):
        (bin_ / tool).write_text(f"#!/bin/sh\nprintf '%s\\0' {tool} \"$@\" >> {under_tmp}/log\nprintf '\\n' >> {under_tmp}/log\n")
        (bin_ / tool).chmod(0o755)
    script = under_tmp / "shares.sh"
    script.write_text(harness.shares_script([Share(odd, "/work/x y")]))
    cp = subprocess.run(["/bin/sh", str(script), "/mnt/root"], env={"PATH": f"{bin_}:/usr/bin:/bin"},
                        capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    calls = [line.split("\0")[:-1] for line in (under_tmp / "log").read_text().splitlines()]
    assert calls == [
        ["mkdir", "-p", "/mnt/share0", "/mnt/rw/share0/upper", "/mnt/rw/share0/work", "/mnt/root" + odd],
        ["mount", "-o", "bind", "/mnt/lower/work/x y", "/mnt/share0"],
        ["mount", "-t", "overlay", "overlay", "-o",
         "lowerdir=/mnt/share0,upperdir=/mnt/rw/share0/upper,workdir=/mnt/rw/share0/work", "/mnt/root" + odd],
    ]


# ---- one guest: the harness run from a copy of the checkout under /tmp, in a path with spaces ---------

GUEST_CODE = """
import json, os, sys
from pathlib import Path
import tilewise
data, tmp = map(Path, sys.argv[1:3])
cache = Path(os.environ["XDG_CACHE_HOME"])
(tmp / "written-in-the-guest").write_text("x")
print(json.dumps({"host": os.uname().nodename, "cwd": os.getcwd(), "prefix": sys.prefix, "tilewise": tilewise.__file__,
                  "cache": (cache / "tilewise" / "marker").read_text(), "data": (data / "marker").read_text(),
                  "tmp_path": (tmp / "marker").read_text(), "wrote": (tmp / "written-in-the-guest").read_text()}))
"""


def _scratch(prefix: str, tops: tuple[str, ...]) -> Path:
    """A fresh directory in the first of tops this user can write (/tmp, /run, /dev/shm: private in the guest)."""
    top = next(t for t in (*tops, "/tmp") if os.path.isdir(t) and os.access(t, os.W_OK | os.X_OK))
    return Path(tempfile.mkdtemp(prefix=prefix, dir=top))


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_harness_from_a_checkout_copy_under_tmp_with_spaces(under_tmp, tmp_path):
    """The harness CLI run from a copy of the checkout at /tmp/.../check out/main, with its own .venv
    there (the packages of this environment reached through a .pth, as after `make setup`), the data
    cache (XDG_CACHE_HOME) and a data directory in the guest's other private directories, and pytest's
    tmp_path: the guest runs the copy's interpreter and package in the copy, reads every marker, and its
    write to tmp_path stays in the guest."""
    copy = under_tmp / "check out" / "main"
    shutil.copytree(REPO / "src", copy / "src", ignore=shutil.ignore_patterns("_bin"))
    (copy / "tests" / "vm").mkdir(parents=True)
    for f in ("__init__.py", "harness.py", "topologies.py"):
        shutil.copy2(REPO / "tests" / "vm" / f, copy / "tests" / "vm" / f)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(copy / ".venv")], check=True)
    purelib = sysconfig.get_paths()["purelib"]  # this environment's packages (duckdb, pyarrow, ...)
    site = Path(sysconfig.get_paths(vars={"base": str(copy / ".venv"), "platbase": str(copy / ".venv")})["purelib"])
    (site / "checkout.pth").write_text(f"{copy / 'src'}\n{purelib}\n")
    cache, data = _scratch("tilewise-vm-cache-", ("/dev/shm", "/run")), _scratch("tilewise-vm-data-", ("/run", "/dev/shm"))
    try:
        (cache / "tilewise").mkdir()
        (cache / "tilewise" / "marker").write_text("cache")
        (data / "marker").write_text("data")
        (tmp_path / "marker").write_text("tmp_path")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's .venv decides
        env["XDG_CACHE_HOME"] = str(cache)
        t0 = time.monotonic()
        cp = subprocess.run(["./.venv/bin/python", "tests/vm/harness.py", "-t", "single-node", "--share", str(tmp_path),
                             "--share", purelib, "--", "./.venv/bin/python", "-c", GUEST_CODE, str(data), str(tmp_path)],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=540)
        took = time.monotonic() - t0
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    assert cp.returncode == 0, f"{cp.stderr[-3000:]}\n({took:.0f} s)"
    doc = json.loads(cp.stdout.strip().splitlines()[-1])
    assert doc == {"host": "tilewise-guest", "cwd": str(copy), "prefix": str(copy / ".venv"), "tilewise": str(copy / "src" / "tilewise" / "__init__.py"),
                   "cache": "cache", "data": "data", "tmp_path": "tmp_path", "wrote": "x"}, cp.stderr[-2000:]
    assert not (tmp_path / "written-in-the-guest").exists()  # guests never write to the host
    assert "[single-node: exit 0, " in cp.stderr, cp.stderr[-2000:]
    print(cp.stderr.strip().splitlines()[-1], f"{took:.1f} s with the harness's start")
