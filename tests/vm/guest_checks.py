"""Runs inside a guest: many end-to-end checks in one boot, printed as one JSON document.

    .venv/bin/python tests/vm/guest_checks.py CHECK [CHECK...]

Each check gathers raw facts (what the kernel shows, what the real `tilewise` CLI printed, where
pages landed) and never asserts: the host-side tests (test_vm_guests.py) compare them with the
topology that was booted. A check that crashes records its traceback instead of losing the rest.
Independent CLI calls run two at a time (Python is 25-45x slower under TCG; the host has 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
TILEWISE = str(BIN / "tilewise")
PY = sys.executable
SYS = Path("/sys/devices/system")
POLICIES = ("wim", "win", "wicp", "wicp-mixed", "wic", "spread", "auto")
WORK = Path(tempfile.mkdtemp(prefix="tilewise-guest-"))
PARALLEL = 2


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> dict:
    t0 = time.monotonic()
    try:
        cp = subprocess.run([TILEWISE, *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
        rc, out, err = cp.returncode, cp.stdout, cp.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -9, e.stdout or "", f"timed out after {timeout} s"
    return _result(args, rc, out, err, t0)


def cli_here(*args: str) -> dict:
    """The real CLI (`tilewise.cli.main`) called in this process, for commands that only read the machine
    (topo, plan): a new interpreter per call costs seconds under TCG, which adds up over a dozen calls.
    Same result shape as cli(); a traceback is recorded as a crash (exit 1) like the subprocess would."""
    import contextlib
    import io

    from tilewise.cli import main as tilewise_main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            tilewise_main(list(args))
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:
            err.write(traceback.format_exc())
            rc = 1
    return _result(args, rc, out.getvalue(), err.getvalue(), t0)


def _result(args, rc: int, out: str, err: str, t0: float) -> dict:
    doc = None
    if out.lstrip().startswith(("{", "[")):
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            doc = None
    return {"args": list(args), "rc": rc, "stdout": out if doc is None else "", "stderr": err, "json": doc,
            "seconds": round(time.monotonic() - t0, 2)}


def pmap(fn, items):
    with ThreadPoolExecutor(PARALLEL) as ex:
        return list(ex.map(fn, items))


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


# ---- checks ------------------------------------------------------------------------------------

def check_sysfs() -> dict:
    nodes = {}
    for nd in sorted(SYS.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:])):
        mem = re.search(r"MemTotal:\s+(\d+) kB", _read(nd / "meminfo"))
        nodes[nd.name[4:]] = {"cpulist": _read(nd / "cpulist"), "distance": _read(nd / "distance"),
                              "mem_kb": int(mem.group(1)) if mem else None}
    cpus = {}
    for cd in sorted(SYS.glob("cpu/cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        l3 = ""
        for idx in sorted(cd.glob("cache/index*")):
            if _read(idx / "level") == "3":
                l3 = _read(idx / "shared_cpu_list")
        cpus[cd.name[3:]] = {"package": _read(cd / "topology/physical_package_id"), "die": _read(cd / "topology/die_id"),
                             "siblings": _read(cd / "topology/thread_siblings_list"), "l3": l3}
    mounts = [ln.split(" - ")[1].split()[0] + " " + ln.split()[4] for ln in _read(Path("/proc/self/mountinfo")).splitlines()
              if " - cgroup" in ln]
    import tilewise

    return {"kernel": os.uname().release, "tilewise": tilewise.__file__, "nodes": nodes, "cpus": cpus, "cgroup_mounts": mounts,
            "weighted_interleave_sysfs": os.path.isdir("/sys/kernel/mm/mempolicy/weighted_interleave")}


def check_topo() -> dict:
    mine = WORK / "tilewise.xml"
    theirs = WORK / "lstopo.xml"
    again = WORK / "lstopo-again.xml"
    out: dict = {}
    out["json"] = cli("topo", "--json", "--export", str(mine))  # one real process; the rest in this one
    out["text"] = cli_here("topo")
    # real hwloc on this kernel, loaded by tilewise; and our export re-read by real hwloc
    hw = subprocess.run(["lstopo-no-graphics", "--no-io", "--of", "xml", "-f", str(theirs)], capture_output=True, text=True)
    out["lstopo_rc"] = hw.returncode
    out["lstopo_err"] = hw.stderr[-2000:]
    out["from_lstopo"] = cli_here("topo", "--topology", str(theirs), "--json")
    hw2 = subprocess.run(["lstopo-no-graphics", "--input", str(mine), "--of", "xml", "-f", str(again)],
                         capture_output=True, text=True)
    out["lstopo_reads_export_rc"] = hw2.returncode
    out["lstopo_reads_export_err"] = hw2.stderr[-2000:]
    out["export_via_lstopo"] = cli_here("topo", "--topology", str(again), "--json") if hw2.returncode == 0 else None
    tree = subprocess.run(["lstopo-no-graphics", "--no-io", "-p"], capture_output=True, text=True)
    out["lstopo_tree"] = tree.stdout[-4000:]
    return out


def check_plan() -> dict:
    calls = [(p, ["plan", "--policy", p, "--json"]) for p in POLICIES]
    calls += [("n2", ["plan", "--policy", "n", "--instances", "2", "--json"]),
              ("wic-smt", ["plan", "--policy", "wic", "--smt", "--json"]),
              ("wicp-text", ["plan", "--policy", "wicp"])]
    return {name: cli_here(*args) for name, args in calls}  # one after another: main() installs signal handlers


def _cpu_nodes() -> list[int]:
    return [int(nd.name[4:]) for nd in sorted(SYS.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:]))
            if _read(nd / "cpulist")]


def _cpuless_nodes() -> list[int]:
    return [int(nd.name[4:]) for nd in sorted(SYS.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:]))
            if not _read(nd / "cpulist")]


def touch(name: str, args: list[str], mib: int = 16) -> dict:
    res_path = WORK / f"touch-{name}.json"
    r = cli("exec", *args, "--json", "--", PY, str(HERE / "touch_pages.py"), str(res_path), str(mib))
    r["touch"] = json.loads(res_path.read_text()) if res_path.exists() else None
    return r


def exec_cases() -> list[tuple[str, list[str]]]:
    """(name, exec args) for this machine: nodes other than 0 wherever the guest has them."""
    cpu_nodes = _cpu_nodes()
    cases: list[tuple[str, list[str]]] = [("wim-default", ["--policy", "wim"])]
    last = len(cpu_nodes) - 1  # the win instance of the last node with CPUs (not node 0 when there are several)
    for mem in ("membind", "preferred", "local"):
        cases.append((f"win-last-{mem}", ["--policy", "win", "--instance", str(last), "--mem", mem]))
    cases.append(("wim-interleave", ["--policy", "wim", "--mem", "interleave"]))
    if len(cpu_nodes) >= 3:
        named = f"{cpu_nodes[1]},{cpu_nodes[-1]}"
        cases.append(("interleave-named", ["--policy", "wim", "--mem", "interleave", "--mem-nodes", named]))
    for n in _cpuless_nodes():
        cases.append((f"cpuless{n}-membind", ["--policy", "wim", "--mem", "membind", "--mem-nodes", str(n)]))
        cases.append((f"cpuless{n}-preferred", ["--policy", "wim", "--mem", "preferred", "--mem-nodes", str(n)]))
        cases.append((f"cpuless{n}-interleave", ["--policy", "wim", "--mem", "interleave", "--mem-nodes", f"{cpu_nodes[0]},{n}"]))
        cases.append((f"cpuless{n}-weighted", ["--policy", "wim", "--mem", "weighted-interleave", "--mem-nodes", f"{cpu_nodes[0]},{n}"]))
    return cases


def check_exec() -> dict:
    cases = exec_cases()
    results = pmap(lambda c: touch(c[0], c[1]), cases)
    return {name: r for (name, _), r in zip(cases, results)}


def check_bench() -> dict:
    """`bench tpch` under wim, win and wicp: the queries the host test names (TILEWISE_GUEST_BENCH_QUERIES)."""
    out = WORK / "bench"
    queries = os.environ.get("TILEWISE_GUEST_BENCH_QUERIES", "1-22")
    r = cli("bench", "tpch", "--sf", "0.01", "--policies", "wim,win,wicp", "--queries", queries, "--runs", "1",
            "--no-warmup", "--no-plots", "--tests", "power", "--out", str(out), "--json", timeout=1500)
    files = sorted(p.name for p in out.glob("*")) if out.exists() else []
    r["files"] = files
    r["leftover_processes"] = _tilewise_children()
    return r


UP_NAME = "vm"


def check_up() -> dict:
    """`up --engine duckdb --policy win --sf 0.01` (data prepared on the host), `status`, a query on
    the first and the last server, `down`; around them what /proc shows of each server (CPUs,
    allowed and bound nodes, where its anonymous pages are) and which processes carry the cluster's
    token before and after `down`."""
    out: dict = {}
    out["up"] = cli("up", "--engine", "duckdb", "--policy", "win", "--sf", "0.01", "--name", UP_NAME,
                    "--worker-memory", "256m", "--json", timeout=900)
    state_file = Path(os.environ.get("TILEWISE_CLUSTER_DIR", "/nonexistent")) / f"{UP_NAME}.json"
    token = None
    try:
        token = json.loads(state_file.read_text())["token"] if state_file.exists() else None
        out["token_recorded"] = token is not None
        out["status"] = cli("status", "--name", UP_NAME, "--json", timeout=300)
        members = (out["status"]["json"] or {}).get("members") or []
        out["proc"] = {str(m["pid"]): _proc_binding(m["pid"]) for m in members}
        out["tagged_before"] = _carrying(token)
        # the SQL comes from the host test, which computes its answer from the same Parquet files; asked
        # of the first and the last server (node 0 and the farthest node: each CLI call costs seconds here)
        sql = os.environ.get("TILEWISE_GUEST_UP_SQL", "SELECT count(*) AS n FROM lineitem")
        instances = sorted(m["instance"] for m in members if m.get("instance") is not None)
        asked = sorted({instances[0], instances[-1]}) if instances else []
        out["queries"] = dict(zip(map(str, asked), pmap(
            lambda i: cli("query", "--name", UP_NAME, "--instance", str(i), "--json", sql, timeout=300), asked)))
        out["down"] = cli("down", "--name", UP_NAME, "--json", timeout=300)
        out["tagged_after"] = _carrying(token)
        out["state_file_after"] = state_file.exists()
        out["cluster_dir_after"] = sorted(p.name for p in state_file.parent.iterdir()) if state_file.parent.is_dir() else []
    finally:  # whatever went wrong, the later checks get a machine without servers
        left = _carrying(token)
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        out["killed_after_check"] = left
    return out


TILES_NAME = "tlvm"
# the tiles engine's shared memory, memfds named by the pid of the process that reads them: the
# rings of the control messages (native/tiles/src/shm.rs) and the arenas the batches are written
# into (native/tiles/src/exchange.rs)
RING = re.compile(r"memfd:tilewise-tiles-(ring|arena)-r(\d+)")


def _rings(pid: int) -> list[dict]:
    """The shared memory a process maps (each mapping): ring or arena, whose pid reads it, the
    mapping's memory policy as numa_maps shows it, and its pages per node."""
    out = []
    for ln in _read(Path(f"/proc/{pid}/numa_maps")).splitlines():
        m = RING.search(ln)
        if not m:
            continue
        parts = ln.split()
        pages = {x.group(1): int(x.group(2)) for x in (re.fullmatch(r"N(\d+)=(\d+)", y) for y in parts) if x}
        out.append({"kind": m.group(1), "reader": int(m.group(2)), "policy": parts[1], "pages": pages})
    return out


def check_tiles() -> dict:
    """`up --engine tiles --policy win --exchange shm --sf 0.01`: a worker per node with CPUs and the
    coordinator; a query through the coordinator (TILEWISE_GUEST_UP_SQL: a join and a group-by, so
    rows cross the tiles' exchange); then what /proc shows of each process -- its CPUs, its memory
    policies and every ring it maps (policy, pages per node) --; `down`; what is left."""
    out: dict = {}
    out["up"] = cli("up", "--engine", "tiles", "--policy", "win", "--exchange", "shm", "--sf", "0.01", "--name",
                    TILES_NAME, "--json", timeout=900)
    state_file = Path(os.environ.get("TILEWISE_CLUSTER_DIR", "/nonexistent")) / f"{TILES_NAME}.json"
    token = None
    try:
        token = json.loads(state_file.read_text())["token"] if state_file.exists() else None
        sql = os.environ.get("TILEWISE_GUEST_UP_SQL", "SELECT count(*) AS n FROM lineitem")
        out["query"] = cli("query", "--name", TILES_NAME, "--json", sql, timeout=600)
        members = (out["up"]["json"] or {}).get("members") or []  # `up` prints the status (a CLI call costs seconds here)
        out["proc"] = {str(m["pid"]): {**_proc_binding(m["pid"]), "rings": _rings(m["pid"])} for m in members}
        out["tagged_before"] = _carrying(token)
        out["down"] = cli("down", "--name", TILES_NAME, "--json", timeout=300)
        out["tagged_after"] = _carrying(token)
        out["state_file_after"] = state_file.exists()
    finally:  # whatever went wrong, the later checks get a machine without workers
        left = _carrying(token)
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        out["killed_after_check"] = left
    return out


PG_NAME = "pgvm"
PG_SQL = "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem"


def check_postgres() -> dict:
    """`up --engine postgres --policy win --sf 0.01` (the load cached on the host: each server copies
    it; its output is `status`'s document); per server, a backend of our own (a connection kept open while we look: its
    /proc) after it scanned lineitem, and the parallel workers of a query forced parallel; `down`;
    then what is left: processes carrying the token, System V segments, /dev/shm files, data dirs."""
    out: dict = {}
    dirs_before = {p.name for p in Path("/var/tmp").glob("tilewise-postgres-*")}  # the host's, seen through
    out["up"] = cli("up", "--engine", "postgres", "--policy", "win", "--sf", "0.01", "--name", PG_NAME,
                    "--worker-memory", "256m", "--json", timeout=900)
    state_file = Path(os.environ.get("TILEWISE_CLUSTER_DIR", "/nonexistent")) / f"{PG_NAME}.json"
    token = None
    try:
        token = json.loads(state_file.read_text())["token"] if state_file.exists() else None
        members = ((out["up"]["json"] or {}).get("members")) or []
        out["servers"] = {str(m["instance"]): _pg_server(m) for m in members}
        out["down"] = cli("down", "--name", PG_NAME, "--json", timeout=300)
        out["tagged_after"] = _carrying(token)
        out["sysv_after"] = _read(Path("/proc/sysvipc/shm")).splitlines()[1:]
        out["dev_shm_after"] = sorted(p.name for p in Path("/dev/shm").glob("PostgreSQL.*"))
        out["dirs_after"] = sorted({p.name for p in Path("/var/tmp").glob("tilewise-postgres-*")} - dirs_before)
    finally:
        left = _carrying(token)
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        out["killed_after_check"] = left
    return out


def _pg_server(m: dict) -> dict:
    """One server, seen from /proc while a backend of ours works: the postmaster and its processes,
    the backend after a scan of lineitem, the workers of a parallel query."""
    import threading

    import psycopg

    out: dict = {"pid": m["pid"], "cpus": m["cpus"], "mem_nodes": m["mem_nodes"]}
    with psycopg.connect(host=m["socket_dir"], port=m["port"], user="tilewise", dbname="tilewise",
                         autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        out["answer"] = [list(map(str, r)) for r in conn.execute(PG_SQL).fetchall()]
        out["backend"] = {"pid": backend, **_proc_binding(backend, shared=True)}
        out["postmaster"] = _proc_binding(m["pid"], shared=True)
        out["children"] = {str(p): _proc_binding(p) for p in _children(m["pid"]) if p != backend}
        for stmt in ("SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0", "SET min_parallel_table_scan_size = 0",
                     "SET max_parallel_workers_per_gather = 2"):
            conn.execute(stmt)
        workers: dict[str, dict] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for p in _children(m["pid"]):
                    if "parallel worker" in _read(Path(f"/proc/{p}/cmdline")) and str(p) not in workers:
                        b = _proc_binding(p)
                        if b["Cpus_allowed_list"]:
                            workers[str(p)] = b
                time.sleep(0.05)

        th = threading.Thread(target=sample)
        th.start()
        try:
            conn.execute("SELECT count(*) FROM orders WHERE pg_sleep(0.0002) IS NOT NULL").fetchall()
        finally:
            done.set()
            th.join()
        out["parallel_workers"] = workers
    return out


def _proc_binding(pid: int, shared: bool = False) -> dict:
    """What the kernel shows of a process: allowed CPUs and nodes, the memory policies in numa_maps
    and its anonymous pages per node (file pages may be cached wherever another process read them)."""
    status = _read(Path(f"/proc/{pid}/status"))
    fields = dict(ln.split(":\t", 1) for ln in status.splitlines() if ":\t" in ln)
    policies: dict[str, int] = {}
    anon: dict[str, int] = {}
    for ln in _read(Path(f"/proc/{pid}/numa_maps")).splitlines():
        parts = ln.split()
        if len(parts) < 2:
            continue
        policies[parts[1]] = policies.get(parts[1], 0) + 1
        # shared: also anonymous shared memory (PostgreSQL's shared buffers: /dev/zero, SYSV, /dev/shm)
        files = [x for x in parts if x.startswith("file=")]
        if files and not (shared and files[0].startswith(("file=/dev/zero", "file=/SYSV", "file=/dev/shm/"))):
            continue
        for x in parts:
            m = re.fullmatch(r"N(\d+)=(\d+)", x)
            if m:
                anon[m.group(1)] = anon.get(m.group(1), 0) + int(m.group(2))
    return {"Cpus_allowed_list": fields.get("Cpus_allowed_list", "").strip(),
            "Mems_allowed_list": fields.get("Mems_allowed_list", "").strip(),
            "numa_maps_policies": policies, "anon_pages": anon}


def _carrying(token: str | None) -> list[str]:
    """Live processes whose environment holds the cluster's token. Read here rather than through
    tilewise.procs.carrying on purpose: the check is a second witness of what `down` says it stopped."""
    if not token:
        return []
    needle = f"TILEWISE_CLUSTER_TOKEN={token}".encode()
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            env = (p / "environ").read_bytes()
        except OSError:
            continue
        state = _read(p / "stat").rsplit(")", 1)[-1].split()[:1]
        if needle in env.split(b"\0") and state != ["Z"]:
            out.append(p.name)
    return sorted(out, key=int)


def _end_target(target: subprocess.Popen, flag: Path) -> None:
    """Removing the flag file ends a spinning target; one that does not end in 30 s is killed."""
    flag.unlink(missing_ok=True)
    try:
        target.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(target.pid, signal.SIGKILL)
        target.wait()


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        stat = _read(Path(f"/proc/{pid}/stat"))
        if not stat:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _tilewise_children() -> list[str]:
    """Processes other than this script and its ancestors that run tilewise code (left behind?)."""
    mine = _ancestors()
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        if int(p.name) in mine:
            continue
        cmd = _read(p / "cmdline").replace("\0", " ")
        if ("tilewise" in cmd or "duckdb_worker" in cmd) and "guest_checks.py" not in cmd:
            out.append(f"{p.name}: {cmd[:200]}")
    return out


BURNER = r"""
import os, sys, time
n = int(sys.argv[1]); flag = sys.argv[2]
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        buf = bytearray(8 << 20)  # resident pages, placed by the memory policy we were started with
        for i in range(0, len(buf), 4096):
            buf[i] = 1
        while os.path.exists(flag):
            pass
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
for k in kids:
    os.waitpid(k, 0)
"""


def elastic_run(mode: str, *, mem_node: int | None, enforce: str = "affinity", busy: int = 3,
                duration: float = 4.0) -> dict:
    """A target of `busy` spinning processes (memory bound to mem_node), elastic on it, restored after."""
    flag = WORK / f"burn-{mode}-{enforce}"
    flag.touch()
    argv = [PY, "-c", BURNER, str(busy), str(flag)]
    if mem_node is not None:  # where the target's pages live (adaptive follows them)
        argv = [TILEWISE, "exec", "--policy", "wim", "--mem", "membind", "--mem-nodes", str(mem_node), "--", *argv]
    target = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    res: dict = {"mode": mode, "enforce": enforce, "mem_node": mem_node}
    try:
        ready = target.stdout.readline().strip()
        res["target_ready"] = ready
        pid = _burner_pid(target.pid)
        res["before"] = sorted(os.sched_getaffinity(pid))
        res["cgroup_before"] = _read(Path(f"/proc/{pid}/cgroup"))
        log = WORK / f"elastic-{mode}-{enforce}.jsonl"
        pages = ["--pages-interval", "0.3"] if mode == "adaptive" else []  # only adaptive reads pages
        r = cli("elastic", "--pid", str(pid), "--mode", mode, "--interval", "0.3", "--duration", str(duration),
                "--enforce", enforce, *pages, "--log", str(log), "--json", timeout=240)
        res["cli"] = r
        res["log"] = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        res["after"] = sorted(os.sched_getaffinity(pid))
        res["after_children"] = {c: sorted(os.sched_getaffinity(c)) for c in _children(pid)}
        res["cgroup_after"] = _read(Path(f"/proc/{pid}/cgroup"))
    finally:
        _end_target(target, flag)
    return res


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        stat = _read(p / "stat")
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(p.name))
    return out


def _burner_pid(pid: int) -> int:
    """The Python burner itself: the exec'd child when tilewise exec started it."""
    kids = [c for c in _children(pid) if "python" in _read(Path(f"/proc/{c}/cmdline"))]
    cmd = _read(Path(f"/proc/{pid}/cmdline"))
    if "exec" in cmd.split("\0")[:3] or "tilewise" in cmd.split("\0")[0]:
        return kids[0] if kids else pid
    return pid


def check_elastic() -> dict:
    cpu_nodes = _cpu_nodes()
    far = cpu_nodes[-1]
    runs = {"dense": elastic_run("dense", mem_node=None), "sparse": elastic_run("sparse", mem_node=None),
            "adaptive": elastic_run("adaptive", mem_node=far)}
    return runs


def _cgroup_state() -> dict:
    root = Path("/sys/fs/cgroup")
    return {"subtree_control": _read(root / "cgroup.subtree_control"),
            "groups": sorted(str(d.relative_to(root)) for d in root.rglob("*") if d.is_dir())}


def check_cgroup() -> dict:
    """Elastic on a cgroup2-only machine: --enforce auto, then --enforce cgroup (a cpuset group of
    its own), each granting cores and restoring everything (groups, controllers, affinity)."""
    out = {"mounts": check_sysfs()["cgroup_mounts"]}
    for enforce in ("auto", "cgroup"):
        before = _cgroup_state()
        run = elastic_run("sparse", mem_node=None, enforce=enforce, busy=2, duration=4.0)
        run["cgroups_before"], run["cgroups_after"] = before, _cgroup_state()
        out[enforce] = run
    return out


def check_cgroup_inplace() -> dict:
    """cgroup v2 as systemd sets it up: the target alone in a service group, cpuset enabled above it.
    elastic constrains that group in place (its own cpuset.cpus; moving the process out would drop
    the group's limits); a second daemon on the same pid refuses; SIGTERM restores; after kill -9
    the group stays constrained until `tilewise restore` puts it back."""
    root = Path("/sys/fs/cgroup")
    slice_ = root / "system.slice"
    svc = slice_ / "db.service"
    (root / "cgroup.subtree_control").write_text("+cpuset")
    slice_.mkdir(exist_ok=True)
    (slice_ / "cgroup.subtree_control").write_text("+cpuset")
    svc.mkdir(exist_ok=True)
    flag = WORK / "burn-inplace"
    flag.touch()
    target = subprocess.Popen([PY, "-c", BURNER, "1", str(flag)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    out: dict = {}
    try:
        out["target_ready"] = target.stdout.readline().strip()
        pid = target.pid
        for p in [pid, *_children(pid)]:
            (svc / "cgroup.procs").write_text(str(p))

        def state() -> dict:
            return {"cpus": _read(svc / "cpuset.cpus"), "affinity": sorted(os.sched_getaffinity(pid)),
                    "cgroup": _read(Path(f"/proc/{pid}/cgroup"))}

        def daemon(name: str) -> tuple[subprocess.Popen, Path]:
            log = WORK / f"inplace-{name}.jsonl"
            d = subprocess.Popen([TILEWISE, "elastic", "--pid", str(pid), "--interval", "0.3", "--duration", "120",
                                  "--log", str(log), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and d.poll() is None:
                if log.exists() and len(log.read_text().splitlines()) >= 3:  # header, start, a tick
                    break
                time.sleep(0.2)
            return d, log

        out["before"] = state()
        d, _ = daemon("term")
        out["during"] = state()
        out["second"] = cli("elastic", "--pid", str(pid), "--duration", "2", "--json", timeout=240)
        d.send_signal(signal.SIGTERM)
        so, se = d.communicate(timeout=240)
        out["first"] = {"rc": d.returncode, "json": json.loads(so) if so.strip().startswith("{") else None,
                        "stderr": se[-2000:]}
        out["after_term"] = state()
        d, _ = daemon("kill")
        out["during_kill"] = state()
        d.kill()
        d.communicate(timeout=60)
        out["after_kill"] = state()
        out["restore"] = cli("restore", "--json", timeout=240)
        out["after_restore"] = state()
    finally:
        _end_target(target, flag)
    return out


def _as_nobody() -> tuple[list[str], dict]:
    """argv prefix and environment that run tilewise as nobody (uid 65534) with a private HOME: the
    guest's interpreter when nobody can start it (and it can start itself again), else the
    system's of the same version with the shared site-packages (a venv whose base interpreter sits
    under root's 0700 home cannot be started by nobody)."""
    import sysconfig

    home = WORK / "nobody"
    home.mkdir(exist_ok=True)
    os.chown(home, 65534, 65534)
    os.chmod(WORK, 0o755)  # nobody reaches its HOME (and the flag files its targets watch)
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    src = str(HERE.parents[1] / "src")
    check = "import subprocess, sys; subprocess.run([sys.executable, '-s', '-c', 'import tilewise.cli'], check=True)"
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for py, path in ((PY, src), (f"/usr/bin/{ver}", f"{src}:{sysconfig.get_paths()['purelib']}")):
        env = {"HOME": str(home), "PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": path, "NO_COLOR": "1",
               "TILEWISE_STATE_DIR": str(home / "state")}
        if subprocess.run([*prefix, py, "-s", "-c", check], env=env, capture_output=True, timeout=300).returncode == 0:
            return [*prefix, py, "-s", "-m", "tilewise"], env
    raise RuntimeError("nobody can run no Python with tilewise here")


def check_cgroup_delegated() -> dict:
    """cgroup v2 delegation, as systemd's Delegate=yes leaves a user's scope: the scope's directory,
    cgroup.procs, cgroup.threads and cgroup.subtree_control are nobody's, its cpuset.cpus stays
    root's (the parent's resource control). As nobody: a child group `db` of the scope (made by
    nobody, +cpuset handed down by nobody) holds the target; elastic --cgroup on the scope itself is
    refused in one line (its cpuset.cpus is not nobody's); on `db` it runs and restores."""
    root = Path("/sys/fs/cgroup")
    slice_, scope = root / "user.slice", root / "user.slice" / "u.scope"
    (root / "cgroup.subtree_control").write_text("+cpuset")
    slice_.mkdir(exist_ok=True)
    (slice_ / "cgroup.subtree_control").write_text("+cpuset")
    scope.mkdir(exist_ok=True)
    for f in (scope, scope / "cgroup.procs", scope / "cgroup.threads", scope / "cgroup.subtree_control"):
        os.chown(f, 65534, 65534)
    argv, env = _as_nobody()
    setpriv = argv[:5]
    db = scope / "db"
    out: dict = {"mkdir": subprocess.run([*setpriv, "sh", "-c", f"mkdir {db} && echo +cpuset > {scope}/cgroup.subtree_control"],
                                         capture_output=True, text=True).stderr}
    flag = WORK / "burn-delegated"
    flag.touch()
    target = subprocess.Popen([*setpriv, argv[5], "-c", BURNER, "1", str(flag)],
                              stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out["target_ready"] = target.stdout.readline().strip()
        for p in [target.pid, *_children(target.pid)]:
            (db / "cgroup.procs").write_text(str(p))  # as systemd-run --user --scope would place it

        def state() -> dict:
            return {"cpus": _read(db / "cpuset.cpus"), "affinity": sorted(os.sched_getaffinity(target.pid)),
                    "cgroup": _read(Path(f"/proc/{target.pid}/cgroup")),
                    "owners": {"db": (db / "cpuset.cpus").stat().st_uid, "scope": (scope / "cpuset.cpus").stat().st_uid}}

        def cli_as_nobody(*args: str) -> dict:
            t0 = time.monotonic()
            cp = subprocess.run([*argv, *args], capture_output=True, text=True, env=env, timeout=600)
            return _result(args, cp.returncode, cp.stdout, cp.stderr, t0)

        out["before"] = state()
        out["scope"] = cli_as_nobody("elastic", "--cgroup", str(scope), "--duration", "3", "--json")
        out["db"] = cli_as_nobody("elastic", "--cgroup", str(db), "--mode", "sparse", "--interval", "0.3",
                                  "--duration", "4", "--json")
        out["after"] = state()
        out["journals"] = sorted(str(p) for p in (WORK / "nobody" / "state").rglob("journals/*.json"))
    finally:
        _end_target(target, flag)
    return out


def check_probes() -> dict:
    """Core-to-core latency over a few CPUs (TILEWISE_GUEST_PROBE_CPUS): the grouping is checked,
    not the values (meaningless under TCG)."""
    out = WORK / "probe"
    cpus = os.environ.get("TILEWISE_GUEST_PROBE_CPUS")
    return cli("probe", "latency", "--full", "--samples", "3", "--iters", "20", "--modes", "cas", "--out", str(out),
               *(["--cpus", cpus] if cpus else []), "--json", timeout=600)


def check_hmat() -> dict:
    """The firmware figures and memory tiers as the kernel shows them (raw files), as tilewise reads
    them (topology.firmware), and as real hwloc reads them (lstopo --memattrs)."""
    raw: dict = {}
    for nd in sorted(SYS.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:])):
        for acc in sorted(nd.glob("access*")):
            d = acc / "initiators"
            raw[f"{nd.name}/{acc.name}"] = {
                "initiators": sorted(x.name for x in d.glob("node*")),
                **{f: _read(d / f) for f in ("read_latency", "write_latency", "read_bandwidth", "write_bandwidth")}}
    tiers = {t.name: _read(t / "nodelist") for t in Path("/sys/devices/virtual/memory_tiering").glob("memory_tier*")}
    from tilewise.topology import firmware

    mem = subprocess.run(["lstopo-no-graphics", "--memattrs"], capture_output=True, text=True)
    return {"raw": raw, "tiers": tiers, "tilewise": firmware.read().to_json(), "lstopo_memattrs": mem.stdout,
            "lstopo_rc": mem.returncode}


def check_memprobe() -> dict:
    """`probe memory` over every initiator x target (values are the emulator's: only coverage and
    placement are checked); and tw_memory told to put its buffer elsewhere than its target (a test
    hook) must refuse the cell after its page check."""
    out: dict = {}
    out["matrix"] = cli("probe", "memory", "--size", "64MiB", "--reps", "2", "--min-ms", "2", "--tests",
                        "latency,read_seq,write_nt", "--json", "--out", str(WORK / "memory"), timeout=900)
    tool = os.environ.get("TILEWISE_BIN_DIR") or str(HERE.parents[1] / "src" / "tilewise" / "_bin")
    nodes = sorted(int(p.name[4:]) for p in SYS.glob("node/node[0-9]*"))
    cp = subprocess.run([str(Path(tool) / "tw_memory"), "--target", str(nodes[-1]), "--misplace", str(nodes[0]),
                         "--size", str(8 << 20), "--tests", "latency", "--reps", "2", "--min-ms", "1"],
                        capture_output=True, text=True, timeout=300)
    out["misplaced"] = {"rc": cp.returncode, "stdout": cp.stdout, "stderr": cp.stderr[-2000:],
                        "target": nodes[-1], "bound": nodes[0]}
    return out


def _free_mib(node: int) -> int:
    m = re.search(r"MemFree:\s+(\d+) kB", _read(SYS / f"node/node{node}/meminfo"))
    return int(m.group(1)) // 1024 if m else 0


def check_tiers() -> dict:
    """Placement by tier on the last node with CPUs: plans (near-then-far, weighted interleave with auto
    weights from the firmware's figures), then `exec --mem near-then-far` touching more than its near
    node has free: the rest must land on its far node; `--mem weighted-interleave --weights auto`
    refused in one line by a kernel before 6.9 (before any weight is written)."""
    out: dict = {}
    last = len(_cpu_nodes()) - 1
    out["plan_ntf"] = cli_here("plan", "--policy", "win", "--mem", "near-then-far", "--json")
    out["plan_weighted"] = cli_here("plan", "--policy", "win", "--mem", "weighted-interleave", "--weights", "auto", "--json")
    far = next((i["far_nodes"] for i in (out["plan_ntf"]["json"] or {}).get("instances", []) if i["id"] == last), [])
    near = _cpu_nodes()[last]
    out["near"], out["far"] = near, far
    out["free_before_mib"] = {n: _free_mib(n) for n in [near, *far]}
    mib = out["free_before_mib"][near] + (min(48, out["free_before_mib"][far[0]] // 2) if far else 0)
    out["touched_mib"] = mib
    out["exec_ntf"] = touch("ntf", ["--policy", "win", "--instance", str(last), "--mem", "near-then-far"], mib)
    out["exec_weighted"] = cli("exec", "--policy", "win", "--instance", str(last), "--mem", "weighted-interleave",
                               "--weights", "auto", "--", "true")
    wdir = Path("/sys/kernel/mm/mempolicy/weighted_interleave")
    out["weights_after"] = {p.name: _read(p) for p in wdir.glob("node*")} if wdir.is_dir() else None
    # the far-memory study of a workload in that tile: near, far and interleaved memory, bound as said
    out["study"] = cli("workload", "W2", "--mem-variants", "near,far,interleave", "--records", "100000", "--runs", "2",
                       "--warmup", "0", "--policy", "win", "--instance", str(last), "--json")
    return out


def check_pytest() -> dict:
    """The host suite's tests that read the machine they run on (argv after --pytest)."""
    args = json.loads(os.environ.get("TILEWISE_GUEST_PYTEST", "[]"))
    t0 = time.monotonic()
    cp = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], capture_output=True, text=True,
                        timeout=1800, cwd=str(HERE.parents[1]))
    return {"rc": cp.returncode, "tail": (cp.stdout + cp.stderr)[-6000:], "seconds": round(time.monotonic() - t0, 1)}


def check_postgres_elastic() -> dict:
    """elastic --mode adaptive on a PostgreSQL server that may run on every CPU but whose memory is
    bound to the last node with CPUs (shared buffers, backends): the cores it grants are on that
    node (adaptive's pages per node are summed over the postmaster's tree, shared memory once), the
    backends born during the run are in the tree, and everything is restored. On a cgroup2-only
    guest the cpuset is v2 (--enforce cgroup), elsewhere sched_setaffinity. The server is the
    engine's own runtime on TPC-H SF 0.01, whose load the host cached (test_vm_guests.warm_postgres_load:
    the server copies it); its load is CPU in three backends, started once the daemon runs (a
    five-way join of a small table, 10 s each)."""
    import threading

    from tilewise import engines, plan, topology
    from tilewise.benchmarks.tpch import data as tpch_data
    from tilewise.elastic import session
    from tilewise.elastic.metrics import ProcFS

    why = engines.missing("postgres")
    if why:
        return {"skipped": why}
    far = _cpu_nodes()[-1]
    v2_only = "cgroup2 /sys/fs/cgroup" in check_sysfs()["cgroup_mounts"]
    enforce = "cgroup" if v2_only else "affinity"
    res: dict = {"mem_node": far, "enforce": enforce, "tilewise": tilewise_file()}
    t = topology.load(None)
    rt = engines.get("postgres").runtime_class()()
    t0 = time.monotonic()
    try:
        p = plan.plan(t, "wim", mem="membind", mem_nodes=(far,))
        rt.start(p, dataset=tpch_data.dataset(0.01), memory_mb={i.id: 256 for i in p.instances})
        res["load_info"] = rt.info(0)
        res["start_s"] = round(time.monotonic() - t0, 1)
        pid = rt.status()[0].pid
        res["before"] = sorted(os.sched_getaffinity(pid))
        outcomes: list[str] = []

        def load() -> None:  # CPU in a backend (a join of five small tables, nothing materialised) for 10 s
            t1 = time.monotonic()
            try:
                rt.run_query("SELECT count(*) FROM nation a, nation b, nation c, nation d, nation e "
                             "WHERE a.n_nationkey + b.n_nationkey + c.n_nationkey + d.n_nationkey >= e.n_regionkey",
                             timeout_s=10)
                outcomes.append(f"finished in {time.monotonic() - t1:.1f} s")
            except Exception as e:  # noqa: BLE001 - the timeout is expected
                outcomes.append(f"{time.monotonic() - t1:.1f} s: {e}")

        clients = [threading.Thread(target=load) for _ in range(3)]

        class Start(session.Reporter):  # the load step comes once the daemon runs (its start takes seconds here)
            def record(self, rec: dict) -> None:
                if rec.get("event") == "start":
                    res["processes_at_start"] = 1 + len(_descendants(pid))
                    for c in clients:
                        c.start()

        log = WORK / "postgres-elastic.jsonl"
        try:
            cfg = session.Config(pid=pid, mode="adaptive", interval=0.3, duration=8, pages_interval=0.3,
                                 enforce=enforce, log=str(log))
            res["summary"] = session.run(cfg, Start())
        except Exception as e:  # noqa: BLE001 - the facts say what failed
            res["error"] = f"{type(e).__name__}: {e}"
        finally:
            for c in clients:
                if c.ident is not None:  # started
                    c.join()
        res["load"] = outcomes
        res["log"] = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        tree = [pid, *_descendants(pid)]
        res["tree_pages"] = {str(k): v for k, v in ProcFS().tree_pages(tree).items()}
        res["after"] = sorted(os.sched_getaffinity(pid))
        res["after_tree"] = {p: sorted(os.sched_getaffinity(p)) for p in tree if Path(f"/proc/{p}").exists()}
        res["cgroup_after"] = _read(Path(f"/proc/{pid}/cgroup"))
    finally:
        rt.stop()
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def tilewise_file() -> str:
    import tilewise

    return tilewise.__file__


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


CHECKS = {"sysfs": check_sysfs, "topo": check_topo, "plan": check_plan, "exec": check_exec, "bench": check_bench,
          "elastic": check_elastic, "up": check_up, "cgroup": check_cgroup, "cgroup_inplace": check_cgroup_inplace,
          "probes": check_probes, "pytest": check_pytest, "hmat": check_hmat, "memprobe": check_memprobe,
          "tiers": check_tiers, "cgroup_delegated": check_cgroup_delegated, "postgres": check_postgres,
          "postgres_elastic": check_postgres_elastic, "tiles": check_tiles}


def main(argv: list[str]) -> int:
    names = argv or ["sysfs", "topo", "plan", "exec"]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown checks {unknown}; known: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    doc: dict = {"checks": {}, "seconds": {}}
    for n in names:
        t0 = time.monotonic()
        try:
            doc["checks"][n] = CHECKS[n]()
        except Exception:
            doc["checks"][n] = {"crashed": traceback.format_exc()}
        doc["seconds"][n] = round(time.monotonic() - t0, 2)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
