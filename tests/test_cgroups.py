"""cgroup v2 (and v1 parsing) on FAKE cgroup trees: which way a target gets a cpuset, constraining a
group in place through the change-and-undo layer, locks, and restore after kill -9.

The fake trees are plain directories (no kernel behind them): they show the decisions and the
journaled writes. The real v1 path runs in test_elastic_live.py; the real v2 path in a guest that
mounts only cgroup2 (tests/vm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilewise import cgroups, changes
from tilewise.elastic import enforce


def mountinfo(tmp_path, v2: Path | None, v1: Path | None = None) -> str:
    lines = ["22 1 0:21 / /proc rw,nosuid - proc proc rw"]
    if v2:
        lines.append(f"35 24 0:30 / {v2} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate")
    if v1:
        lines.append(f"36 24 0:31 / {v1} rw,relatime - cgroup cgroup rw,cpuset")
    p = tmp_path / "mountinfo"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def make_group(path: Path, *, controllers="cpuset cpu io memory pids", subtree="", procs=(), cpus: str | None = ""):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    (path / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    (path / "cgroup.threads").write_text("".join(f"{p}\n" for p in procs))
    if cpus is not None:
        (path / "cpuset.cpus").write_text(cpus + "\n")
        (path / "cpuset.cpus.effective").write_text("0-1\n")


def fake_proc(tmp_path, pid: int, rel: str) -> str:
    """A /proc where pid's stat and threads are the real ones and its cgroup is `rel` on v2."""
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "stat").symlink_to(f"/proc/{pid}/stat")
    (d / "task").symlink_to(f"/proc/{pid}/task")
    (d / "status").symlink_to(f"/proc/{pid}/status")
    (d / "cgroup").write_text(f"0::{rel}\n")
    return str(tmp_path / "proc")


@pytest.fixture
def systemd_like(tmp_path, sleeper):
    """cgroup2 only, cpuset enabled down to system.slice; the target alone in db.service."""
    root = tmp_path / "cg"
    make_group(root, subtree="cpuset cpu memory pids", cpus=None)
    make_group(root / "system.slice", subtree="cpuset memory pids")
    make_group(root / "system.slice" / "db.service", procs=[sleeper.pid])
    make_group(root / "system.slice" / "other.service", procs=[1])
    proc = fake_proc(tmp_path, sleeper.pid, "/system.slice/db.service")
    return root, proc, mountinfo(tmp_path, root), sleeper


def test_mounts_finds_v1_cpuset_and_cgroup2(tmp_path):
    m = cgroups.mounts(mountinfo(tmp_path, Path("/sys/fs/cgroup")))
    assert m == {"v1": None, "v2": "/sys/fs/cgroup"}
    m = cgroups.mounts(mountinfo(tmp_path, Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/cpuset")))
    assert m == {"v1": "/sys/fs/cgroup/cpuset", "v2": "/sys/fs/cgroup/unified"}


def test_plan_v2_constrains_the_targets_own_group_in_place(systemd_like):
    root, proc, _, p = systemd_like
    plan = cgroups.plan_v2(str(root), pid=p.pid, tree_pids={p.pid}, proc=proc)
    assert plan == cgroups.V2Plan("constrain", str(root / "system.slice/db.service"), [])


def test_plan_v2_refuses_a_group_shared_with_other_processes(systemd_like):
    root, proc, _, p = systemd_like
    (root / "system.slice/db.service/cgroup.procs").write_text(f"{p.pid}\n1\n")
    why = cgroups.plan_v2(str(root), pid=p.pid, tree_pids={p.pid}, proc=proc)
    assert isinstance(why, str) and "also holds 1 other process" in why


def test_plan_v2_enables_cpuset_on_the_way_only_when_asked(systemd_like):
    root, proc, _, p = systemd_like
    (root / "system.slice/cgroup.subtree_control").write_text("memory pids\n")
    why = cgroups.plan_v2(str(root), pid=p.pid, tree_pids={p.pid}, proc=proc)
    assert isinstance(why, str) and "cpuset is not enabled in" in why and "--enforce cgroup" in why
    plan = cgroups.plan_v2(str(root), pid=p.pid, tree_pids={p.pid}, proc=proc, may_enable=True)
    assert plan.enable == [str(root / "system.slice")]


def test_plan_v2_moves_a_target_in_the_root_group_into_a_child(tmp_path, sleeper):
    root = tmp_path / "cg"
    make_group(root, subtree="", procs=[sleeper.pid], cpus=None)
    proc = fake_proc(tmp_path, sleeper.pid, "/")
    why = cgroups.plan_v2(str(root), pid=sleeper.pid, tree_pids={sleeper.pid}, proc=proc)
    assert isinstance(why, str) and f"{root}/cgroup.subtree_control" in why
    plan = cgroups.plan_v2(str(root), pid=sleeper.pid, proc=proc, may_enable=True)
    assert plan == cgroups.V2Plan("move", str(root), [str(root)])


@pytest.mark.parametrize("controllers,group,msg", [
    ("cpu io memory", "system.slice/db.service", "offers no cpuset controller"),
    ("cpuset cpu", "", "the root cgroup has no cpuset.cpus"),
    ("cpuset cpu", "/elsewhere", "is not under the cgroup2 mount"),
])
def test_plan_v2_says_why_not(tmp_path, controllers, group, msg):
    root = tmp_path / "cg"
    make_group(root, controllers=controllers, subtree="cpuset", cpus=None)
    make_group(root / "system.slice/db.service")
    g = group if group.startswith("/") else str(root / group) if group else str(root)
    why = cgroups.plan_v2(str(root), group=g)
    assert isinstance(why, str) and msg in why


def test_this_machine_v2_without_cpuset_falls_back_to_affinity_with_the_reason(tmp_path, sleeper):
    root = tmp_path / "cg"
    make_group(root, controllers="hugetlb", subtree="", procs=[sleeper.pid], cpus=None)
    e = enforce.choose("auto", sleeper.pid, None, proc=fake_proc(tmp_path, sleeper.pid, "/"),
                       mountinfo=mountinfo(tmp_path, root), tree_pids={sleeper.pid})
    assert e.kind == "affinity" and "no cgroup v1 cpuset mount" in e.reason and "offers no cpuset controller" in e.reason
    with pytest.raises(changes.TilewiseError, match="cannot use a cgroup cpuset here"):
        enforce.choose("cgroup", sleeper.pid, None, proc=fake_proc(tmp_path / "b", sleeper.pid, "/"),
                       mountinfo=mountinfo(tmp_path, root))


def journals():
    return sorted((changes.state_dir() / "journals").glob("*.json"))


def test_constrain_in_place_journals_writes_reads_back_and_restores(systemd_like):
    root, proc, mi, p = systemd_like
    cpus_file = root / "system.slice/db.service/cpuset.cpus"
    before = os.sched_getaffinity(p.pid)
    e = enforce.choose("auto", p.pid, None, proc=proc, mountinfo=mi, tree_pids={p.pid})
    assert isinstance(e, enforce.CgroupConstrainEnforcer) and e.kind == "cgroup-v2 in place"
    e.start({p.pid: p.pid}, (0, 1), (0,))
    assert cpus_file.read_text().strip() == "0"
    [j] = journals()
    doc = json.loads(j.read_text())
    kinds = [(c["target"]["kind"], c["old"]) for c in doc["changes"]]
    assert kinds[0][0] == "affinity" and kinds[-1] == ("cgroup-cpus", "")  # masks journaled before the cpuset write
    assert e.apply((0, 1), {p.pid: p.pid}) == []
    assert cpus_file.read_text().strip() == "0-1"
    # a second daemon on the same process refuses, naming this one
    second = enforce.choose("auto", p.pid, None, proc=proc, mountinfo=mi, tree_pids={p.pid})
    with pytest.raises(changes.Busy, match=f"pid {p.pid} is already controlled by another part of this run"):
        second.start({p.pid: p.pid}, (0, 1), (1,))
    assert cpus_file.read_text().strip() == "0-1"
    assert e.restore() == []
    assert cpus_file.read_text().strip() == ""  # back to "inherit the parent's"
    assert os.sched_getaffinity(p.pid) == before and not journals()


def test_cgroup_path_on_v2_is_constrained_in_place(tmp_path):
    root = tmp_path / "cg"
    make_group(root, subtree="cpuset", cpus=None)
    make_group(root / "mydb", procs=[], cpus="1")
    e = enforce.choose("auto", None, str(root / "mydb"), mountinfo=mountinfo(tmp_path, root))
    assert isinstance(e, enforce.CgroupConstrainEnforcer)
    e.start({}, (0, 1), (0,))
    assert (root / "mydb/cpuset.cpus").read_text().strip() == "0"
    e.restore()
    assert (root / "mydb/cpuset.cpus").read_text().strip() == "1"


def test_a_controller_we_enabled_is_left_on_while_another_group_uses_it(tmp_path):
    root = tmp_path / "cg"
    make_group(root, subtree="cpuset", cpus=None)
    make_group(root / "ours")
    make_group(root / "theirs", cpus="1")
    c = changes.Change(cgroups.CgroupController(str(root), "cpuset", str(root / "ours")), "enabled", "off", "on")
    out = changes.undo_one(c)
    assert out.result == "kept" and "theirs" in out.detail and "cpuset" in (root / "cgroup.subtree_control").read_text()
    (root / "theirs/cpuset.cpus").write_text("\n")
    out = changes.undo_one(c)
    assert out.result == "restored" and (root / "cgroup.subtree_control").read_text().strip() == "-cpuset"


def test_kill_9_of_a_v2_controller_then_restore(systemd_like, cli):
    root, proc, mi, p = systemd_like
    cpus_file = root / "system.slice/db.service/cpuset.cpus"
    script = textwrap.dedent(f"""
        import time
        from tilewise.elastic import enforce
        e = enforce.choose("auto", {p.pid}, None, proc={proc!r}, mountinfo={mi!r}, tree_pids={{{p.pid}}})
        e.start({{{p.pid}: {p.pid}}}, (0, 1), (1,))
        print("constrained", flush=True)
        time.sleep(60)
    """)
    d = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert d.stdout.readline().strip() == "constrained"
    finally:
        d.kill()
        d.wait()
    assert cpus_file.read_text().strip() == "1" and journals()
    cp = cli("restore")
    assert cp.returncode == 0, cp.stderr
    assert f"undid what elastic pid {p.pid}" in cp.stdout and f"cpuset.cpus of {root}/system.slice/db.service" in cp.stdout
    assert cpus_file.read_text().strip() == "" and not journals()


def test_a_populated_v2_group_cannot_go_back_to_empty_cpus_so_it_gets_its_parents(tmp_path, monkeypatch):
    """Found in the cgroup2 guest: the kernel answers ENOSPC to "" on a group with tasks."""
    import errno

    root = tmp_path / "cg"
    make_group(root, subtree="cpuset", cpus=None)
    (root / "cpuset.cpus.effective").write_text("0-3\n")
    make_group(root / "svc", cpus="1")
    real_set = changes.FileValue.set

    def kernel(self, key, value):
        if value == "":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_set(self, key, value)

    monkeypatch.setattr(changes.FileValue, "set", kernel)
    t = cgroups.CpusetCpus(str(root / "svc/cpuset.cpus"), "cpulist", "cpuset.cpus of svc")
    out = changes.undo_one(changes.Change(t, "value", "", "1"))
    assert out.result == "kept" and "set to 0-3" in out.detail
    assert (root / "svc/cpuset.cpus").read_text().strip() == "0-3"
    plain = changes.FileValue(str(root / "svc/cpuset.cpus"), "cpulist")
    (root / "svc/cpuset.cpus").write_text("1\n")
    assert changes.undo_one(changes.Change(plain, "value", "", "1")).result == "failed"  # what it was before
