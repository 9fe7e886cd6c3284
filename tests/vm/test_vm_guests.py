"""tilewise on real multi-node Linux kernels: QEMU guests booted with the topologies in topologies.py.

One boot per topology runs many checks (guest_checks.py prints one JSON document); the tests here
compare what the guest's kernel and the real `tilewise` CLI showed with the topology that was
booted. The guests (guests.py) run two at a time, started when collection ends so they run beside
the host's tests. Skipped, with the reason, where QEMU, a kernel or busybox-static is missing
(`make setup` installs them).
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_slow
from vm import harness
from vm.guests import BENCH_QUERIES, CHECKS, PROBE_CPUS, SLOW_CHECKS, UP_SQL, of_session, postgres_missing
from vm.topologies import TOPOLOGIES

# A guest can take minutes under TCG on a busy 2-core machine; the first test of a guest waits for it.
pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]


@pytest.fixture(scope="session")
def guests(request):
    """The session's guests, started when collection ended (tests/conftest.py); closed when it ends."""
    return of_session(request.config, run_slow(request.config))


def guests_with(check: str) -> list[str]:
    return [n for n, c in CHECKS.items() if check in c]


def ok(r: dict) -> dict:
    assert r["rc"] == 0, f"tilewise {' '.join(r['args'])} exited {r['rc']}:\n{r['stderr'][-3000:]}"
    return r["json"]


# ---- what was booted ------------------------------------------------------------------------

def booted_nodes(t: harness.GuestTopology) -> list[tuple[int, tuple[int, ...], int]]:
    if not t.nodes:
        return [(0, tuple(range(t.ncpus)), t.mem_mib)]
    return [(i, tuple(n.cpus), n.mem_mib) for i, n in enumerate(t.nodes)]


def booted_l3(t: harness.GuestTopology) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(cpus, nodes) of each L3 (one per die), sorted by first CPU."""
    node_of = {c: i for i, cpus, _ in booted_nodes(t) for c in cpus}
    return sorted((g, tuple(sorted({node_of[c] for c in g}))) for g in t.l3_groups())


def booted_auto(t: harness.GuestTopology) -> str:
    """The auto rule for a machine without measurements: the finer of L3 domain and node."""
    cpu_nodes = [n for n in booted_nodes(t) if n[1]]
    l3 = booted_l3(t)
    if len(l3) > len(cpu_nodes):
        return "wicp"
    return "win" if len(cpu_nodes) > 1 else "wim"


# ---- the code under test ------------------------------------------------------------------------

@pytest.mark.parametrize("name", guests_with("sysfs"))
def test_guests_run_the_code_tested_here(guests, name):
    """The guest imports tilewise from where this test run does (a worktree's src on PYTHONPATH included)."""
    import tilewise

    assert guests.check(name, "sysfs")["tilewise"] == tilewise.__file__


# ---- topo ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", guests_with("topo"))
def test_topo_shows_what_was_booted(guests, name):
    t = TOPOLOGIES[name]
    doc = ok(guests.check(name, "topo")["json"])
    nodes = booted_nodes(t)
    assert [(n["id"], tuple(n["cpus"])) for n in doc["numa_nodes"]] == [(i, c) for i, c, _ in nodes]
    assert [n["cpuless"] for n in doc["numa_nodes"]] == [not c for _, c, _ in nodes]
    for n, (_, _, mib) in zip(doc["numa_nodes"], nodes):  # the kernel keeps a little of each node
        assert 0.75 * mib * 2**20 <= n["memory_bytes"] <= mib * 2**20, (n, mib)
    assert doc["distances"] == t.distance_matrix()
    assert sorted((tuple(d["cpus"]), tuple(d["numa_nodes"])) for d in doc["l3_domains"]) == booted_l3(t)
    assert doc["packages"] == t.sockets
    assert doc["cores"] == t.ncpus // t.threads and doc["pus"] == t.ncpus and doc["smt"] == t.threads
    assert sorted(tuple(c["pus"]) for c in doc["core_list"]) == t.core_groups()
    for c in doc["core_list"]:  # each core's package, node and L3 as booted
        assert c["package"] == t.cpu_location(c["pus"][0])[0]
        l3 = doc["l3_domains"][c["l3"]]
        assert set(c["pus"]) <= set(l3["cpus"]) and c["numa_node"] in l3["numa_nodes"]
    text = guests.check(name, "topo")["text"]["stdout"]
    assert f"{len(nodes)} NUMA node" in text


@pytest.mark.parametrize("name", guests_with("topo"))
def test_real_hwloc_on_the_guest_kernel_agrees(guests, name):
    """lstopo on the guest's kernel, loaded by tilewise, is the same model as sysfs; and real hwloc
    reads tilewise's export back to the same model (nodes under the cache where an L3 spans them)."""
    r = guests.check(name, "topo")
    assert r["lstopo_rc"] == 0, r["lstopo_err"]
    mine = ok(r["json"])
    keys = ("numa_nodes", "l3_domains", "core_list", "distances", "fingerprint")
    theirs = ok(r["from_lstopo"])
    for k in keys:
        if k == "numa_nodes":  # hwloc rounds nothing, but reports memory from its own sources: compare ids/cpus/kind
            assert [(n["id"], n["cpus"], n["cpuless"]) for n in theirs[k]] == [(n["id"], n["cpus"], n["cpuless"]) for n in mine[k]]
        else:
            assert theirs[k] == mine[k], k
    assert r["lstopo_reads_export_rc"] == 0, r["lstopo_reads_export_err"]
    again = ok(r["export_via_lstopo"])
    for k in keys:
        assert again[k] == mine[k], k
    if any(len(d["numa_nodes"]) > 1 for d in mine["l3_domains"]):
        # hwloc itself nests the nodes under the L3 on this kernel: "L3 ... / NUMANode" below it
        tree = r["lstopo_tree"]
        assert re.search(r"L3 P#\d+ \(\d+[KMG]B\)\n(\s+.*\n)*?\s+(Group0\n\s+)?NUMANode", tree), tree


# ---- plan ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", guests_with("plan"))
def test_every_policy_plans_what_was_booted(guests, name):
    t = TOPOLOGIES[name]
    r = guests.check(name, "plan")
    nodes = booted_nodes(t)
    cpu_nodes = [(i, c) for i, c, _ in nodes if c]
    primaries = [g[0] for g in t.core_groups()]
    node_of = {c: i for i, cs in cpu_nodes for c in cs}

    def inst(policy):
        return ok(r[policy])["instances"]

    assert [i["cpus"] for i in inst("wim")] == [primaries]
    win = inst("win")
    assert [(i["cpus"], i["mem_nodes"], i["mem_policy"]) for i in win] == [
        ([c for c in cs if c in primaries], [n], "membind") for n, cs in cpu_nodes]
    wicp = inst("wicp")
    assert sorted((tuple(i["cpus"]), tuple(i["mem_nodes"])) for i in wicp) == sorted(
        (tuple(c for c in cpus if c in primaries), nodes_) for cpus, nodes_ in booted_l3(t))
    assert all(i["mem_policy"] == "membind" for i in wicp)
    mixed = inst("wicp-mixed")
    assert len(mixed) == len(booted_l3(t)) and sorted(i["cores"] for i in mixed) == sorted(i["cores"] for i in wicp)
    assert all(i["mem_policy"] == "interleave" for i in mixed)
    assert [i["cpus"] for i in inst("wic")] == [[p] for p in primaries]
    assert sorted(i["cpus"] for i in inst("wic-smt")) == sorted(list(g) for g in t.core_groups())
    n2 = inst("n2")
    assert len(n2) == 2 and sorted(c for i in n2 for c in i["cpus"]) == primaries
    if len(cpu_nodes) > 1:
        spread = inst("spread")
        assert len(spread) == len(cpu_nodes)
        for i in spread:
            assert len({node_of[c] for c in i["cpus"]}) == min(len(i["cpus"]), len(cpu_nodes))
    else:
        assert r["spread"]["rc"] == 2 and "spread needs at least 2 NUMA nodes" in r["spread"]["stderr"]
        assert r["spread"]["stderr"].startswith("Error: ") and r["spread"]["stderr"].count("\n") == 1
    auto = ok(r["auto"])
    assert auto["policy"] == booted_auto(t) and auto["reasons"]
    if any(len(nodes_) > 1 for _, nodes_ in booted_l3(t)):
        assert any("sub-NUMA clustering" in x for x in auto["reasons"]), auto["reasons"]
        assert "span several NUMA nodes" in r["wicp-text"]["stdout"]


# ---- exec: where pages land ---------------------------------------------------------------------

def pages(r: dict) -> dict[int, int]:
    assert r["rc"] == 0, f"exec {' '.join(r['args'])} exited {r['rc']}:\n{r['stderr'][-2000:]}"
    assert r["touch"] is not None, r["stderr"][-2000:]
    return {int(k): v for k, v in r["touch"]["pages"].items() if v}


def assert_even(p: dict[int, int], nodes, total: int) -> None:
    assert set(p) == set(nodes), p
    for n in nodes:
        assert abs(p[n] - total / len(nodes)) <= 0.1 * total / len(nodes) + 2, p


@pytest.mark.parametrize("name", guests_with("exec"))
def test_exec_puts_pages_where_the_policy_says(guests, name):
    t = TOPOLOGIES[name]
    r = guests.check(name, "exec")
    cpu_nodes = [(i, c) for i, c, _ in booted_nodes(t) if c]
    last, last_cpus = cpu_nodes[-1]
    primaries = [g[0] for g in t.core_groups()]
    total = r["wim-default"]["touch"]["total_pages"]
    assert sum(pages(r["wim-default"]).values()) == total
    for mem, shown in (("membind", f"bind:{last}"), ("preferred", f"prefer:{last}"), ("local", "local")):
        case = r[f"win-last-{mem}"]
        assert pages(case) == {last: total}, (mem, case["touch"])
        assert case["touch"]["policy"] == shown
        assert case["touch"]["cpus"] == _fmt([c for c in last_cpus if c in primaries])
        assert case["json"]["verification"]["ok"], case["json"]
    all_nodes = [n for n, _ in cpu_nodes]
    p = pages(r["wim-interleave"])
    if len(all_nodes) > 1:
        assert_even(p, all_nodes, total)
    if "interleave-named" in r:
        named = [cpu_nodes[1][0], last]
        assert_even(pages(r["interleave-named"]), named, total)
        assert r["interleave-named"]["touch"]["policy"] == f"interleave:{_fmt(named)}"


def _fmt(cpus) -> str:
    from tilewise import cpulist

    return cpulist.format(cpus)


def test_cpuless_memory_tier(guests):
    """A CPU-less node as far memory: membind and preferred put every page there, interleave
    splits evenly with node 0; weighted interleave needs Linux 6.9+ and says so in one line."""
    name = "two-socket-cxl"
    r = guests.check(name, "exec")
    kernel = guests.check(name, "sysfs")
    cxl = next(i for i, n in enumerate(TOPOLOGIES[name].nodes) if not n.cpus)
    total = r["wim-default"]["touch"]["total_pages"]
    assert pages(r[f"cpuless{cxl}-membind"]) == {cxl: total}
    assert pages(r[f"cpuless{cxl}-preferred"]) == {cxl: total}
    assert_even(pages(r[f"cpuless{cxl}-interleave"]), [0, cxl], total)
    w = r[f"cpuless{cxl}-weighted"]
    if kernel["weighted_interleave_sysfs"]:
        assert_even(pages(w), [0, cxl], total)  # default weights are equal
        assert w["touch"]["policy"] == "weighted"
    else:
        assert w["rc"] == 1 and w["touch"] is None
        assert w["stderr"].startswith("Error: memory policy weighted-interleave is not supported by this kernel")
        assert w["stderr"].count("\n") == 1 and "Traceback" not in w["stderr"]


# ---- bench ---------------------------------------------------------------------------------------

def test_bench_tpch_policies_give_valid_answers(guests):
    name = "two-socket-cxl"
    t = TOPOLOGIES[name]
    r = guests.check(name, "bench")
    doc = ok(r)
    want = {"wim": 1, "win": len([n for n in t.nodes if n.cpus]), "wicp": len(t.l3_groups())}
    assert set(doc["summary"]) == set(want)
    for pol, n in want.items():
        s = doc["summary"][pol]
        assert s["valid"] is True and s["complete"] is True, (pol, s)
        assert sorted(doc["policies"][pol]["queries"]) == sorted(f"q{n}" for n in BENCH_QUERIES)
        assert f"{pol}: starting {n} duckdb instance(s)" in r["stderr"]
    assert "results.json" in r["files"] and "results.csv" in r["files"]
    assert not r["leftover_processes"], r["leftover_processes"]


# ---- up --engine duckdb / status / query / down ------------------------------------------------------

def up_expected(t: harness.GuestTopology) -> list[tuple[str, int]]:
    """(cpus, node) of each DuckDB server under WIN: one per node with CPUs (a CPU-less node gets
    none), on the node's cores (first thread of each), memory bound to that node."""
    primaries = {g[0] for g in t.core_groups()}
    return [(_fmt([c for c in cpus if c in primaries]), i) for i, cpus, _ in booted_nodes(t) if cpus]


def check_up_facts(t: harness.GuestTopology, r: dict, answer: list) -> None:
    """What the guest showed around `up --engine duckdb --policy win`, `status`, `query`, `down`,
    compared with the booted topology (raises AssertionError at the first difference)."""
    up = ok(r["up"])
    assert up["engine"] == "duckdb" and up["policy"] == "win" and up["healthy"], up["problems"]
    st = ok(r["status"])  # exit 0: every server alive, answering on its socket, binding verified
    assert st["healthy"] and not st["problems"], st["problems"]
    servers = sorted(st["members"], key=lambda m: m["instance"])
    assert [m["role"] for m in servers] == ["worker"] * len(servers)
    want = up_expected(t)
    assert sorted((m["cpus"], m["mem_policy"], tuple(m["mem_nodes"])) for m in servers) == sorted(
        (cpus, "membind", (node,)) for cpus, node in want), servers
    for m in servers:
        cpus, node = m["cpus"], m["mem_nodes"][0]
        # tilewise read the binding back from /proc...
        v = m["verification"]
        assert m["binding_verified"] is True and v["ok"], v
        assert v["checks"]["cpus"]["got"] == cpus and v["checks"]["memory"]["got"] == f"bind:{node}", v
        # ...and so did the check, itself: the mask, every mapping's policy, where the anonymous pages are
        proc = r["proc"][str(m["pid"])]
        assert proc["Cpus_allowed_list"] == cpus, (m["pid"], proc)
        assert node in cpulist_parse(proc["Mems_allowed_list"]), proc
        assert set(proc["numa_maps_policies"]) == {f"bind:{node}"}, (m["pid"], proc["numa_maps_policies"])
        anon = {int(k): v for k, v in proc["anon_pages"].items() if v}
        assert set(anon) == {node} and anon[node] > 1000, (m["pid"], anon)  # the loaded tables live there
    workers = {str(m["pid"]) for m in servers}
    assert r["token_recorded"] and workers <= set(r["tagged_before"]), (workers, r["tagged_before"])
    last = max(m["instance"] for m in servers)
    assert set(r["queries"]) == {"0", str(last)}
    for inst, q in r["queries"].items():
        qd = ok(q)
        assert qd["instance"] == int(inst) and qd["rows"] == answer, (inst, qd)
    down = ok(r["down"])
    assert {int(p) for p in workers} <= set(down["stopped_pids"]) and not down["left"], down
    assert r["tagged_after"] == [] and r["killed_after_check"] == [], r["tagged_after"]
    assert r["state_file_after"] is False
    assert not [f for f in r["cluster_dir_after"] if f.endswith(".json") or f == "vm"], r["cluster_dir_after"]


def cpulist_parse(text: str) -> tuple[int, ...]:
    from tilewise import cpulist

    return cpulist.parse(text)


def up_answer(tables: dict) -> list:
    """UP_SQL's answer, computed here by DuckDB from the Parquet files the guest's servers loaded."""
    import duckdb

    con = duckdb.connect()
    for name in ("lineitem", "orders"):
        con.read_parquet(tables[name]).create_view(name)
    return [list(row) for row in con.execute(UP_SQL).fetchall()]


@pytest.mark.parametrize("name", [*guests_with("up"),
                                  *(pytest.param(n, marks=pytest.mark.slow) for n, c in SLOW_CHECKS.items() if "up" in c)])
def test_up_duckdb_win_status_query_down(guests, name):
    """`up --engine duckdb --policy win --sf 0.01`: one server per node with CPUs, bound to that node's
    cores and membind to it (checked by tilewise and again from /proc in the guest, pages included);
    a query answers what DuckDB computes here; `down` exits 0 and leaves no process carrying the
    cluster's token and no state file."""
    r = guests.check(name, "up")
    tables = ok(r["status"])["data"]["tables"]
    check_up_facts(TOPOLOGIES[name], r, up_answer(tables))


@pytest.mark.parametrize("name", guests_with("tiles"))
def test_up_tiles_win_workers_bound_and_rings_on_the_receiving_node(guests, name):
    """`up --engine tiles --policy win --exchange shm`: one worker per node with CPUs, bound to its cores
    and membind to its node (verified by tilewise and again from /proc); every page of shared memory
    any process maps -- the control messages' rings and the arenas the batches are written into -- is
    on its reader's node, each worker reads from rings bound to its own node, and the batches that
    crossed the exchange lie in arenas on their receiver's node; the coordinator's answer is DuckDB's
    here; `down` leaves nothing."""
    from tilewise.engines import tiles

    if tiles.SPEC.missing():  # the guest runs the host's binary (its cache is shared)
        pytest.skip(f"tiles: {tiles.SPEC.missing()}")
    r = guests.check(name, "tiles")
    up = ok(r["up"])
    t = TOPOLOGIES[name]
    cpu_nodes = [i for i, n in enumerate(t.nodes) if n.cpus]
    members = up["members"]
    workers = sorted((m for m in members if m["role"] == "worker"), key=lambda m: m["instance"])
    assert [m["mem_nodes"][0] for m in workers] == cpu_nodes, workers
    node_of = {m["pid"]: m["mem_nodes"][0] for m in members if m.get("mem_nodes")}
    assert len(node_of) == len(members) and up["members"], members  # the coordinator is bound too
    for m in workers:
        node = m["mem_nodes"][0]
        v = m["verification"]
        assert m["binding_verified"] is True and v["ok"], v
        assert v["checks"]["memory"]["got"] == f"bind:{node}", v
        proc = r["proc"][str(m["pid"])]
        assert proc["Cpus_allowed_list"] == m["cpus"], (m["pid"], proc)
        # it reads rings of its own: from the coordinator, and from the tiles whose shuffles it reads
        mine = [x for x in proc["rings"] if x["reader"] == m["pid"]]
        assert mine and sum(x["pages"].get(str(node), 0) for x in mine) > 0, (node, proc["rings"])
    # the batches crossed in arenas: pages written by their senders, read in place by their receivers
    arenas = [x for p in r["proc"].values() for x in p["rings"] if x["kind"] == "arena"]
    assert sum(sum(x["pages"].values()) for x in arenas) > 0, arenas
    assert len({x["reader"] for x in arenas}) >= 2, arenas  # the coordinator and a worker at least
    # every page of every ring and arena, seen from either end, is on its reader's node
    rings = [(pid, x) for pid, p in r["proc"].items() for x in p["rings"]]
    assert len({x["reader"] for _, x in rings}) >= len(workers), rings
    for pid, x in rings:
        assert x["reader"] in node_of, (pid, x)
        on = {int(k) for k, n in x["pages"].items() if n}
        assert on <= {node_of[x["reader"]]}, (pid, x, node_of[x["reader"]])
    tables = up["data"]["tables"]
    assert ok(r["query"])["rows"] == up_answer(tables)
    down = ok(r["down"])
    assert not down["left"], down
    assert r["tagged_after"] == [] and r["killed_after_check"] == [] and r["state_file_after"] is False


def test_up_postgres_win_one_server_per_node(guests):
    """`up --engine postgres --policy win --sf 0.01`: one PostgreSQL server per node with CPUs (none on
    the CPU-less node); every process of each server (postmaster, background processes, a backend of
    ours, parallel workers) on that node's cores, membind to it, and the backend's pages -- private
    and the shared buffers it read lineitem into -- on that node; `down` leaves no process, no System
    V segment, no /dev/shm file and no data directory."""
    why = postgres_missing()
    if why:
        pytest.skip(f"postgres: {why}")
    name = "two-socket-cxl"
    t = TOPOLOGIES[name]
    r = guests.check(name, "postgres")
    up = ok(r["up"])
    assert up["engine"] == "postgres" and up["policy"] == "win" and up["healthy"], up["problems"]
    want = up_expected(t)
    servers = sorted(up["members"], key=lambda m: m["instance"])
    assert sorted((m["cpus"], m["mem_policy"], tuple(m["mem_nodes"])) for m in servers) == sorted(
        (cpus, "membind", (node,)) for cpus, node in want), servers
    for m in servers:  # tilewise read back the whole tree
        assert m["processes"] and all(p["verification"] == "verified" for p in m["processes"]), m["processes"]
    answers = set()
    for m in servers:
        cpus, node = m["cpus"], m["mem_nodes"][0]
        srv = r["servers"][str(m["instance"])]
        answers.add(json.dumps(srv["answer"]))
        procs = {"postmaster": srv["postmaster"], "backend": srv["backend"], **srv["children"],
                 **{f"parallel worker {p}": b for p, b in srv["parallel_workers"].items()}}
        assert len(srv["children"]) >= 4, srv["children"]  # checkpointer, writers, launchers
        for who, proc in procs.items():
            assert proc["Cpus_allowed_list"] == cpus, (m["instance"], who, proc)
            assert set(proc["numa_maps_policies"]) <= {f"bind:{node}"}, (m["instance"], who, proc)
        pages = {int(k): v for k, v in srv["backend"]["anon_pages"].items() if v}
        assert set(pages) == {node} and pages[node] > 100, (m["instance"], pages)  # lineitem in its buffers
        assert srv["parallel_workers"], "no parallel worker seen"
    assert len(answers) == 1  # every server holds the same data
    down = ok(r["down"])
    assert {m["pid"] for m in servers} <= set(down["stopped_pids"]) and not down["left"], down
    assert r["tagged_after"] == [] and r["killed_after_check"] == [], r["tagged_after"]
    assert r["sysv_after"] == [] and r["dev_shm_after"] == [] and r["dirs_after"] == [], r


# ---- elastic -------------------------------------------------------------------------------------

def granted(run: dict) -> list[int]:
    """Cores in the order the daemon handed them out (start core first)."""
    order: list[int] = []
    for rec in run["log"]:
        for c in rec.get("cores") or []:
            if c not in order:
                order.append(c)
    return order


def test_elastic_modes_grant_cores_on_the_expected_nodes(guests):
    name = "two-socket-cxl"
    t = TOPOLOGIES[name]
    runs = guests.check(name, "elastic")
    node_of = {c: i for i, n in enumerate(t.nodes) for c in n.cpus}
    for mode, run in runs.items():
        ok(run["cli"])
        assert run["cli"]["json"]["restored"] and run["cli"]["json"]["enforce"] == ["affinity"]
        got = granted(run)
        assert len(got) >= 3, (mode, run["log"])
        nodes = [node_of[c] for c in got]  # core ids are CPU numbers here (no SMT)
        if mode == "dense":  # fill node 0 first
            assert nodes[:4] == [0] * min(4, len(nodes)), got
        elif mode == "sparse":  # round-robin over the nodes
            assert nodes[:4] == [0, 1, 0, 1][:len(nodes[:4])], got
        else:  # adaptive: the node holding the target's pages (the last node)
            assert run["mem_node"] == 1
            assert nodes[:4] == [1] * min(4, len(nodes)), got
            assert any(rec.get("pages", {}).get("1", 0) > 0 for rec in run["log"])
        # everything restored: the target and its children get all CPUs back, same cgroups
        assert run["after"] == run["before"] == list(range(t.ncpus))
        assert run["cgroup_after"] == run["cgroup_before"]
        assert all(v == run["before"] for v in run["after_children"].values())


@pytest.mark.slow
def test_elastic_adaptive_grants_on_the_node_holding_the_postgres_servers_pages(guests):
    """A PostgreSQL server allowed on every CPU, its memory bound to node 1 (cgroup2 guest, v2
    cpuset): under load the daemon starts on node 1 and fills it before node 0 (pages per node
    summed over the postmaster's tree), the backends born during the run join the tree, and the
    server, its processes and its group are as before afterwards."""
    r = guests.check("cgroup2", "postgres_elastic")
    if r.get("skipped"):
        pytest.skip(f"PostgreSQL in the guest: {r['skipped']}")
    assert not r.get("error"), r.get("error")
    s = r["summary"]
    assert s["restored"] and not s["problems"] and s["enforce"] == ["cgroup-v2"], s
    t = TOPOLOGIES["cgroup2"]
    node_of = {c: i for i, n in enumerate(t.nodes) for c in n.cpus}
    far = r["mem_node"]
    assert far == len(t.nodes) - 1
    got = [node_of[c] for c in granted(r)]
    n_far = len(t.nodes[far].cpus)
    assert len(got) > n_far and got[:n_far] == [far] * n_far, (got, r["log"])  # its node first, whole
    ticks = [rec for rec in r["log"] if "pages" in rec and not rec.get("event")]
    assert ticks and all(rec["pages"][str(far)] > sum(v for k, v in rec["pages"].items() if k != str(far)) for rec in ticks)
    assert max(rec["processes"] for rec in ticks) >= r["processes_at_start"] + 3  # the clients' backends, born after
    assert r["after"] == r["before"] == list(range(t.ncpus))
    assert all(v == r["before"] for v in r["after_tree"].values())
    assert r["cgroup_after"] == "0::/"  # back in its own group, ours removed


# ---- probes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", guests_with("probes"))
def test_probe_pairs_grouped_by_node_and_l3(guests, name):
    t = TOPOLOGIES[name]
    doc = ok(guests.check(name, "probes"))
    cpus = [int(c) for c in PROBE_CPUS[name].split(",")]
    assert doc["cpus"] == cpus
    node_of = {c: i for i, c2, _ in booted_nodes(t) for c in c2}
    l3_of = {c: k for k, (g, _) in enumerate(booted_l3(t)) for c in g}
    want: dict[str, int] = {}
    for a in cpus:
        for b in cpus:
            if a == b:
                continue
            sa, sb = t.cpu_location(a)[0], t.cpu_location(b)[0]
            if node_of[a] == node_of[b]:
                cls = "l3" if l3_of[a] == l3_of[b] else "node"
            else:
                cls = "package" if sa == sb else "remote"
            want[cls] = want.get(cls, 0) + 1
    got = {cls: s["pairs"] for cls, s in doc["summary"]["cas"].items()}
    assert got == want


# ---- cgroup v2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("enforce", ["auto", "cgroup"])
def test_cgroup2_only_guest(guests, enforce):
    """The guest mounts only cgroup2 (cgroup_no_v1=all), as current distributions do. --enforce cgroup
    takes a cpuset group of its own (the target is in the root group: +cpuset at the root, a child
    group); auto does not enable controllers by itself and says why it uses sched_setaffinity. Both
    grant cores round-robin over the nodes and restore everything: affinity, the target's group, the
    root's controllers, no group left behind."""
    r = guests.check("cgroup2", "cgroup")
    assert r["mounts"] == ["cgroup2 /sys/fs/cgroup"], r["mounts"]
    run = r[enforce]
    s = ok(run["cli"])
    assert s["restored"] and not s["problems"], s
    if enforce == "cgroup":
        assert s["enforce"] == ["cgroup-v2"], s
    else:
        assert s["enforce"] == ["affinity"] and any("cgroup" in n for n in s["notes"]), s
    t = TOPOLOGIES["cgroup2"]
    node_of = {c: i for i, n in enumerate(t.nodes) for c in n.cpus}
    assert [node_of[c] for c in granted(run)][:2] == [0, 1]
    assert run["after"] == run["before"] == list(range(t.ncpus))
    assert run["cgroup_after"] == run["cgroup_before"] == "0::/"  # back in its own group
    assert run["cgroups_after"] == run["cgroups_before"]  # no group left, controllers as they were


def test_cgroup2_constrains_a_service_group_in_place_and_restore_undoes_a_killed_daemon(guests):
    """A target alone in a systemd-like service group (cpuset enabled above it): elastic writes that
    group's own cpuset.cpus (journaled), a second daemon refuses naming the first, SIGTERM puts it
    back; a daemon killed with SIGKILL leaves it constrained until `tilewise restore`."""
    r = guests.check("cgroup2", "cgroup_inplace")
    before = r["before"]
    assert before["cpus"] == "" and before["cgroup"] == "0::/system.slice/db.service", before
    first = r["first"]
    assert first["rc"] == 130, first["stderr"]
    s = first["json"]
    assert s["enforce"] == ["cgroup-v2 in place"] and s["restored"] and not s["problems"], s
    # 6.1 refuses an empty cpuset.cpus on a group with tasks (ENOSPC): restored to the parent's CPUs, said so
    whole = f"0-{TOPOLOGIES['cgroup2'].ncpus - 1}"
    kept = [n for n in s["notes"] if "does not let a group with tasks go back" in n]
    assert r["during"]["cpus"] != "" and r["during"]["cgroup"] == before["cgroup"]  # constrained, not moved
    second = r["second"]
    assert second["rc"] == 1 and "is already controlled by pid" in second["stderr"], second["stderr"]
    after = r["after_term"]
    assert after["cpus"] in ("", whole) and bool(kept) == (after["cpus"] != ""), (after, s["notes"])
    assert after["affinity"] == before["affinity"] and after["cgroup"] == before["cgroup"]
    assert r["during_kill"]["cpus"] != "" and r["after_kill"]["cpus"] == r["during_kill"]["cpus"]
    restored = ok(r["restore"])
    assert [j["state"] for j in restored["journals"]] == ["restored"], restored
    final = r["after_restore"]
    assert final["cpus"] in ("", whole) and final["affinity"] == before["affinity"], final


# ---- memory tiers: firmware figures (HMAT) and the memory matrix ------------------------------------

def booted_best(t: harness.GuestTopology) -> dict[int, dict]:
    """Per target node, what the kernel should show in access0/access1: the initiators with the best
    read latency among those the firmware gives, and their four figures."""
    figs: dict[tuple[int, int], dict[str, int]] = {}
    for h in t.hmat:
        figs.setdefault((h.initiator, h.target), {})[h.data_type.replace("-", "_")] = h.value
    out = {}
    for target in range(len(t.nodes)):
        paths = {i: f for (i, tg), f in figs.items() if tg == target}
        best = min(f["read_latency"] for f in paths.values())
        inits = sorted(i for i, f in paths.items() if f["read_latency"] == best)
        out[target] = {"initiators": inits, **paths[inits[0]]}
    return out


@pytest.mark.parametrize("name", guests_with("hmat"))
def test_hmat_figures_as_booted(guests, name):
    """Every node's access0/access1 figures (raw sysfs, tilewise's reader, real lstopo --memattrs)
    are those the guest was booted with; the kernel's tiers are read as it shows them."""
    t = TOPOLOGIES[name]
    r = guests.check(name, "hmat")
    want = booted_best(t)
    for target, w in want.items():
        for acc in ("access0", "access1"):
            raw = r["raw"][f"node{target}/{acc}"]
            assert raw["initiators"] == [f"node{i}" for i in w["initiators"]], (target, acc, raw)
            for f in ("read_latency", "write_latency", "read_bandwidth", "write_bandwidth"):
                assert int(raw[f]) == w[f], (target, acc, f, raw)
            mine = next(a for a in r["tilewise"]["hmat"] if a["target"] == target and a["access"] == acc)
            assert mine["initiators"] == w["initiators"] and all(mine[f] == w[f] for f in
                                                                 ("read_latency", "write_latency", "read_bandwidth",
                                                                  "write_bandwidth")), mine
    # real hwloc reads the same figures (its NUMANode L# are logical: match by the value sets)
    assert r["lstopo_rc"] == 0
    text = r["lstopo_memattrs"]
    for attr, f in (("ReadBandwidth", "read_bandwidth"), ("WriteLatency", "write_latency")):
        block = text.split(f"name `{attr}'")[1].split("Memory attribute")[0]
        got = sorted(int(x) for x in re.findall(r"= (\d+) from", block))
        assert got == sorted(w[f] for w in want.values()), (attr, block)
    # the kernel's tiers: all of memory in tier 4 on 6.1 (HMAT-derived tiers came later), read as shown
    assert {x["id"]: x["nodes"] for x in r["tilewise"]["tiers"]} == {
        int(k.removeprefix("memory_tier")): list(cpulist_parse(v)) for k, v in r["tiers"].items()}
    assert r["tiers"], "the 6.1 guest kernel has memory tiers"


@pytest.mark.parametrize("name", guests_with("memprobe"))
def test_probe_memory_covers_every_initiator_and_target(guests, name):
    """Every node with CPUs x every node with memory is a measured cell, with every page of its buffer
    on the target (checked before and after) and bound there; the figures are marked as the
    emulator's under TCG. A buffer bound elsewhere than its target is refused, not measured."""
    t = TOPOLOGIES[name]
    r = guests.check(name, "memprobe")
    doc = ok(r["matrix"])
    cpu_nodes = [i for i, n in enumerate(t.nodes) if n.cpus]
    assert [i["node"] for i in doc["initiators"]] == cpu_nodes
    assert doc["targets"] == list(range(len(t.nodes)))
    cells = {(c["initiator"], c["target"]): c for c in doc["cells"]}
    assert set(cells) == {(f"node {i}", tg) for i in cpu_nodes for tg in range(len(t.nodes))}
    for (ini, tg), c in cells.items():
        assert c["status"] == "measured", c
        for when in ("before", "after"):
            p = c["placement"][when]
            assert p["on_target"] == p["pages"] > 0 and not p["elsewhere"] and p["missing"] == 0, (ini, tg, p)
            assert p["policy"] == f"bind:{tg}" and p["numa_maps"] == {str(tg): p["pages"]}, p
        assert set(c["results"]) == {"latency", "read_seq", "write_nt"}
    guest_accel = guests.times[name].accel
    if guest_accel == "tcg":
        assert doc["emulated"] and "TCG" in doc["emulated"], doc["emulated"]
        assert any("emulator" in w for w in doc["warnings"]), doc["warnings"]
    mis = r["misplaced"]
    assert mis["rc"] == 0 and "not_measured" in mis["stdout"] and "result " not in mis["stdout"], mis
    assert f"not on node {mis['target']} (elsewhere: {mis['bound']}:" in mis["stdout"], mis["stdout"]


@pytest.mark.parametrize("name", guests_with("tiers"))
def test_placement_by_tier(guests, name):
    """Each socket's instance gets the CPU-less node the firmware puts nearest to it as its far tier;
    auto weights come from the firmware's read bandwidth (the guest's own measurements would be the
    emulator's); near-then-far fills the near node, then the far one; weighted interleave is refused
    in one line where the kernel lacks it, before any weight is written; the far-memory study of a
    workload (W2 --mem-variants) runs each variant bound to its nodes."""
    t = TOPOLOGIES[name]
    r = guests.check(name, "tiers")
    want_far = {i: [k for k, n in enumerate(t.nodes) if not n.cpus and n.initiator == i] for i, n in enumerate(t.nodes) if n.cpus}
    plan_ntf = ok(r["plan_ntf"])
    for inst in plan_ntf["instances"]:
        node = inst["numa_nodes"][0]
        assert inst["far_nodes"] == want_far[node], inst
        assert inst["mem_policy"] == "preferred-many" and inst["mem_nodes"] == [node, *want_far[node]]
        assert "firmware (HMAT)" in inst["mem_reason"], inst["mem_reason"]
    best = booted_best(t)
    for inst in ok(r["plan_weighted"])["instances"]:
        node, far = inst["numa_nodes"][0], want_far[inst["numa_nodes"][0]][0]
        ratio = best[node]["read_bandwidth"] / best[far]["read_bandwidth"]
        w = {int(k): v for k, v in inst["weights"].items()}
        assert set(w) == {node, far} and abs(w[node] / w[far] - ratio) <= 0.05 * ratio, (w, ratio)
        assert "firmware's read bandwidth" in inst["mem_reason"], inst["mem_reason"]
    # near, then far: the near node fills, the rest is on the far node, nothing elsewhere
    near, far = r["near"], r["far"][0]
    p = pages(r["exec_ntf"])
    total = r["exec_ntf"]["touch"]["total_pages"]
    assert set(p) <= {near, far} and sum(p.values()) == total, p
    assert p.get(far, 0) > 0 and p[near] > p[far], (p, r["free_before_mib"], r["touched_mib"])
    assert r["exec_ntf"]["json"]["verification"]["checks"]["memory"]["got"].startswith("prefer (many):"), r["exec_ntf"]["json"]
    w = r["exec_weighted"]
    if guests.check(name, "sysfs")["weighted_interleave_sysfs"]:
        assert w["rc"] == 0, w["stderr"]
    else:
        assert w["rc"] == 1 and w["stderr"].startswith("Error: memory policy weighted-interleave is not supported by "
                                                      "this kernel") and "6.9" in w["stderr"], w["stderr"]
        assert w["stderr"].count("\n") == 1 and r["weights_after"] is None
    # the far-memory study of W2 in that tile: each variant's runs bound to its nodes (read back from
    # /proc), the same answer in every variant, the slowdowns marked as the emulator's under TCG
    study = ok(r["study"])
    assert study["kind"] == "workload.far_memory" and study["complete"] and not study["wrong_answers"]
    want = {"near": f"bind:{near}", "far": f"bind:{far}", "interleave": f"interleave:{min(near, far)},{max(near, far)}"}
    for v, got in want.items():
        rec = study["variants"][v]
        assert len(rec["times_s"]) == 2 and all(x["ok"] and x["checks"]["memory"]["got"] == got
                                                for x in rec["verification"]), (v, rec["verification"])
    assert set(study["far_memory"]["deployments"][study["deployment"]]) == {"far", "interleave"}
    if guests.times[name].accel == "tcg":
        assert study["emulated"] and any("emulator's" in x for x in study["warnings"]), study.get("warnings")


def test_cgroup2_delegation_to_a_user(guests):
    """As nobody, in a scope delegated the way systemd's Delegate=yes does it: the scope's own
    cpuset.cpus is root's, so elastic on the scope is refused in one line (exit 2, the way out
    named); a child group nobody made is nobody's to constrain: cores granted, everything restored,
    no journal left."""
    r = guests.check("cgroup2", "cgroup_delegated")
    assert r["mkdir"] == "" and r["target_ready"] == "ready", r
    before = r["before"]
    assert before["cgroup"] == "0::/user.slice/u.scope/db" and before["owners"] == {"db": 65534, "scope": 0}, before
    scope = r["scope"]
    err = scope["stderr"].strip()
    assert scope["rc"] == 2 and err.startswith("Error: ") and len(err.splitlines()) == 1, scope
    assert "cpuset.cpus of /sys/fs/cgroup/user.slice/u.scope (owned by root)" in err and "Delegate=yes" in err, err
    s = ok(r["db"])
    assert s["enforce"] == ["cgroup-v2 in place"] and s["restored"] and not s["problems"] and not s["partial"], s
    assert s["allocations"] >= 1, s
    after = r["after"]
    # as in place above: 6.1 refuses an empty cpuset.cpus on a group with tasks; then the parent's CPUs, said so
    whole = f"0-{TOPOLOGIES['cgroup2'].ncpus - 1}"
    kept = [n for n in s["notes"] if "does not let a group with tasks go back" in n]
    assert after["cpus"] in (before["cpus"], whole) and bool(kept) == (after["cpus"] != before["cpus"]), (after, s)
    assert after["affinity"] == before["affinity"] and after["cgroup"] == before["cgroup"] and r["journals"] == []
