"""The tuner's grid, summaries and outputs (a fake runner: no timing), and a tiny real sweep."""

from __future__ import annotations

import csv
import json
from contextlib import contextmanager

import pytest

from tilewise.errors import TilewiseError, UsageError
from tilewise.tune import sweep
from tilewise.tune.knobs import Config

MEMS = [("first-touch", ()), ("interleave", (0,))]


def test_grid_has_default_first_and_no_duplicates():
    g = sweep.build_grid(["system", "jemalloc"], MEMS, ["none", "sparse"])
    assert g[0] == Config() and len(g) == 8 and len(set(g)) == 8
    g2 = sweep.build_grid(["jemalloc"], MEMS, ["none"], thps=["never"], autonumas=["0", "1"])
    assert g2[0] == Config() and len(g2) == 1 + 4
    assert {c.os_label() for c in g2[1:]} == {"thp=never,autonuma=off", "thp=never,autonuma=on"}


def fake_runner(times: dict[str, list[float]], calls: list[str]):
    def run(cfg: Config):
        calls.append(cfg.label())
        if cfg.allocator == "tcmalloc":
            raise TilewiseError("boom")
        return times[cfg.allocator].pop(0), {"checksum": 7}
    return run


def test_sweep_interleaves_repeats_and_picks_the_best():
    g = sweep.build_grid(["system", "jemalloc", "tcmalloc"], MEMS[:1], ["none"])
    calls: list[str] = []
    times = {"system": [2.0, 2.2, 2.1], "jemalloc": [1.0, 1.1, 0.9]}
    sw = sweep.run_sweep(g, fake_runner(times, calls), repeat=3)
    labels = [c.label() for c in g]
    assert calls == labels * 3  # every config once per repeat, in grid order
    best = sw.best()
    assert best.config.allocator == "jemalloc" and best.median == 1.0
    assert sw.speedup() == pytest.approx(2.1)
    assert sw.cases[2].failures and "tcmalloc" in " ".join(sw.warnings())
    assert sw.default.spread == pytest.approx(0.2 / 2.1)


def test_warmup_times_are_kept_apart():
    g = sweep.build_grid(["system"], MEMS[:1], ["none"])
    times = iter([5.0, 1.0, 1.2, 1.1])  # one warm-up, then three measured runs
    sw = sweep.run_sweep(g, lambda c: (next(times), {}), repeat=3, warmup=1)
    s = sw.cases[0].summary()
    assert s["warmup_s"] == [5.0] and s["runs"] == 3 and s["median_s"] == 1.1
    assert s["ci95_s"][0] < 1.1 < s["ci95_s"][1] and s["stdev_s"] == pytest.approx(0.1)


def test_sweep_applies_os_state_once_per_group():
    g = sweep.build_grid(["system"], MEMS[:1], ["none"], thps=["never", "always"])
    entered: list[dict] = []

    @contextmanager
    def os_apply(d):
        entered.append(d)
        yield

    sw = sweep.run_sweep(g, lambda c: (1.0, {}), repeat=2, os_apply=os_apply)
    assert entered == [{"thp": "never"}, {"thp": "always"}]
    assert all(len(c.times) == 2 for c in sw.cases)
    with pytest.raises(UsageError):
        sweep.run_sweep(g, lambda c: (1.0, {}), repeat=1)  # OS states without --apply-os


def test_results_doc_structure_and_csv(tmp_path):
    from tilewise import topology
    from tilewise.results.output import Writer

    g = sweep.build_grid(["system", "jemalloc"], MEMS, ["none"])
    sw = sweep.run_sweep(g, lambda c: (1.0 + 0.1 * g.index(c), {"checksum": 1}), repeat=2)
    base = sweep.new_doc(topology.load(None), {}, target={"workload": "W1"}, grid_spec={"cases": len(g)}, repeat=2,
                         warmup=0)
    doc = sweep.results_doc(sw, base)
    assert doc["format"] == "tilewise-results" and doc["kind"] == "tune" and doc["search"] == "grid"
    assert doc["complete"] and not doc["interrupted"]
    assert [c["case"] for c in doc["cases"]] == [0, 1, 2, 3] and doc["best"]["label"] == "system/first-touch/none"
    w = Writer(tmp_path)
    w.write(doc)
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 8 and rows[0]["status"] == "ok"
    back = sweep.load_results(str(tmp_path / "results.json"))
    assert back["cases"][1]["runs"] == 2
    assert [m["values"] for m in back["metrics"]][0] == [1.0, 1.0]  # raw times, one per repeat
    assert (tmp_path / "fig6.png").stat().st_size > 1000


def test_differing_checksums_are_flagged():
    sw = sweep.run_sweep(sweep.build_grid(["jemalloc"], MEMS[:1], ["none"]),
                         lambda c: (1.0, {"checksum": 1 if c.is_default() else 2}), repeat=1)
    assert any("checksum" in w for w in sw.warnings())


def test_cli_tune_tiny_grid(cli, tmp_path):
    out = tmp_path / "out"
    args = ("tune", "-w", "W2", "--records", "5000", "--groups", "50", "--allocators", "system,jemalloc",
            "--mem", "first-touch", "--repeat", "2", "--out", str(out), "--json")
    cp = cli(*args)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [c["label"] for c in doc["cases"]] == ["system/first-touch/none", "jemalloc/first-touch/none"]
    assert all(c["runs"] == 2 and not c["failures"] for c in doc["cases"])
    assert doc["best"]["label"] in {c["label"] for c in doc["cases"]} and doc["speedup_over_default"] > 0
    assert {r["checksum"] for c in doc["cases"] for r in c["raw"]} == {doc["cases"][0]["raw"][0]["checksum"]}
    for f in ("results.json", "results.csv", "fig6.png", "tuned.json"):
        assert (out / f).exists()
    tuned = json.loads((out / "tuned.json").read_text())
    assert tuned["format"] == "tilewise-tuned-config" and tuned["config"]["allocator"] in ("system", "jemalloc")
    assert doc["reproduce"]["tilewise"].startswith("tilewise workload W2 --records 5000")
    # feed the winner back: exec --config supplies the allocator; an explicit flag wins
    (out / "tuned.json").write_text(json.dumps(dict(tuned, config=dict(tuned["config"], allocator="jemalloc", mem="interleave"))))
    cp = cli("exec", "--policy", "wim", "--config", str(out / "tuned.json"), "--json", "--", "sleep", "0.3")
    assert cp.returncode == 0, cp.stderr
    ex = json.loads(cp.stdout)
    assert ex["binding"]["allocator"] == "jemalloc" and ex["binding"]["mem_policy"] == "interleave"
    assert ex["verification"]["allocator_loaded"] is True
    cp = cli("exec", "--policy", "wim", "--config", str(out / "tuned.json"), "--allocator", "system", "--json", "--", "true")
    assert json.loads(cp.stdout)["binding"]["allocator"] == "system"


def test_cli_tune_usage_errors(cli, tmp_path):
    cp = cli("tune")
    assert cp.returncode == 2 and "--workload" in cp.stderr
    cp = cli("tune", "--placements", "sparse", "--out", str(tmp_path), "--", "true")
    assert cp.returncode == 2 and "placement" in cp.stderr
    cp = cli("tune", "-w", "W1", "--allocators", "nope", "--out", str(tmp_path))
    assert cp.returncode == 2 and "unknown allocator" in cp.stderr
    cp = cli("tune", "-w", "W1", "--thp", "never", "--out", str(tmp_path))
    assert cp.returncode == 2 and "--apply-os" in cp.stderr
    cp = cli("workload", "W1", "--config", str(tmp_path / "missing.json"))
    assert cp.returncode == 2 and "does not exist" in cp.stderr
