"""Bad input gets one line and exit 2 (usage) or 1, never a traceback and never a hang.

A systematic pass over every option of every command (numbers: NaN, inf, out of range; text: empty),
the conflicting combinations, scale factors that make a table empty, and a property-based fuzz of
whole command lines run in-process through the real entry point (tilewise.cli.main)."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from tilewise.cli import COMMANDS, cli, main
from tilewise.cli.common import NON_EMPTY, Number

# a topology that is not this machine (so nothing is ever run on it) and plans quickly
OTHER = "synthetic:Package:2 [NUMANode] L3Cache:1 Core:3 PU:1"


def leaf_commands() -> list[tuple[list[str], click.Command]]:
    out = []
    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            sub_ctx = click.Context(cmd)
            for sub in cmd.list_commands(sub_ctx):
                out.append(([name, sub], cmd.get_command(sub_ctx, sub)))
        else:
            out.append(([name], cmd))
    return out


LEAVES = leaf_commands()
REQUIRED = {("workload",): ["W1"], ("exec",): ["true"]}  # positional arguments a command needs


def invoke(*argv: str) -> tuple[int, str, str]:
    """Run the CLI in this process; (exit code, stdout, stderr). Exceptions other than SystemExit
    propagate: a traceback fails the test."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(code: int, err: str, expect_code: int | None = 2) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert "Traceback" not in err
    assert len(lines) <= 1, err
    if expect_code is not None:
        assert code == expect_code, err
        assert len(lines) == 1 and err.strip() == lines[0], err


def options(cmd: click.Command):
    return [p for p in cmd.params if isinstance(p, click.Option) and not p.is_flag and p.name != "help"]


def test_every_numeric_option_uses_the_finite_number_type():
    unsafe = (click.types.IntParamType, click.types.FloatParamType)
    for path, cmd in LEAVES:
        for p in cmd.params:
            assert not isinstance(p.type, unsafe) or isinstance(p.type, click.Choice), (path, p.name, p.type)


def _bad_numbers(t: Number) -> list[str]:
    bad = ["nan", "NaN", "inf", "-inf", "1e999", "abc", ""]
    if t.min is not None:
        bad.append(str(t.min - 1) if t.integer else repr(t.min - 0.5))
        if t.min_open:
            bad.append(str(t.min))
    if t.integer:
        bad.append("1.5")
    return bad


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_option_rejects_nonsense_in_one_line(path, cmd):
    """Numbers: NaN, inf, below range; text: empty. Checked on click's parsing (fast, nothing runs),
    then one of each through the real entry point for the one-line message and exit code 2."""
    checked = 0
    for p in options(cmd):
        flag = p.opts[0]
        if isinstance(p.type, Number):
            values = _bad_numbers(p.type)
        elif p.type is NON_EMPTY:
            values = ["", "   ", "a\x00b"]
        else:
            continue
        for v in values:
            with pytest.raises(click.BadParameter):
                cmd.make_context(" ".join(path), [flag, v, *REQUIRED.get(tuple(path), [])])
            checked += 1
        code, _, err = invoke(*path, flag, values[0], *REQUIRED.get(tuple(path), []))
        assert_one_error_line(code, err)
        assert flag in err
    assert checked or path in (["status"], ["down"]) or not options(cmd), path


CONFLICTS = [
    (["exec", "--plan", "p.json", "--policy", "wim", "--", "true"], "--plan cannot be combined with --policy"),
    (["exec", "--plan", "p.json", "--mem", "interleave", "--", "true"], "--plan cannot be combined with --mem"),
    (["exec", "--plan", "p.json", "--topology", OTHER, "--", "true"], "--plan cannot be combined with --topology"),
    (["plan", "--topology", OTHER, "--policy", "wim", "--skewed"], "hints for --policy auto"),
    (["plan", "--topology", OTHER, "--policy", "wic", "--working-set", "1GB"], "hints for --policy auto"),
    (["plan", "--topology", OTHER, "--policy", "wim", "--instances", "2"], "--instances applies to policy n"),
    (["elastic", "--replay", "x.jsonl", "--pid", "1"], "--replay cannot be combined with --pid"),
    (["elastic", "--replay", "x.jsonl", "--interval", "1"], "--replay cannot be combined with --interval"),
    (["elastic", "--cluster", "c", "--pid", "1"], "--cluster picks the cluster for --instances"),
    (["elastic", "--mode", "dense", "--pages-interval", "2", "--pid", "1"], "--pages-interval is for --mode adaptive"),
    (["elastic", "--dry-run", "--enforce", "cgroup", "--pid", "1"], "--dry-run cannot be combined with --enforce"),
    (["elastic", "--plot", "x.png", "--pid", "1"], "--plot draws a log"),
    (["elastic", "--th-min", "80", "--th-max", "20", "--pid", "1"], "th-min < th-max"),
    (["elastic", "--trace", "t.csv", "--topology", OTHER], "add --dry-run"),
    (["tune", "--restore", "-w", "W1"], "--restore cannot be combined with --workload"),
    (["tune", "--restore", "--repeat", "5"], "--restore cannot be combined with --repeat"),
    (["tune", "--restore", "--", "true"], "--restore takes no command"),
    (["tune", "-w", "W1", "--", "true"], "either --workload W or a command"),
    (["tune", "--thp", "never", "--", "true"], "need --apply-os"),
    (["workload", "W1", "--topology", OTHER], "--topology is for --dry-run only"),
    (["workload", "W1", "--ratio", "4"], "--ratio applies to W3 and W4"),
    (["workload", "W1", "--paper-scale", "--records", "1M", "--dry-run"], "--paper-scale cannot be combined with --records"),
    (["bench", "elastic", "--th-min", "80", "--th-max", "20"], "--th-min must be below --th-max"),
]


@pytest.mark.parametrize("argv,msg", CONFLICTS, ids=[" ".join(a[:3]) for a, _ in CONFLICTS])
def test_conflicting_options_are_rejected(argv, msg):
    code, _, err = invoke(*argv)
    assert_one_error_line(code, err)
    assert msg in err


EMPTY = [
    (["bench", "tpch", "--queries", ""], "--queries"),
    (["bench", "tpch", "--queries", ","], "bad query list"),
    (["bench", "tpch", "--out", ""], "--out"),
    (["bench", "tpch", "--policies", ""], "--policies"),
    (["bench", "tpch", "--policies", ",", "--topology", OTHER], "no policies given"),
    (["bench", "elastic", "--configs", ","], "unknown config"),
    (["plan", "--mem-nodes", ""], "--mem-nodes"),
    (["plan", "--topology", OTHER, "--mem", "membind", "--mem-nodes", "!0-1"], "leaves nothing"),
    (["probe", "stream", "--policies", ","], "--policies is empty"),
    (["probe", "latency", "--modes", ","], "unknown mode"),
    (["tune", "--allocators", ",", "--", "true"], "the grid is empty"),
    (["workload", "W1", "--mem", "interleave:", "--dry-run"], "empty node list"),
    (["topo", "--topology", " "], "--topology"),
]


@pytest.mark.parametrize("argv,msg", EMPTY, ids=[" ".join(a) for a, _ in EMPTY])
def test_empty_lists_and_paths_are_rejected(argv, msg):
    code, _, err = invoke(*argv)
    assert_one_error_line(code, err)
    assert msg in err


@pytest.mark.parametrize("sf,msg", [("1e-9", "supplier table empty"), ("0.00009", "supplier table empty"),
                                    ("nan", "must be > 0"), ("inf", "must be > 0"), ("0", "must be > 0"),
                                    ("-1", "must be > 0"), ("1e6", "beyond TPC-H's largest"), ("x", "not a number")])
def test_scale_factors_that_make_a_table_empty_are_rejected(sf, msg):
    for argv in (["bench", "tpch", "--sf", sf], ["bench", "elastic", "--sf", sf]):
        code, _, err = invoke(*argv)
        assert_one_error_line(code, err)
        assert msg in err


def test_list_grammars_reach_the_planner():
    t4 = "synthetic:Package:4 [NUMANode] Core:2 PU:1"
    code, out, err = invoke("plan", "--topology", t4, "--policy", "wim", "--mem", "interleave", "--mem-nodes", "!1", "--json")
    assert code == 0, err
    assert json.loads(out)["instances"][0]["mem_nodes"] == [0, 2, 3]
    code, out, err = invoke("plan", "--topology", t4, "--policy", "wim", "--mem", "membind", "--mem-nodes", "+2-3", "--json")
    assert code == 0 and json.loads(out)["instances"][0]["mem_nodes"] == [2, 3], err
    code, out, err = invoke("workload", "W1", "--dry-run", "--topology", t4, "--mem", "interleave:0-3:1/2", "--json")
    assert code == 0 and json.loads(out)["config"]["mem_nodes"] == [0, 2], err


def test_listings_say_which_indexes_they_show():
    code, out, _ = invoke("topo", "--topology", OTHER)
    assert code == 0 and "L# logical" in out and "P# OS" in out
    code, out, _ = invoke("plan", "--topology", OTHER, "--policy", "wic")
    assert code == 0 and "cpus (P#)" in out and "L3 (L#)" in out and "P#: OS indexes" in out


def test_a_real_process_prints_one_line_not_a_traceback():
    """The same through a subprocess: what a user's shell sees."""
    for argv in (["elastic", "--interval", "nan"], ["workload", "W1", "--records", "inf"],
                 ["topo", "--topology", "synthetic:" + " ".join(["Die:1"] * 1500) + " PU:2(size=x)"]):
        cp = run_cli(*argv, timeout=60)
        assert cp.returncode == 2 and cp.stderr.count("\n") == 1 and cp.stderr.startswith("Error: "), cp.stderr


# ---- property-based fuzz over whole command lines ---------------------------------------------------

EXAMPLES = int(os.environ.get("TILEWISE_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=10_000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SCRATCH = Path(tempfile.mkdtemp(prefix="tilewise-fuzz-"))
(SCRATCH / "dir").mkdir(exist_ok=True)
(SCRATCH / "trace.csv").write_text("time,load\n0,50\n0.1,90\n0.2,10\n0.3,80\n")
(SCRATCH / "log.jsonl").write_text('{"event": "log", "format": "tilewise-elastic", "version": 1}\n{"not": "a tick"}\n')
(SCRATCH / "garbage").write_text("<topology><object type='PU' os_index='x'/></topology>")
# made at import (the strategies below name its paths), so removed when the test process ends
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)


NUMBERS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "0.5", "1", "2", "3", "1e3", "1e999", "9" * 40, "abc", "",
                     " ", "1_000", "10M", "0x10", "-0", "+5", "²"]),
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
LISTS = st.one_of(st.sampled_from(["0", "0-1", "all", "!0", "+0", "!+0", "0-15:2/4", "N", "1-0", "", ",", "0,,1",
                                   "9" * 30, "+9", "x"]), st.text(alphabet="0123456789-,:/N!+ ", max_size=10))
PATHS = st.sampled_from([str(SCRATCH / "out"), str(SCRATCH / "dir"), str(SCRATCH / "garbage"), str(SCRATCH / "missing" / "x"),
                         "", " ", "/proc/version", str(SCRATCH / "trace.csv"), str(SCRATCH / "log.jsonl")])
TOPOLOGIES = st.sampled_from([OTHER, "synthetic:Package:2 [NUMANode] Core:2 PU:2", "synthetic:", "synthetic:PU:0",
                              "synthetic:" + " ".join(["Group:1"] * 1200) + " PU:2", "sysfs:/nonexistent",
                              str(SCRATCH / "garbage"), "", "xml:" + str(SCRATCH / "dir")])
WORDS = st.one_of(st.sampled_from(["wim", "wic", "auto", "n", "spread", "interleave", "membind:0", "preferred:+0",
                                   "local", "first-touch", "system", "jemalloc", "W1", "W3", "alloc", "q6", "x", ""]),
                  st.text(max_size=8))

PATHLIKE = {"out_dir", "export_path", "save_path", "plan_path", "config_path", "log_path", "trace_path", "replay_path",
            "plot_path", "data_dir", "cgroup_path", "os_root"}
LISTLIKE = {"cpus_text", "mem_nodes"}
VALID_WORDS = {
    "policy": ["wim", "wic", "auto", "n", "spread", "wicp", "win"], "policies": ["wim", "wim,wic", "n=2"],
    "mem": ["interleave", "local", "membind", "first-touch", "preferred", "interleave:all", "membind:+0"],
    "allocator": ["system"], "dataset": ["uniform", "zipf", "sequential"], "modes": ["cas", "rw", "cas,rw"],
    "working_set": ["200MB", "1GiB", "0", "1e3"], "size_text": ["64KiB", "1MB"], "sizes_text": ["1MB,4MB", "8KiB"],
    "query_list": ["1,6", "1-3", "all", "23"], "engine": ["duckdb", "spark"], "sf": ["0.01", "1"],
}


def _number(t: Number):
    lo = t.min if t.min is not None else 0
    good = [lo + 1, lo + 2] if t.integer else [lo + 0.5, lo + 1.0]
    return st.one_of(st.sampled_from([str(g) for g in good]), NUMBERS)


def _value(p: click.Option):
    if isinstance(p.type, Number):
        return _number(p.type)
    if isinstance(p.type, click.Choice):
        return st.one_of(st.sampled_from(list(p.type.choices)), st.just("bogus"))
    if p.name == "topology_src":
        return TOPOLOGIES
    if p.name in PATHLIKE:
        return PATHS
    if p.name in LISTLIKE:
        return LISTS
    if p.name in VALID_WORDS:
        return st.one_of(st.sampled_from(VALID_WORDS[p.name]), WORDS)
    return WORDS


# Whole commands that stop before anything heavy runs whatever the options: planning is pure,
# a topology that is not this machine stops bench/exec/probe before they start anything, elastic
# is simulated (--dry-run --trace) or replays a log, workload and tune stop at --dry-run/--restore.
SAFE = {
    ("plan",): [],
    ("topo",): [],
    ("exec",): ["--topology", OTHER],
    ("bench", "tpch"): ["--topology", OTHER, "--data-dir", str(SCRATCH / "data")],
    ("probe", "stream"): ["--topology", OTHER],
    ("probe", "latency"): ["--topology", OTHER],
    ("elastic",): ["--dry-run", "--trace", str(SCRATCH / "trace.csv"), "--topology", OTHER],
    ("workload",): ["--dry-run"],
}
NEVER = {"measure", "apply_os", "use_instances", "pid", "cgroup_path", "data_dir", "topology_src", "trace_path",
         "dry_run", "compare_likwid", "inject", "os_root"}


@st.composite
def command_line(draw):
    path = draw(st.sampled_from(sorted(SAFE)))
    cmd = dict((tuple(p), c) for p, c in LEAVES)[path]
    argv = [*path, *SAFE[path]]
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.name in NEVER or p.name == "help" or draw(st.integers(0, 3)):
            continue
        if p.is_flag:
            argv.append(p.opts[0])
        else:
            argv += [p.opts[0], draw(_value(p))]
    if path == ("workload",):
        argv.insert(1, draw(st.sampled_from(["W1", "W2", "W3", "W4", "alloc", "w9", ""])))
        if "--topology" not in argv and draw(st.booleans()):
            argv += ["--topology", OTHER]
    if path == ("exec",):
        argv += ["--", "true"]
    return argv


@FUZZ
@given(argv=command_line())
def test_fuzz_command_lines_exit_0_1_2_with_at_most_one_error_line(argv):
    code, _, err = invoke(*argv)
    event(f"{' '.join(argv[:2])}: exit {code}")
    assert code in (0, 1, 2), (argv, code, err)
    assert_one_error_line(code, err, expect_code=None)
    if code:
        assert err.strip().splitlines()[-1].startswith("Error: "), (argv, err)
