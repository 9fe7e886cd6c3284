"""`tilewise elastic` end to end: trace simulation, replay + plot, and one-line errors."""

import json

from conftest import FIXTURES, run_cli

TWO = "synthetic:Package:2 [NUMANode] L3Cache:2 Core:4 PU:1"


def test_trace_dry_run_log_replay_plot(tmp_path):
    tr = tmp_path / "load.jsonl"
    tr.write_text("\n".join(json.dumps({"time": i * 0.1, "demand": d}) for i, d in enumerate([0, 3, 3, 3, 3, 3, 0, 0, 0, 0])))
    log = tmp_path / "el.jsonl"
    cp = run_cli("elastic", "--dry-run", "--trace", str(tr), "--topology", TWO, "--mode", "sparse",
                 "--log", str(log), "--json", check=True)
    s = json.loads(cp.stdout)
    assert s["n_total"] == 16 and s["cores"]["max"] == 5 and s["cores"]["final"] == 1  # 3/5 = 60 % is stable
    assert s["firings"]["t5"] == 4 and s["firings"]["t4"] == 4
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    # a results document (kind elastic.log): the envelope first, then a line per record, the end last
    assert (lines[0]["format"], lines[0]["kind"]) == ("tilewise-results", "elastic.log")
    assert lines[0]["params"]["mode"] == "sparse" and lines[0]["environment"]["topology"]["summary"]
    assert lines[-1]["event"] == "end" and lines[-1]["complete"] and lines[-1]["stats"]["ticks"] == 10
    ticks = [r for r in lines if "transitions" in r]
    assert {"t", "marking", "u", "action", "cores", "transitions"} <= set(ticks[0])
    assert ticks[1]["action"] == "allocate" and ticks[1]["marking"]["Provision"] == 2
    png = tmp_path / "el.png"
    cp = run_cli("elastic", "--replay", str(log), "--plot", str(png), check=True)
    assert "10 ticks" in cp.stdout and png.stat().st_size > 1000
    assert png.read_bytes()[:4] == b"\x89PNG"
    cp = run_cli("report", str(log), check=True)  # the log is a results document like any other
    assert "10 ticks, 4 allocations, 4 releases" in cp.stdout and "controller cost: 10 ticks" in cp.stdout
    old = FIXTURES / "results-v1" / "elastic-log-live.jsonl"  # a log of the tilewise before the results model
    for again in (log, old):  # a log replays as a trace (its load used as is)
        cp = run_cli("elastic", "--dry-run", "--trace", str(again), "--topology", TWO, "--json", check=True)
        assert json.loads(cp.stdout)["ticks"] == sum(1 for x in again.read_text().splitlines() if '"transitions"' in x)


def test_errors_are_one_line(tmp_path):
    cases = [
        (["elastic"], "exactly one target"),
        (["elastic", "--pid", "999999999"], "no running process"),
        (["elastic", "--pid", "1", "--metric", "traffic"], "not measured"),
        (["elastic", "--trace", "x.csv", "--topology", TWO], "--dry-run"),
        (["elastic", "--pid", "1", "--th-min", "80", "--th-max", "20"], "th-min"),
        (["elastic", "--pid", "1", "--topology", TWO], "not this machine"),
        (["elastic", "--replay", str(tmp_path / "none.jsonl")], "cannot read"),
    ]
    for args, msg in cases:
        cp = run_cli(*args)
        assert cp.returncode != 0, args
        assert cp.stderr.startswith("Error: ") and msg in cp.stderr, (args, cp.stderr)
        assert "Traceback" not in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    cp = run_cli("elastic", "--replay", str(bad))
    assert cp.returncode != 0 and "not a tilewise elastic log" in cp.stderr and len(cp.stderr.splitlines()) == 1


def test_instances_without_a_cluster_is_a_clear_error(tmp_path):
    cp = run_cli("elastic", "--instances", "--duration", "0.2",
                 env={"TILEWISE_CLUSTER_DIR": str(tmp_path / "clusters"), "TILEWISE_STATE_DIR": str(tmp_path)})
    assert cp.returncode != 0
    assert cp.stderr.startswith("Error: no running cluster") and len(cp.stderr.strip().splitlines()) == 1


def test_instances_of_a_recorded_cluster(tmp_path):
    """A cluster state file as `tilewise up` writes it, whose worker is a process of ours."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    try:
        cpus = sorted(os.sched_getaffinity(child.pid))
        cdir = tmp_path / "clusters"
        cdir.mkdir()
        member = {"role": "worker", "instance": 0, "pid": child.pid, "create_time": psutil.Process(child.pid).create_time(),
                  "binding": {"cpus": cpus, "mem_policy": "first-touch", "mem_nodes": [], "allocator": "system"},
                  "log": "", "cores": len(cpus), "memory_mb": 0}
        state = {"format": "tilewise-cluster/1", "name": "t1", "engine": "spark", "token": "x", "state": "running",
                 "created": time.time(), "root": str(cdir / "t1"), "plan": {}, "members": [member]}
        (cdir / "t1.json").write_text(json.dumps(state))
        cp = run_cli("elastic", "--instances", "--duration", "0.5", "--json", "--enforce", "affinity",
                     env={"TILEWISE_CLUSTER_DIR": str(cdir), "TILEWISE_STATE_DIR": str(tmp_path / "st")})
        assert cp.returncode == 0, cp.stderr
        s = json.loads(cp.stdout)
        assert s["target"] == ["instance t1/0"] and s["restored"] and s["ticks"] >= 2
        assert sorted(os.sched_getaffinity(child.pid)) == cpus
    finally:
        child.kill()
        child.wait()
