"""The VM suite's guests: the checks each topology boots with, the host-side warm-ups, and Guests,
which boots them (two at a time) and hands out their JSON documents.

A test session that selects a guest test starts them as soon as collection ends
(tests/conftest.py), so the guests (about 12 minutes of guest time on 2 cores) run beside the
host's tests instead of after them; every input they read is resolved then (harness.prepare).
"""

from __future__ import annotations

import os
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

import pytest

from vm import harness
from vm.topologies import TOPOLOGIES

REPO = Path(__file__).resolve().parents[2]
# The guests run this interpreter (the checkout's .venv after `make setup`, or a shared one with the
# worktree's sources on PYTHONPATH, which the harness passes on), so they check the code tested here.
PY = Path(sys.executable)

# The checks each guest runs (guest_checks.py), one boot per topology.
# `up` runs where it shows something of its own (a CPU-less node gets no server; 4 nodes): each `up`
# check costs 50-85 s of guest time; the guests (about 12 minutes on 2 cores, beside the host's tests)
# must end before the host's tests do, or they lengthen the suite.
CHECKS = {  # submitted in this order, 2 at a time: the longest first, then the rest to even out both slots
    "two-socket-cxl": ["sysfs", "topo", "plan", "exec", "up", "elastic", "probes", "bench", "postgres"],
    "l3-spans-nodes": ["sysfs", "topo", "plan", "exec", "probes"],
    "four-node-asym": ["sysfs", "topo", "plan", "exec", "tiles"],
    "cgroup2": ["sysfs", "topo", "exec", "cgroup", "cgroup_inplace", "cgroup_delegated"],
    "smt": ["sysfs", "topo", "plan", "exec"],
    "single-node": ["sysfs", "topo", "plan", "exec"],
    "hmat-tiers": ["sysfs", "topo", "hmat", "memprobe", "tiers"],
}
# Checks too long for the default suite, booted only with the slow tests (--run-slow or TILEWISE_SLOW=1):
# postgres_elastic takes 38-66 s of guest time (a PostgreSQL server on the host's cached load).
# four-node-asym's `up` (DuckDB servers on 4 nodes, 40-100 s) went there when its tiles check (one
# worker per node on the same 4 nodes, the rings' pages) joined the default suite; two-socket-cxl
# still runs DuckDB's `up` by default.
SLOW_CHECKS = {"cgroup2": ["postgres_elastic"], "four-node-asym": ["up"]}
BENCH_ARGS = ("--sf", "0.01", "--runs", "1", "--no-warmup", "--no-plots", "--tests", "power")
# what the guest's benchmark runs: a scan and aggregate, a 3-way and a 6-way join, a group-by under an IN
# subquery -- each policy's instances, placement and answers on a multi-node kernel; all 22 queries run
# on the host (tests/test_tpch_e2e.py), and under TCG every query costs seconds per policy (22: 156-188 s)
BENCH_QUERIES = ("1", "3", "9", "18")
PROBE_CPUS = {"two-socket-cxl": "0,1,2,4", "l3-spans-nodes": "0,1,2,4"}
# asked of the DuckDB servers `up` starts in the guests; the answer is computed here from the same files
UP_SQL = ("SELECT l_returnflag, l_linestatus, count(*) AS n, CAST(sum(l_quantity) AS BIGINT) AS qty, "
          "count(DISTINCT o_custkey) AS customers FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
          "GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus")  # standard SQL: DataFusion too


class Guests:
    """Boots every guest once (two at a time) and hands out their JSON documents."""

    def __init__(self, slow: bool = False) -> None:
        self.slow = slow  # also the SLOW_CHECKS
        self.futures: dict[str, Future] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.times: dict[str, harness.GuestResult] = {}
        self.seconds: dict[str, dict[str, float]] = {}  # guest -> check -> seconds in the guest
        self.broken: str | None = None  # why the guests could not be prepared (a warm-up's traceback)

    def selected(self) -> dict[str, list[str]]:
        """TILEWISE_VM_GUESTS=a,b boots only those guests (the others' tests are skipped)."""
        only = [n for n in os.environ.get("TILEWISE_VM_GUESTS", "").split(",") if n]
        checks = {n: c + (SLOW_CHECKS.get(n, []) if self.slow else []) for n, c in CHECKS.items()}
        return {n: c for n, c in checks.items() if not only or n in only}

    def start(self) -> None:
        """Warm the host's caches the guests read, prepare every run here (this thread's environment,
        directory and temporary directory as they are now) and submit them, heaviest first. A failure
        is kept and reported by the tests that ask for a guest, not raised at the session's start."""
        if self.pool is not None:
            return
        jobs = int(os.environ.get("TILEWISE_VM_JOBS", "2"))
        self.pool = ThreadPoolExecutor(max(1, jobs), thread_name_prefix="vm")
        chosen = self.selected()
        try:
            env = self._warm(chosen)
        except Exception:  # noqa: BLE001  (a warm-up that failed fails every guest test, with its traceback)
            self.broken = traceback.format_exc()
            return
        for name, checks in chosen.items():
            guest_env = dict(env, TILEWISE_STATE_DIR="/tmp/tilewise-state", TILEWISE_CLUSTER_DIR="/tmp/tilewise-clusters")
            if name in PROBE_CPUS:
                guest_env["TILEWISE_GUEST_PROBE_CPUS"] = PROBE_CPUS[name]
            if "up" in checks or "tiles" in checks:
                guest_env["TILEWISE_GUEST_UP_SQL"] = UP_SQL
            if "bench" in checks:
                guest_env["TILEWISE_GUEST_BENCH_QUERIES"] = ",".join(BENCH_QUERIES)
            cmd = [str(PY), str(Path(__file__).with_name("guest_checks.py")), *checks]
            try:
                job = harness.prepare(TOPOLOGIES[name], cmd, cwd=REPO, env=guest_env, share=[sys.prefix], timeout=2400)
            except harness.VMError as e:
                self.futures[name] = Future()
                self.futures[name].set_exception(e)
                continue
            self.futures[name] = self.pool.submit(job.run)

    @staticmethod
    def _warm(chosen: dict[str, list[str]]) -> dict[str, str]:
        """What the chosen checks read from the host, made here (seconds, not minutes under TCG);
        returns the guests' environment for it."""
        env = {}
        if any("probes" in c or "memprobe" in c for c in chosen.values()):
            native = harness.portable_native_bin(REPO)
            if native is not None:
                env["TILEWISE_BIN_DIR"] = str(native)
        if any("bench" in c for c in chosen.values()):
            warm_tpch_cache()
        if any("up" in c or "tiles" in c or any(x.startswith("postgres") for x in c)
               for c in chosen.values()):  # SF 0.01: made here
            from tilewise.benchmarks.tpch import data as tpch_data

            tpch_data.ensure_data(0.01)
        if any(x.startswith("postgres") for c in chosen.values() for x in c):
            warm_postgres_load()
        return env

    def doc(self, name: str) -> dict:
        self.start()
        if self.broken:
            pytest.fail(f"the guests could not be prepared:\n{self.broken}", pytrace=False)
        if name not in self.futures:
            pytest.skip(f"guest {name} not selected (TILEWISE_VM_GUESTS)")
        try:
            r = self.futures[name].result()
        except harness.VMPathError as e:  # said before booting: one line, not a traceback per test
            pytest.fail(str(e), pytrace=False)
        self.times[name] = r
        assert r.returncode == 0, f"guest {name} exited {r.returncode}:\n{r.stderr[-3000:]}"
        doc = r.json()
        self.seconds[name] = doc.get("seconds", {})
        if os.environ.get("TILEWISE_VM_SAVE"):  # the raw facts, for a look after a failure
            save = Path(os.environ["TILEWISE_VM_SAVE"])
            save.mkdir(parents=True, exist_ok=True)
            (save / f"{name}.json").write_text(r.stdout)
        crashed = {k: v["crashed"] for k, v in doc["checks"].items() if isinstance(v, dict) and "crashed" in v}
        doc["crashed"] = crashed
        return doc

    def check(self, name: str, check: str) -> dict:
        doc = self.doc(name)
        assert check not in doc["crashed"], f"{name}/{check} crashed in the guest:\n{doc['crashed'][check]}"
        return doc["checks"][check]

    def wait(self) -> None:
        """Until every guest run has ended (whatever its outcome: the guests' tests report it)."""
        wait_for(list(self.futures.values()))

    def close(self) -> None:
        """End the session's guests: a run nobody waited for (-x, Ctrl-C, a deselected test) is
        cancelled, or killed when it is running."""
        if self.pool is None:
            return
        if not all(f.done() for f in self.futures.values()):
            harness.stop_all()
        self.pool.shutdown(wait=True, cancel_futures=True)


def of_session(config, slow: bool) -> Guests:
    """The pytest session's one Guests (made by the first caller: the collection's end, or the `guests`
    fixture of a session that did not see a guest test then); tests/vm/conftest.py reports its times."""
    g = getattr(config, "_tilewise_vm_guests", None)
    if g is None:
        g = config._tilewise_vm_guests = Guests(slow=slow)
    return g


def warm_tpch_cache() -> None:
    """Run the guest's benchmark once on the host (seconds here): TPC-H SF 0.01, its refresh sets and
    the reference answers of every data state land in the host's cache, which the guest reads through
    its read-only view instead of computing them under TCG (minutes)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        subprocess.run([str(PY), "-m", "tilewise", "bench", "tpch", *BENCH_ARGS, "--policies", "wim",
                        "--out", d, "--json"], capture_output=True, timeout=600, check=True)


def warm_postgres_load() -> None:
    """PostgreSQL's load of TPC-H SF 0.01, cached beside the data here (seconds; minutes under TCG):
    the guest's servers copy it. Nothing when PostgreSQL cannot run here (the guest's check then
    fails with its Error line, and the host test skips first)."""
    from tilewise import engines, plan, topology
    from tilewise.benchmarks.tpch import data as tpch_data
    from tilewise.engines.postgres import home, load

    if postgres_missing():
        return
    ds = tpch_data.dataset(0.01)
    if load.Template(ds, home.major()).ready() is None:
        p = plan.plan(topology.load(None), "wim")
        rt = engines.get("postgres").runtime_class()()
        rt.start(p, dataset=ds, memory_mb={i.id: 512 for i in p.instances})
        rt.stop()


def postgres_missing() -> str | None:
    """Why the guests cannot run PostgreSQL (they run as root: the servers need the `tilewise` user)."""
    from tilewise import engines
    from tilewise.engines.postgres import home

    why = engines.get("postgres").missing()
    if why:
        return why
    try:
        home.run_as(euid=0)
    except Exception as e:  # noqa: BLE001
        return str(e)
    return None
