"""End to end: `tilewise bench tpch` on DuckDB at SF 0.01 through the real CLI, plus the engine's
binding (read back from /proc), a killed instance, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import run_cli
from tilewise import cpulist, plan, topology
from tilewise.benchmarks.tpch import queries
from tilewise.data import Dataset
from tilewise.benchmarks.tpch import data as tpch_data


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch-data")
    tpch_data.ensure_data(0.01, root)
    return root


def _workers(tag: str) -> list[psutil.Process]:
    """DuckDB workers started by the run tagged `tag` (other runs on this machine are not ours)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any("tilewise.engines.duckdb.server" in c for c in (p.info["cmdline"] or [])) \
                    and p.environ().get("TILEWISE_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def _is_worker(p: psutil.Process) -> bool:
    try:
        return "tilewise.engines.duckdb.server" in " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie not yet reaped (e.g. a short-lived git run)
        return False


def test_bench_two_policies_end_to_end(tmp_path, data_root):
    out = tmp_path / "res"
    cp = run_cli("bench", "tpch", "--engine", "duckdb", "--sf", "0.01", "--policies", "wim,wic", "--runs", "2",
                 "--streams", "2", "--out", str(out), "--data-dir", str(data_root), "--json", timeout=240,
                 env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)  # --json: results.json on stdout, nothing else
    assert doc == json.loads((out / "results.json").read_text())
    assert doc["format"] == "tilewise-results" and doc["kind"] == "benchmark" and doc["complete"]
    p = doc["params"]
    assert p["engine"] == "duckdb" and p["sf"] == 0.01 and p["streams"] == 2
    env = doc["environment"]
    for key in ("topology", "kernel", "os", "tilewise_version", "git_commit", "engines", "system_check"):
        assert key in env
    assert env["engines"]["duckdb"] and env["topology"]["document"]["cores"] >= 1
    assert doc["meta"]["command"].startswith("tilewise bench tpch") and doc["meta"]["tilewise_version"]
    assert {"thp_enabled", "autonuma"} <= set(env["os"])
    assert list(doc["policies"]) == ["wim", "wic"]
    ncpu = len(os.sched_getaffinity(0))
    wim, wic = doc["policies"]["wim"], doc["policies"]["wic"]
    assert len(wim["instances"]) == 1 and len(wic["instances"]) == ncpu
    assert sorted(c for i in wic["instances"] for c in i["cpus"]) == sorted(wim["instances"][0]["cpus"])
    for pol in (wim, wic):
        for inst in pol["instances"]:
            assert {"cpus", "mem_nodes"} <= set(inst) and inst["binding_verified"] is True
            assert inst["verification"] == "verified"  # one record: what /proc read back, per item
            assert inst["checks"]["cpus"]["state"] == "verified" and inst["checks"]["cpus"]["want"]
            assert inst["threads"] == len(inst["cpus"])  # threads = the instance's CPU count
        assert sorted(pol["queries"], key=lambda q: int(q[1:])) == [f"q{n}" for n in range(1, 23)]
        for q, rec in pol["queries"].items():
            assert len(rec["times_s"]) == 2 and all(t > 0 for t in rec["times_s"])
            assert rec["valid"] is True and isinstance(rec["rows"], int)
    assert doc["policies"]["wim"]["queries"]["q1"]["rows"] == 4
    # TPC-H's metrics, with the refresh functions applied to every DuckDB replica and validated
    assert doc["refresh"]["applied"] is True and [x["set"] for x in doc["refresh"]["sets"]] == [1, 2, 3]
    for pol in (wim, wic):
        assert len(pol["runs"]) == 2 and len(pol["warmup"]) == 1
        for r in pol["runs"]:
            assert r["power_at_size"] > 0 and r["throughput_at_size"] > 0 and r["qphh_at_size"] > 0
            assert r["power"]["rf1_s"] > 0 and len(r["throughput"]["refresh_stream"]) == 2
    s = doc["summary"]
    assert s["wim"]["geomean_speedup_vs_baseline"] == pytest.approx(1.0)
    assert s["wic"]["total_s"] > 0 and s["wic"]["geomean_speedup_vs_baseline"] > 0
    csv = (out / "results.csv").read_text().splitlines()
    assert csv[0].startswith("policy,query,run,time_s") and len(csv) == 1 + 2 * 22 * 2
    for png in ("speedup_per_query.png", "geomean_speedup.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not _workers(str(tmp_path))


def test_readable_table_and_wrong_answer_fails_loudly(tmp_path, data_root):
    out = tmp_path / "bad"
    cp = run_cli("bench", "tpch", "--sf", "0.01", "--policies", "wim", "--runs", "1", "--queries", "1,6",
                 "--out", str(out), "--data-dir", str(data_root), "--inject-wrong-answer", "6", "--no-plots",
                 env={"TILEWISE_TEST_TAG": str(tmp_path)})
    assert cp.returncode == 1
    assert "WRONG ANSWER" in cp.stderr and "q6" in cp.stderr
    assert cp.stderr.strip().splitlines()[-1].startswith("Error: WRONG ANSWER")
    assert "Traceback" not in cp.stderr
    assert "summary" in cp.stdout and "WRONG" in cp.stdout  # the table still shows what ran
    doc = json.loads((out / "results.json").read_text())
    assert doc["policies"]["wim"]["queries"]["q6"]["valid"] is False
    assert doc["policies"]["wim"]["queries"]["q1"]["valid"] is True
    assert doc["summary"]["wim"]["valid"] is False
    assert not _workers(str(tmp_path))


def test_each_instance_bound_as_planned_read_from_proc(data_root):
    from tilewise.engines import get

    t = topology.load(None)
    p = plan.plan(t, "wic")
    eng = get("duckdb").runtime_class()()
    with eng:
        eng.start(p, dataset=Dataset.at(data_root / "sf0.01", sf=0.01))
        sts = eng.status()
        assert len(sts) == len(p.instances)
        for inst, st in zip(p.instances, sts):
            assert st.binding_verified and st.healthy
            with open(f"/proc/{st.pid}/status") as f:
                fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            assert cpulist.parse(fields["Cpus_allowed_list"].strip()) == tuple(sorted(inst.cpus))
            assert eng.info(inst.id)["threads"] == len(inst.cpus)
            r = eng.run_query(queries.load(6), instance=inst.id)
            assert r.instance == inst.id and len(r.rows) == 1
        pids = [s.pid for s in sts]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_killed_instance_is_detected_and_nothing_is_left(tmp_path, data_root):
    exe = str(Path(sys.executable).parent / "tilewise")
    proc = subprocess.Popen([exe, "bench", "tpch", "--sf", "0.01", "--policies", "wic", "--streams", "2",
                             "--runs", "1000", "--no-plots", "--out", str(tmp_path / "k"), "--data-dir", str(data_root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        victims = []
        while time.monotonic() < deadline and proc.poll() is None:
            kids = [c for c in psutil.Process(proc.pid).children(recursive=True) if _is_worker(c)]
            if kids and (tmp_path / "k" / "results.json").exists():
                victims = kids
                break
            time.sleep(0.2)
        assert victims, "no DuckDB worker appeared"
        time.sleep(1.0)  # mid-run
        others = [v.pid for v in victims[1:]]
        os.kill(victims[0].pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert f"pid {victims[0].pid}" in err and "killed by SIGKILL" in err and "Traceback" not in err
    for pid in others:  # the surviving instances were stopped too
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    doc = json.loads((tmp_path / "k" / "results.json").read_text())
    assert "killed by SIGKILL" in doc["policies"]["wic"]["error"]


def test_interrupted_bench_says_so(tmp_path, data_root):
    """Ctrl-C in the middle: exit 130, results.json says interrupted, with what was requested and
    what completed, and no table or plot of what did not run."""
    out = tmp_path / "i"
    exe = str(Path(sys.executable).parent / "tilewise")
    proc = subprocess.Popen([exe, "bench", "tpch", "--sf", "0.01", "--policies", "wim,wic", "--runs", "1000",
                             "--queries", "1,6", "--out", str(out), "--data-dir", str(data_root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TILEWISE_TEST_TAG=str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                doc = json.loads((out / "results.json").read_text())
                if len(doc["policies"].get("wim", {}).get("runs", [])) >= 2:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    doc = json.loads((out / "results.json").read_text())
    assert doc["interrupted"] is True and doc["complete"] is False
    assert doc["requested"] == {"policies": ["wim", "wic"], "queries": ["q1", "q6"]}
    assert doc["completed"]["policies"] == [] and doc["completed"]["queries"] == {"wim": ["q1", "q6"]}
    assert doc["policies"]["wim"]["error"] == "interrupted" and "wic" not in doc["policies"]
    assert len(doc["policies"]["wim"]["queries"]["q1"]["times_s"]) >= 2  # what was measured is kept
    assert not (out / "speedup_per_query.png").exists()  # one policy: no comparison to plot
    assert not _workers(str(tmp_path))


@pytest.mark.parametrize("args, message", [
    (["--engine", "nosuch"], "unknown engine 'nosuch'"),
    (["--sf", "0"], "scale factor must be > 0"),
    (["--sf", "-2"], "scale factor must be > 0"),
    *([(["--policies", "wim,spread"], "spread needs at least 2 NUMA nodes")]  # only on a one-node machine
      if len(topology.load(None).cpu_nodes) < 2 else []),
    (["--policies", "wim,wim"], "listed twice"),
    (["--policies", "win", "--topology", "synthetic:Package:2 [NUMANode] L3Cache:2 Core:2 PU:1"], "not this machine"),
    (["--streams", "0"], "'--streams' / '-s': '0' is out of range: it must be >= 1"),
    (["--queries", "1,23"], "no TPC-H query 23"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, message):
    cp = run_cli("bench", "tpch", "--out", str(tmp_path / "o"), *args)
    assert cp.returncode != 0
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], cp.stderr
    assert not (tmp_path / "o" / "results.json").exists()


def test_unwritable_out_fails_before_running(tmp_path, data_root):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cp = run_cli("bench", "tpch", "--sf", "0.01", "--policies", "wim", "--out", str(blocker / "sub"),
                 "--data-dir", str(data_root))
    assert cp.returncode != 0 and cp.stderr.startswith("Error: cannot write to --out")
