"""Admission decisions (tilewise.admission) on facts: real /proc files of this machine's init,
kthreadd, a kernel worker and a process of `nobody` (tests/fixtures/admission), and the cgroup
files a plan writes. No root needed: the facts are data, the decisions pure. The same rules as
an unprivileged user, end to end: test_unprivileged.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilewise import admission, cgroups
from tilewise.admission import CAP_SYS_NICE, Access, Caller, Proc

FIX = Path(__file__).parent / "fixtures" / "admission"
USER = Caller(1000, 1000)
ROOT = Caller(0, 0, admission.parse_caps("000001ffffffffff"))
NICE = Caller(1000, 1000, frozenset({CAP_SYS_NICE}))


def real(name: str, pid: int) -> Proc:
    p = admission.parse_process(pid, (FIX / f"{name}.status").read_text(), (FIX / f"{name}.stat").read_text())
    assert p is not None
    return p


def test_real_status_files_parse():
    init, kthreadd, worker, nobody = real("1", 1), real("2", 2), real("4", 4), real("nobody", 4242)
    assert (init.uid, init.ns_pid, init.kernel) == (0, 1, False)
    assert kthreadd.name == "kthreadd" and kthreadd.kernel and worker.kernel and worker.ppid == 2
    assert (nobody.uid, nobody.euid, nobody.name, nobody.kernel) == (65534, 65534, "sleep", False)
    assert nobody.owner == "nobody"


def test_caps_from_capeff():
    assert CAP_SYS_NICE in ROOT.caps and admission.parse_caps("0") == frozenset()
    assert admission.parse_caps("0000000000800000") == frozenset({CAP_SYS_NICE})
    assert admission.parse_caps("zz") == frozenset()


@pytest.mark.parametrize("name,pid,why", [
    ("1", 1, "pid 1 is init"),
    ("2", 2, "kernel's thread manager"),
])
def test_the_whole_machine_is_refused_without_the_flag(name, pid, why):
    r = admission.whole_machine_refusal(real(name, pid))
    assert r is not None and why in r.missing and "--whole-machine" in r.way_out


def test_systemd_managers_and_container_inits_are_whole_trees():
    assert "systemd manager" in admission.whole_machine(Proc(812, "systemd", 1000, 1000, 1000, 1))
    assert "container" in admission.whole_machine(Proc(5000, "bash", 1000, 1000, 1000, 4000, ns_pid=1))
    assert admission.whole_machine(real("nobody", 4242)) is None
    assert admission.whole_machine(Proc(900, "postgres", 106, 106, 106, 1, ns_pid=900)) is None


def test_affinity_is_the_owners_or_cap_sys_nice():
    pg = Proc(900, "postgres", 106, 106, 106, 1)
    assert admission.may_set_affinity(Caller(106, 106), pg) is None  # the owner
    assert admission.may_set_affinity(NICE, pg) is None and admission.may_set_affinity(ROOT, pg) is None
    why = admission.may_set_affinity(USER, pg)
    assert "not your process" in why and "CAP_SYS_NICE" in why
    # the kernel's rule: the caller's euid equals the task's real OR effective uid
    assert admission.may_set_affinity(Caller(1000, 1000), Proc(1, "su", 0, 1000, 0)) is None
    assert "kernel thread" in admission.may_set_affinity(ROOT, real("4", 4))
    # the kernel's cap_safe_nice: a setuid program the user started holds capabilities the user lacks
    setuid = Proc(950, "passwd", 1000, 0, 0, 1, cap_prm=admission.parse_caps("000001ffffffffff"))
    assert "holds capabilities you lack" in admission.may_set_affinity(USER, setuid)
    assert admission.may_set_affinity(NICE, setuid) is None
    assert real("nobody", 4242).cap_prm == frozenset() and real("1", 1).cap_prm == ROOT.caps


def test_refusals_are_one_per_owner_naming_the_first_process():
    tree = [Proc(900, "postgres", 106, 106, 106, 1), Proc(901, "postgres", 106, 106, 106, 900),
            Proc(950, "psql", 1000, 1000, 1000, 1), Proc(960, "helper", 0, 0, 0, 900)]
    refs = admission.affinity_refusals(USER, tree)
    assert [r.owner for r in refs] == [admission.user_name(106), "root"]
    assert refs[0].target == "pid 900 (postgres) and 1 other process(es)"
    assert "sudo -u" in refs[0].way_out and refs[1].way_out.startswith("run tilewise as root")
    with pytest.raises(admission.Refused) as e:
        admission.check(refs)
    line = str(e.value)
    assert "\n" not in line and "pid 900 (postgres)" in line and "nothing was changed" in line
    assert "(and 1 more)" in line and e.value.exit_code == 2
    assert admission.affinity_refusals(Caller(106, 106), tree[:2]) == []


def test_v1_moves_need_root_or_the_tasks_uid():
    pg = Proc(900, "postgres", 106, 106, 106, 1)
    assert admission.may_move_v1(ROOT, pg) is None and admission.may_move_v1(Caller(106, 106), pg) is None
    assert "needs root" in admission.may_move_v1(NICE, pg)


def test_cgroup_writes_of_a_v2_plan(tmp_path):
    """A delegated group (as systemd's Delegate=yes leaves it): the directory, cgroup.procs and
    cgroup.subtree_control are the user's, cpuset.cpus is not. Constraining it in place is refused
    with the file, its owner and the way out; its child group is the user's to constrain."""
    g = tmp_path / "user@1000.service" / "app.slice" / "db.scope"
    constrain = cgroups.V2Plan("constrain", str(g), [str(g.parent)])
    writes = cgroups.v2_writes(constrain)
    assert writes == [("cgroup.subtree_control of", str(g.parent / "cgroup.subtree_control")),
                      ("cpuset.cpus of", str(g / "cpuset.cpus"))]
    facts = {str(g.parent / "cgroup.subtree_control"): Access("x", True, 1000),
             str(g / "cpuset.cpus"): Access(str(g / "cpuset.cpus"), False, 0)}
    refs = admission.cgroup_refusals(USER, admission.CgroupNeeds([(w, facts[p]) for w, p in writes]))
    assert len(refs) == 1 and refs[0].owner == "root" and "may not write" in refs[0].missing
    assert refs[0].line().startswith(f"cannot write cpuset.cpus of {g} (owned by root)")
    assert "Delegate=yes" in refs[0].way_out
    move = cgroups.V2Plan("move", str(tmp_path), [])
    assert cgroups.v2_writes(move) == [("the cgroup", str(tmp_path)), ("cgroup.procs of", str(tmp_path / "cgroup.procs"))]


def test_switches_need_writable_files(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert admission.switch_refusals(ROOT, [("THP", admission.access(str(f)))]) == []
    ro = Access("/sys/kernel/mm/transparent_hugepage/enabled", False, 0, read_only_fs=True)
    [r] = admission.switch_refusals(ROOT, [("Transparent Hugepages", ro)])
    assert "read-only" in r.missing and "drop --apply-os" in r.way_out
    [r] = admission.switch_refusals(USER, [("Transparent Hugepages", Access(ro.path, False, 0))])
    assert r.owner == "root" and "re-run as root" in r.way_out
    assert admission.switch_refusals(USER, [("THP", Access("/nonexistent", False, None))]) == []  # said by the reader


def test_facts_of_this_process_and_a_missing_one():
    me = admission.caller()
    p = admission.process(__import__("os").getpid())
    assert p is not None and p.uid == me.uid and admission.may_set_affinity(me, p) is None
    assert admission.process(2**22 + 12345) is None
