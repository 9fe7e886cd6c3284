"""Weighted interleave (MPOL_WEIGHTED_INTERLEAVE, Linux 6.9+): planned, applied where the kernel has
it, and refused in one line where it does not (the QEMU guests' 6.1 kernel checks that end to end)."""

from __future__ import annotations

import json

import pytest

from tilewise import binding, plan, topology, verification
from tilewise.errors import TilewiseError, UsageError
from tilewise.topology import synthetic


def test_plan_accepts_weighted_interleave_over_named_nodes():
    t = synthetic.load("Package:2 [NUMANode] [NUMANode] Core:2 PU:1")  # nodes 1 and 3 are CPU-less
    p = plan.plan(t, "wim", mem="weighted-interleave", mem_nodes=(0, 1))
    assert p.instances[0].mem_policy == "weighted-interleave" and p.instances[0].mem_nodes == (0, 1)
    whole = plan.plan(t, "wim", mem="weighted-interleave")  # default: every node with CPUs, as interleave
    assert whole.instances[0].mem_nodes == (0, 2)


def test_unsupported_kernel_is_one_clear_error(tmp_path):
    t = synthetic.load("Package:2 [NUMANode] Core:2 PU:1")
    p = plan.plan(t, "wim", mem="weighted-interleave")
    with pytest.raises(UsageError, match="has only node"):  # one node: nothing to interleave over
        plan.plan(synthetic.load("Package:1 [NUMANode] Core:2 PU:1"), "wim", mem="weighted-interleave")
    with pytest.raises(TilewiseError, match="weighted-interleave is not supported by this kernel") as e:
        binding.ensure_mem_policy_supported(p, sysfs=str(tmp_path / "missing"))
    assert "use --mem interleave" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "weighted_interleave").mkdir()
    binding.ensure_mem_policy_supported(p, sysfs=str(tmp_path / "weighted_interleave"))
    binding.ensure_mem_policy_supported(plan.plan(t, "wim", mem="interleave"), sysfs=str(tmp_path / "missing"))


def test_numa_maps_name_with_a_space_is_read_whole(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "numa_maps").write_text("55cd7c3aa000 weighted interleave:0-1 file=/bin/x anon=1 N0=1\n")
    assert verification.read_task_policy(42, proc=str(tmp_path)) == "weighted interleave:0-1"
    b = binding.Binding((0,), "weighted-interleave", (0, 1))
    assert verification.expected_policy(b) == "weighted interleave:0-1"


@pytest.mark.skipif(not binding.weighted_interleave_supported(), reason="this kernel has no weighted interleave (Linux < 6.9)")
def test_exec_applies_weighted_interleave_here(cli):
    node = topology.load(None).cpu_nodes[0].id
    cp = cli("exec", "--policy", "wim", "--mem", "weighted-interleave", "--mem-nodes", str(node), "--json", "--",
             "python3", "-c", "print(open('/proc/self/numa_maps').readline().split()[1:3])")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["verification"]["ok"] and doc["verification"]["mem_policy"].startswith("weighted interleave:")


def test_weights_are_admitted_before_anything_is_written(tmp_path):
    """Weighted-interleave weights are global sysfs switches: a caller who may not write one is
    refused in one line (the file, its owner, what is missing, the way out) before anything is
    journaled; a weight that already has its value needs no write and is admitted."""
    from tilewise import admission

    sysfs = tmp_path / "weighted_interleave"
    sysfs.mkdir()
    for n in (0, 2):
        (sysfs / f"node{n}").write_text("1\n")
    alice = admission.Caller(4242000, 4242000)  # a uid without an account
    read_only = lambda p: admission.Access(p, False, 0)  # noqa: E731 - root's file, not writable by alice
    with pytest.raises(admission.Refused) as e:
        binding.admit_weights([(0, 3), (2, 1)], str(sysfs), alice, read_only)
    msg = str(e.value)
    assert msg.startswith(f"cannot write the weighted-interleave weight of node 0 {sysfs / 'node0'} (owned by root): "
                          "you (uid 4242000) may not write it; nothing was changed; re-run as root"), msg
    assert "(and" not in msg and "--mem interleave" in e.value.hint and "\n" not in msg  # node 2 keeps its 1: no write
    binding.admit_weights([(0, 1), (2, 1)], str(sysfs), alice, read_only)  # nothing to change: admitted
    binding.admit_weights([(0, 3)], str(sysfs), alice, admission.access)  # writable here (the test's own file)
    binding.admit_weights([], str(sysfs), alice, read_only)
