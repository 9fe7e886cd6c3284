"""Allocation modes over loaded topologies; adaptive with a fake /proc numa_maps; trace simulation."""

from pathlib import Path

import pytest

from tilewise import topology
from tilewise.elastic import daemon, metrics, modes, petri
from tilewise.errors import UsageError

FIX = Path(__file__).resolve().parent / "fixtures"
TWO = "synthetic:Package:2 [NUMANode] L3Cache:2 Core:4 PU:2"  # 2 nodes x 2 L3 x 4 cores, SMT2


def grow(pool, mode, n, pages=None):
    held = []
    for _ in range(n):
        held.append(modes.choose_allocate(pool, held, mode, pages))
    return held


def test_dense_fills_a_node_l3_by_l3_then_the_next():
    t = topology.load(TWO)
    pool = modes.make_pool(t)
    assert pool.n_total == 16 and pool.node_order == (0, 1)
    held = grow(pool, "dense", 9)
    nodes = [pool.core(c).numa_node for c in held]
    l3s = [pool.core(c).l3 for c in held]
    assert nodes == [0] * 8 + [1]
    assert l3s[:4] == [l3s[0]] * 4 and l3s[4] != l3s[0]
    assert pool.cpus(held[:1]) == t.core_cpus(pool.core(held[0]), False)  # one PU per core by default
    # release undoes the last allocation
    assert modes.choose_release(pool, held, "dense") == held[-1]


def test_sparse_round_robins_over_nodes():
    pool = modes.make_pool(topology.load(TWO))
    held = grow(pool, "sparse", 6)
    assert [pool.core(c).numa_node for c in held] == [0, 1, 0, 1, 0, 1]
    assert modes.choose_release(pool, held, "sparse") == held[-1]
    assert modes.choose_allocate(pool, [c.id for c in pool.cores], "sparse") is None
    assert modes.choose_release(pool, held[:1], "sparse") is None  # never below one core


def test_epyc_like_machine_and_smt():
    t = topology.load(str(FIX / "epyc7713x2.xml"))
    pool = modes.make_pool(t, smt=True)
    assert pool.n_total == 128
    held = grow(pool, "dense", 9)
    assert len({pool.core(c).l3 for c in held[:8]}) == 1  # one CCX (8 cores) before the next
    assert pool.core(held[8]).l3 != pool.core(held[0]).l3
    assert len(pool.cpus(held[:1])) == 2  # --smt hands out both hardware threads
    sp = grow(pool, "sparse", 4)
    assert [pool.core(c).numa_node for c in sp] == [0, 1, 0, 1]


def test_pool_respects_the_allowed_set():
    t = topology.load(TWO)
    node1 = next(n for n in t.numa_nodes if n.id == 1).cpus
    pool = modes.make_pool(t, allowed_cpus=node1)
    assert pool.node_order == (1,) and all(c.numa_node == 1 for c in pool.cores)
    with pytest.raises(UsageError):
        modes.make_pool(t, allowed_cpus=[9999])


def fake_proc(tmp_path, pid, pages):
    d = tmp_path / str(pid)
    d.mkdir(parents=True)
    lines = []
    for i, (node, n) in enumerate(pages):
        lines.append(f"7f00000{i}000 default anon={n} dirty={n} N{node}={n} kernelpagesize_kB=4")
    lines.append("7fff00000000 default file=/lib/x.so mapped=3 N0=1 N1=2 kernelpagesize_kB=4")
    (d / "numa_maps").write_text("\n".join(lines) + "\n")
    return metrics.ProcFS(str(tmp_path))


def test_adaptive_uses_numa_maps_priority_queue(tmp_path):
    proc = fake_proc(tmp_path, 42, [(0, 100), (1, 5000), (1, 700)])
    pages = proc.numa_pages(42)
    assert pages == {0: 101, 1: 5702}
    pool = modes.make_pool(topology.load(TWO))
    assert modes.priority_queue(pool, pages)[0] == (1, 5702)
    first = modes.first_core(pool, "adaptive", pages)
    assert pool.core(first).numa_node == 1  # start near the memory
    held = grow(pool, "adaptive", 9, pages)
    assert [pool.core(c).numa_node for c in held] == [1] * 8 + [0]  # node 1 full, then node 0
    # release on the node with the fewest pages first
    assert pool.core(modes.choose_release(pool, held, "adaptive", pages)).numa_node == 0
    # the memory moved: now release on node 1
    moved = {0: 9000, 1: 10}
    assert pool.core(modes.choose_release(pool, held, "adaptive", moved)).numa_node == 1
    # no pages known: behaves as dense
    assert grow(pool, "adaptive", 3, {}) == grow(pool, "dense", 3)


def test_simulated_trace_on_a_machine_we_do_not_have(tmp_path):
    tr = tmp_path / "t.csv"
    tr.write_text("time,demand,pages_0,pages_1\n" + "\n".join(
        f"{i / 10},{d},10,900" for i, d in enumerate([0.2] + [6] * 8 + [0.1] * 8)) + "\n")
    rows = daemon.load_trace(str(tr))
    pool = modes.make_pool(topology.load(TWO))
    unit = daemon.Unit("trace", pool, petri.NetConfig(10, 70, pool.n_total), "adaptive")
    recs = daemon.simulate(rows, unit)
    n = [r["n_alloc"] for r in recs[1:]]
    # demand of 6 cores: grows while 6/n >= 70 %, i.e. to n = 9 (66.7 %), then shrinks back to 1
    assert max(n) == 9 and n[-1] == 1 and n[:3] == [1, 2, 3]
    assert all(pool.core(c).numa_node == 1 for c in recs[3]["cores"])  # near the pages


def test_trace_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("when,howmuch\n1,2\n")
    with pytest.raises(UsageError):
        daemon.load_trace(str(bad))
    bad.write_text('{"time": 0}\n')
    with pytest.raises(UsageError):
        daemon.load_trace(str(bad))
