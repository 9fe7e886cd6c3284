"""The cheap tick: /proc files kept open, thread lists cached between full scans, pool orders
computed once; the synthetic /proc generator and `bench elastic-tick`. Behaviour, not timing."""

import json
import os
import random

import pytest

from conftest import run_cli
from tilewise import topology
from tilewise.elastic import daemon, metrics, modes, tickbench
from tilewise.elastic.metrics import FdCache, ProcFS
from tilewise.elastic.synthetic_proc import FIRST_ID, SyntheticProc
from tilewise.errors import UsageError

SMALL = "synthetic:Package:1 [NUMANode] L3Cache:2 Core:4 PU:1"  # 8 CPUs
BIG = "synthetic:Package:2 [NUMANode] L3Cache:16 Core:8 PU:1"  # 256 CPUs


@pytest.fixture
def sp(tmp_path):
    return SyntheticProc(tmp_path / "proc", threads=6, processes=2, nodes=2, mappings=7)


def test_synthetic_proc_reads_like_proc(sp):
    proc = ProcFS(str(sp.root))
    assert proc.alive(sp.pid) and sp.pid >= FIRST_ID
    tree = proc.tree(sp.pid)
    assert tree == {t: sp.tasks[t].pid for t in sp.tasks}  # both processes, the child through children
    assert sorted(set(tree.values())) == sp.pids
    sp.advance(0.5, demand=3.0, cores=2)  # 2 cores run, 1 core's worth waits
    times = proc.times(tree)
    assert sum(r for r, _ in times.values()) == pytest.approx(2 * 0.5e9, rel=1e-6)
    assert sum(w for _, w in times.values()) == pytest.approx(1 * 0.5e9, rel=1e-6)
    pages = proc.numa_pages(sp.pid)
    assert pages == {0: sp.pages[0] // 2 + 800, 1: sp.pages[1] // 2}  # + the mapped binary's 800 on N0


def test_cached_reads_equal_fresh_reads_and_follow_rewrites(sp):
    proc, cache = ProcFS(str(sp.root)), FdCache()
    tree = proc.tree(sp.pid)
    first = proc.times(tree, cache)
    assert first == proc.times(tree) and len(cache) == len(tree)
    sp.advance(0.1, demand=12, cores=12)
    again = proc.times(tree, cache)
    assert again == proc.times(tree) and all(again[t][0] > first[t][0] for t in tree)
    assert len(cache) == len(tree)  # the same files, kept open


def test_exited_threads_files_are_closed_and_left_out(sp):
    proc, cache = ProcFS(str(sp.root)), FdCache()
    tree = proc.tree(sp.pid)
    proc.times(tree, cache)
    gone = sp.tids(sp.pids[1])[0]
    sp.remove_thread(gone)
    times = proc.times(tree, cache)  # the caller still lists it: it is skipped, not an error
    assert gone not in times and len(times) == len(tree) - 1
    proc.times({t: p for t, p in tree.items() if t != gone}, cache)  # the next tick no longer lists it
    assert len(cache) == len(tree) - 1  # its file was closed
    cache.close()
    assert len(cache) == 0


def test_kernel_without_schedstat_falls_back_to_stat(tmp_path):
    sp = SyntheticProc(tmp_path / "proc", threads=2, schedstat=False)
    proc, cache = ProcFS(str(sp.root)), FdCache()
    tree = proc.tree(sp.pid)
    sp.advance(1.0, demand=2, cores=2)
    times = proc.times(tree, cache)
    assert not proc.schedstat  # remembered: no schedstat opens on later ticks
    assert {t: r for t, (r, _) in times.items()} == {t: 1_000_000_000 for t in tree}  # 100 ticks of 10 ms each
    assert all(w == 0 for _, w in times.values())  # no wait time without schedstat: not measured


def _add_child(sp, child: int, parent_tid: int) -> None:
    (sp.root / str(child) / "task" / str(child)).mkdir(parents=True)
    for name in ("stat", "schedstat", "children"):
        (sp.root / str(child) / "task" / str(child) / name).write_text("1 2 3\n" if name == "schedstat" else "")
    (sp.root / str(sp.pid) / "task" / str(parent_tid) / "children").write_text(f"{child} ")


def test_pid_target_relists_threads_and_main_thread_children_each_tick(tmp_path):
    sp = SyntheticProc(tmp_path / "proc", threads=3, processes=1)
    target = daemon.PidTarget(sp.pid, ProcFS(str(sp.root)), rescan_s=1.0)
    assert set(target.tasks(10.0)) == set(sp.tids())
    new = sp.add_thread()
    assert new in target.tasks(10.1)  # a new thread: on the next tick
    # a child process forked by the main thread (a server's new backend): on the next tick too
    child = FIRST_ID + 500
    _add_child(sp, child, sp.pid)
    assert target.tasks(10.2)[child] == child
    # one forked by another thread: seen at the next full scan (every rescan_s), not before
    other = next(t for t in sp.tids() if t != sp.pid)
    late = FIRST_ID + 600
    _add_child(sp, late, other)
    assert late not in target.tasks(10.5)
    assert target.tasks(11.0)[late] == late
    assert late in target.tasks(None)  # None: always a full scan
    sp.remove_thread(new)
    assert new not in target.tasks(11.2)
    target.close()


def test_dead_target_has_no_tasks(tmp_path):
    sp = SyntheticProc(tmp_path / "proc", threads=2)
    target = daemon.PidTarget(sp.pid, ProcFS(str(sp.root)))
    assert target.tasks(0.0)
    stat = sp.root / str(sp.pid) / "stat"
    stat.write_text(stat.read_text().replace(" R ", " Z ", 1))  # a zombie is gone
    assert target.tasks(0.1) == {}


def _reference_allocate(pool, held, mode, pages):
    """The allocation rule written plainly (the pre-optimisation code): the cached orders must agree."""
    rank = {n: i for i, n in enumerate(pool.node_order)}
    dense = [c.id for c in sorted(pool.cores, key=lambda c: (rank[c.numa_node], c.l3, c.id))]
    core = {c.id: c for c in pool.cores}
    if mode == "adaptive" and pages and any(pages.values()):
        pos = {c: i for i, c in enumerate(dense)}
        held_l3 = {core[c].l3 for c in held}
        for node, _ in modes.priority_queue(pool, pages):
            free = [c for c in dense if c not in held and core[c].numa_node == node]
            if free:
                return min(free, key=lambda c: (core[c].l3 not in held_l3, pos[c]))
        return None
    if mode == "sparse":
        per = {n: [c for c in dense if core[c].numa_node == n] for n in pool.node_order}
        order = [per[n][j] for j in range(max(len(v) for v in per.values())) for n in pool.node_order if j < len(per[n])]
    else:
        order = dense
    return next((c for c in order if c not in held), None)


@pytest.mark.parametrize("mode", modes.MODES)
def test_cached_pool_orders_choose_what_the_plain_rule_chooses(mode):
    pool = modes.make_pool(topology.load(BIG))
    rng = random.Random(14)
    for _ in range(40):
        held = rng.sample([c.id for c in pool.cores], rng.randrange(1, pool.n_total))
        pages = {0: rng.randrange(0, 10**6), 1: rng.randrange(0, 10**6)}
        assert modes.choose_allocate(pool, held, mode, pages) == _reference_allocate(pool, held, mode, pages)
    assert modes.choose_allocate(pool, [c.id for c in pool.cores], mode, {0: 1}) is None


def test_unit_cpus_follow_the_allocation():
    pool = modes.make_pool(topology.load(SMALL))
    u = daemon.Unit("u", pool, daemon.petri.NetConfig(10, 70, pool.n_total), "dense")
    u.begin()
    assert u.cpus == (0,) and u.cpus_text == "0"
    u.allocated.append(1)
    assert u.cpus == (0, 1) and u.cpus_text == "0-1"
    u.allocated.remove(0)
    assert u.cpus == (1,) and u.cpus_text == "1"


def test_synthetic_run_walks_the_whole_pool_up_and_down():
    r = tickbench.run_synthetic(SMALL, mode="sparse", mappings=5)
    assert r["cpus"] == 8 and r["threads"] == 8 and r["enforce"] == "none (dry run)"
    assert r["max_cores_allocated"] == 8
    st = r["tick_cpu_ms"]
    assert st["ticks"] == tickbench.auto_ticks(8) and 0 < st["median"] <= st["p99"] <= st["max"]
    assert r["tick_cpu_ms_with_core_change"]["ticks"] >= 2 * 7  # every core added, then released
    assert r["verdict"] in ("met", "met on average", "missed") and r["budget_ms"] == 1.0


def test_budget_and_verdict():
    assert tickbench.budget_ms(16) == 1.0 and tickbench.budget_ms(256) == 2.0
    assert tickbench.verdict({"mean": 0.5, "p99": 0.9}, 1.0) == "met"
    assert tickbench.verdict({"mean": 0.5, "p99": 1.2}, 1.0) == "met on average"
    assert tickbench.verdict({"mean": 1.5, "p99": 3.0}, 1.0) == "missed"
    assert tickbench.verdict({"mean": None}, 1.0) == "not measured"


def test_bench_elastic_tick_cli(tmp_path):
    cp = run_cli("bench", "elastic-tick", "--topology", SMALL, "--modes", "dense,adaptive", "--ticks", "12",
                 "--mappings", "3", "--out", str(tmp_path / "o"), "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert (doc["format"], doc["kind"]) == ("tilewise-results", tickbench.KIND) and doc["proc"] == "synthetic"
    assert [c["mode"] for c in doc["cases"]] == ["dense", "adaptive"] and doc["complete"]
    assert all(c["tick_cpu_ms"]["ticks"] == 12 == len(c["ticks_ms"]) for c in doc["cases"])
    assert doc["environment"]["topology"]["summary"]
    assert [m["name"] for m in doc["metrics"]] == ["dense/tick_cpu", "adaptive/tick_cpu"]
    assert json.loads((tmp_path / "o" / "results.json").read_text())["cases"] == doc["cases"]
    assert (tmp_path / "o" / "results.csv").read_text().startswith("mode,proc,cpus")
    text = run_cli("bench", "elastic-tick", "--topology", SMALL, "--modes", "dense", "--ticks", "6")
    assert text.returncode == 0 and "mean ms" in text.stdout and "budget" in text.stdout
    shown = run_cli("report", str(tmp_path / "o"))  # the same table again from the results folder
    assert shown.returncode == 0 and "mean ms" in shown.stdout and "adaptive" in shown.stdout, shown.stderr


class _Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_run_returns_and_writes_the_document_per_mode(tmp_path):
    said = _Said()
    cfg = tickbench.Config(topology_src=SMALL, modes="dense,sparse", ticks=6, mappings=3, out=str(tmp_path / "o"))
    doc = tickbench.run(cfg, said)
    assert doc["kind"] == tickbench.KIND and doc["complete"] and [c["mode"] for c in doc["cases"]] == ["dense", "sparse"]
    assert said.lines == ["synthetic /proc, dense: ...", "synthetic /proc, sparse: ..."]
    assert json.loads((tmp_path / "o" / "results.json").read_text())["cases"] == doc["cases"]
    with pytest.raises(UsageError, match="unknown mode 'nosuch'"):
        tickbench.run(tickbench.Config(topology_src=SMALL, modes="dense,nosuch", out=str(tmp_path / "p")))
    assert not (tmp_path / "p").exists()  # refused before anything was written


@pytest.mark.parametrize("args, message", [
    (["--modes", "dense,nosuch"], "unknown mode 'nosuch'"),
    (["--threads", "0"], "'--threads': '0' is out of range: it must be >= 1"),
    (["--interval", "0"], "'--interval': '0' is out of range: it must be > 0"),
    (["--interval", "nan"], "'--interval': 'nan' is not a finite number"),
    (["--busy", "2", "--proc", "real"], "'--busy': '2' is out of range: it must be >= 0 and <= 1"),
    (["--proc", "real", "--ticks", "5"], "--proc real cannot be combined with --ticks"),
    (["--duration", "5"], "--proc synthetic cannot be combined with --duration"),
    (["--proc", "real", "--topology", SMALL], "drop --topology"),
])
def test_bench_elastic_tick_bad_input(args, message):
    cp = run_cli("bench", "elastic-tick", *args)
    assert cp.returncode == 2 and message in cp.stderr and cp.stderr.startswith("Error:")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_real_target_dry_run_measures_and_cleans_up():
    r = tickbench.run_real(threads=2, busy=0.2, mode="dense", duration=0.6, interval=0.1, dry_run=True)
    assert r["proc"] == "real" and r["enforce"] == "none (dry run)" and r["threads"] == 3
    assert r["tick_cpu_ms"]["ticks"] >= 3 and r["daemon_cpu_pct_of_core"] is not None
    assert r["problems"] == []


def test_fd_cache_respects_the_open_file_budget(sp):
    budget = metrics.OpenBudget(limit=2)
    proc, cache = ProcFS(str(sp.root)), FdCache(budget)
    tree = proc.tree(sp.pid)
    times = proc.times(tree, cache)
    assert len(times) == len(tree) and len(cache) == 2 and budget.used == 2  # the rest read and closed again
    assert proc.times(tree, cache) == times
    cache.close()
    assert budget.used == 0 and metrics.OpenBudget().limit > 0
