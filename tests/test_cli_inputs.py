"""Bad input gets one line and exit 2 (usage) or 1, never a traceback and never a hang.

A systematic pass over every option of every command (numbers: NaN, inf, out of range; text: empty),
the conflicting combinations, scale factors that make a table empty, and a property-based fuzz of
every command, generated from its declared options with malformed files, special files and junk
environment, run in-process through the real entry point (tilewise.cli.main) inside a sandbox: it
ends in a result or one `Error:` line, and a run that fails leaves nothing behind."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import signal
import stat as stat_
import subprocess
import tempfile
import time
from pathlib import Path

import click
import psutil
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from vm import harness
from tilewise.cli import COMMANDS, cli, main
from tilewise.cli.common import NON_EMPTY, Number
from tilewise.errors import TilewiseError

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


# ---- property-based fuzz, per command ---------------------------------------------------------------
#
# Generated from each command's declared options (click's parameters: numbers, choices, paths, lists,
# flags), with malformed files of every format a command reads, special files and junk environment.
# Each example runs in-process through the real entry point inside a sandbox: its own working, cache,
# state, cluster and temporary directories; no process may start (one that would is refused in one
# line, as a start that fails is: the command got past its checks) and the network is a closed port.
# Every run must end with exit 0, or 1/2 and exactly one `Error:` line: no traceback, no hang; a run
# that fails leaves the sandbox and its inputs as they were, and no child process.

EXAMPLES = int(os.environ.get("TILEWISE_FUZZ_EXAMPLES", "12"))  # per command; 500 for a longer hunt
HANG_S = 60  # one example may not take longer (a hang fails the test instead of the suite)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TILEWISE_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
INPUTS = Path(tempfile.mkdtemp(prefix="tilewise-fuzz-in-"))
atexit.register(shutil.rmtree, INPUTS, ignore_errors=True)  # made at import: the strategies name its files
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"
       b"\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")


def _make_inputs(d: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = {}

    def put(name: str, data: str | bytes) -> None:
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        f[name] = p

    put("trace.csv", "time,load\n0,50\n0.1,90\n0.2,10\n0.3,80\n")
    put("trace-nan.csv", "time,load\n0,50\n0.1,nan\n")
    put("trace-backwards.csv", "time,demand\n1,0.5\n0.5,1\n")
    put("log.jsonl", '{"event": "log", "format": "tilewise-elastic", "version": 1}\n{"not": "a tick"}\n')
    put("garbage.xml", "<topology><object type='PU' os_index='x'/></topology>")
    put("image.png", PNG)
    put("deep.json", "[" * 100_000 + "]" * 100_000)
    put("broken.json", '{"format": "tilewise-results", ')
    put("list.json", "[1, 2, 3]")
    put("empty", "")
    put("plan-bad.json", '{"policy": 3, "instances": "x"}')
    put("config-other.json", '{"format": "something-else"}')
    doc = json.loads((Path(__file__).parent / "fixtures" / "results-v2" / "tpch.json").read_text())
    doc["metrics"][0]["values"] = ["fast"]
    put("results-strings.json", json.dumps(doc))
    put("results-png/results.json", PNG)
    put("query.sql", "SELECT 1;\n")
    put("query-binary.sql", PNG)
    put("tables-ok/t.csv", "a,b\n1,x\n2,y\n")
    put("tables-dup/t.csv", "a,a\n1,2\n")
    put("tables-bad-row/t.csv", "a,b\n1,2\n3\n")
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"a": [1, 2, 3]}), buf)
    put("tables-cut/t.parquet", buf.getvalue().to_pybytes()[:40])
    put("tables-text/t.parquet", "not parquet at all\n")
    (d / "folder").mkdir()
    f["folder"] = d / "folder"
    os.mkfifo(d / "fifo")
    f["fifo"] = d / "fifo"
    os.symlink(d / "nowhere", d / "dangling")
    f["dangling"] = d / "dangling"
    os.symlink(d / "loop", d / "loop")
    f["loop"] = d / "loop"
    f["under-a-file"] = d / "image.png" / "x"
    f["missing"] = d / "missing" / "x"
    return f


FILES = _make_inputs(INPUTS)
PATHS = st.one_of(st.sampled_from(sorted(str(p) for p in FILES.values())),
                  st.sampled_from(["", " ", "/proc/version", "/dev/null", "out", "tables-ok"]))
TOPOLOGIES = st.sampled_from([OTHER, "synthetic:Package:2 [NUMANode] Core:2 PU:2", "synthetic:", "synthetic:PU:0",
                              "synthetic:" + " ".join(["Group:1"] * 1200) + " PU:2", "sysfs:/nonexistent", "sysfs:",
                              str(FILES["garbage.xml"]), str(FILES["image.png"]), str(FILES["fifo"]),
                              str(FILES["dangling"]), "", "xml:" + str(FILES["folder"])])
NUMBERS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "0.5", "1", "2", "3", "1e3", "1e999", "9" * 40, "abc", "",
                     " ", "1_000", "10M", "0x10", "-0", "+5", "²", "65536"]),
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
LISTS = st.one_of(st.sampled_from(["0", "0-1", "all", "!0", "+0", "!+0", "0-15:2/4", "N", "1-0", "", ",", "0,,1",
                                   "9" * 30, "+9", "x", "1,1", "power,power"]),
                  st.text(alphabet="0123456789-,:/N!+ ", max_size=10))
WORDS = st.one_of(st.sampled_from(["wim", "wic", "auto", "n", "spread", "interleave", "membind:0", "preferred:+0",
                                   "local", "first-touch", "system", "jemalloc", "W1", "W3", "alloc", "q6", "x", "",
                                   "weighted-interleave", "999.1.1.1", "127.0.0.1", "::1", "host-name", "-"]),
                  st.text(max_size=8))
VALID_WORDS = {
    "policy": ["wim", "wic", "auto", "n", "spread", "wicp", "win"], "policies": ["wim", "wim,wic", "n=2"],
    "mem": ["interleave", "local", "membind", "first-touch", "preferred", "interleave:all", "membind:+0",
            "weighted-interleave"],
    "allocator": ["system"], "dataset": ["uniform", "zipf", "sequential"], "modes": ["cas", "rw", "cas,rw"],
    "working_set": ["200MB", "1GiB", "0", "1e3"], "size_text": ["64KiB", "1MB"], "sizes_text": ["1MB,4MB", "8KiB"],
    "query_list": ["1,6", "1-3", "all", "23"], "engine": ["duckdb", "spark", "postgres", "tiles", "trino"],
    "sf": ["0.01", "1"], "tests": ["power", "throughput", "power,throughput", "power,power"],
    "layout": ["parquet", "csv", "parquet-0", "parquet-2", "bogus"], "qparams": ["streams", "qualification", "skewed"],
    "exchange": ["shm", "unix", "tcp", "bogus"], "host": ["127.0.0.1", "999.1.1.1", "::1", "bad host"],
    "threads": ["1", "65536", "1,2"], "name": ["default", "fuzz", "x/y"], "coordinator": ["127.0.0.1:99999", "h:1"],
}
# bad values of the environment variables tilewise reads (envvars), one set per example
ENVIRONMENTS = st.sampled_from([{}, {}, {"TILEWISE_POSTGRES_PORT": "notaport"}, {"TILEWISE_POSTGRES_JIT": "maybe"},
                                {"TILEWISE_TRINO_START_TIMEOUT": "-1"}, {"TILEWISE_TRINO_VERSION": "latest"},
                                {"TILEWISE_STATE_DIR": str(FILES["image.png"])},
                                {"TILEWISE_CLUSTER_DIR": str(FILES["under-a-file"])},
                                {"TILEWISE_TILES_CACHE": str(FILES["image.png"])}])
# never fuzzed: they act on this machine's processes or cgroups whatever the sandbox (elastic --pid
# would steer a real process), or are test hooks
NEVER = {"pid", "cgroup_path", "use_instances", "cluster_name", "whole_machine", "inject", "crack_pause", "os_root",
         "help"}
# arguments every example of a command starts with: what keeps a valid command line from acting on
# the machine ({SB}: the example's sandbox)
ANCHORS = {
    ("elastic",): ["--dry-run", "--trace", str(FILES["trace.csv"]), "--topology", OTHER],
    ("tune",): ["--os-root", "{SB}/os"],
    ("workload",): ["--os-root", "{SB}/os"],
}
SKIP = {("engines", "install"), ("extras", "install")}  # they install packages (pip, apt) by design: test_parts
FUZZED = [(p, c) for p, c in LEAVES if tuple(p) not in SKIP]


def _is_path(p: click.Parameter) -> bool:
    meta = (getattr(p, "metavar", None) or "").upper()
    return (p.name.endswith(("_path", "_dir", "_file")) or p.name in ("paths", "data_dir", "set_dir", "layout_dir",
                                                                     "export_path", "tilewise_src")
            or "FILE" in meta or meta.startswith("DIR"))


def _fuzz_value(p: click.Parameter):
    if p.name in VALID_WORDS:
        return st.one_of(st.sampled_from(VALID_WORDS[p.name]), WORDS)
    if isinstance(p.type, Number):
        return _number(p.type)
    if isinstance(p.type, click.Choice):
        return st.one_of(st.sampled_from(list(p.type.choices)), st.just("bogus"))
    if p.name == "topology_src":
        return TOPOLOGIES
    if _is_path(p):
        return PATHS
    if p.name in LISTLIKE or "LIST" in (getattr(p, "metavar", None) or ""):
        return LISTS
    return WORDS


def _number(t: Number):
    lo = t.min if t.min is not None else 0
    good = [lo + 1, lo + 2] if t.integer else [lo + 0.5, lo + 1.0]
    return st.one_of(st.sampled_from([str(g) for g in good]), NUMBERS)


LISTLIKE = {"cpus_text", "mem_nodes", "sender_cpus", "receiver_cpus", "initiators", "targets"}


@st.composite
def fuzz_line(draw, path: tuple[str, ...], cmd: click.Command):
    argv = [*path, *ANCHORS.get(path, [])]
    # a few options at a time (many at once nearly always hold one the parser refuses first)
    opts = [p for p in cmd.params if isinstance(p, click.Option) and p.name not in NEVER and not p.hidden]
    for p in draw(st.lists(st.sampled_from(opts), max_size=4, unique_by=lambda p: p.name)) if opts else ():
        argv += [p.opts[0]] if p.is_flag else [p.opts[0], draw(_fuzz_value(p))]
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    for a in args:
        if a.name == "name":  # workload W
            argv.insert(len(path), draw(st.sampled_from(["W1", "W2", "W3", "W4", "alloc", "T1", "T2", "T3", "w9", ""])))
        elif a.name == "paths":
            argv += draw(st.lists(PATHS, min_size=0, max_size=3))
        elif a.name == "sql":
            argv += draw(st.sampled_from([[], ["SELECT 1"], [""], ["--", "-- x"]]))
        elif a.name == "command":
            argv += draw(st.sampled_from([["--", "true"], ["--", str(FILES["missing"])], []]))
    return argv


class _Blocked(TilewiseError):
    """What the sandbox answers a process start with: the command got past its checks."""


def _block(*args, **kw):
    raise _Blocked("the fuzz sandbox starts no process")


def _tree(*roots: Path) -> dict[str, tuple]:
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                q = os.path.join(dirpath, n)
                st_ = os.lstat(q)
                out[q] = (stat_.S_IFMT(st_.st_mode), st_.st_size if stat_.S_ISREG(st_.st_mode) else 0)
    return out


def _dev_null_intact() -> bool:
    """/dev/null is still the null device (the fuzz names it as a file to write: a command that replaced
    it with a regular file would break every later process on the machine); put back when it is not."""
    if stat_.S_ISCHR(os.stat("/dev/null").st_mode):
        return True
    if os.geteuid() == 0:
        os.unlink("/dev/null")
        os.mknod("/dev/null", 0o666 | stat_.S_IFCHR, os.makedev(1, 3))
        os.chmod("/dev/null", 0o666)
    return False


def changes(root: Path, before: dict, after: dict) -> tuple[set, set]:
    """(paths made or changed, paths gone) between two _tree snapshots of a sandbox, leaving out the
    state directory's own skeleton (journals/, locks/ and its mutex), which stays as /run/tilewise does."""
    skeleton = {str(root / "state" / n) for n in ("journals", "locks", "locks/.mutex")}
    return {k for k, v in after.items() if before.get(k) != v and k not in skeleton}, set(before) - set(after)


class _Hung(BaseException):
    pass


@contextlib.contextmanager
def sandbox(env: dict[str, str]):
    """A fresh sandbox for one example; everything it changes in this process is put back."""
    root = Path(tempfile.mkdtemp(prefix="tilewise-fuzz-sb-"))
    for d in ("cwd", "cache", "state", "clusters", "run", "tmp", "os"):
        (root / d).mkdir()
    own = {"XDG_CACHE_HOME": root / "cache", "XDG_STATE_HOME": root / "state", "XDG_RUNTIME_DIR": root / "run",
           "TILEWISE_STATE_DIR": root / "state", "TILEWISE_CLUSTER_DIR": root / "clusters",
           "TILEWISE_MAVEN_MIRROR": "http://127.0.0.1:9"}
    saved_env, cwd, tmp = dict(os.environ), os.getcwd(), tempfile.tempdir
    saved = (subprocess.Popen.__init__, os.fork, os.posix_spawn, os.posix_spawnp)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    for k in [k for k in os.environ if k.startswith("TILEWISE_")]:
        del os.environ[k]
    os.environ.update({k: str(v) for k, v in own.items()})
    os.environ.update(env)
    os.chdir(root / "cwd")
    tempfile.tempdir = str(root / "tmp")
    subprocess.Popen.__init__ = _block
    os.fork = os.posix_spawn = os.posix_spawnp = _block

    def hung(*_):
        raise _Hung()
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    try:
        yield root
    finally:
        signal.alarm(0)
        subprocess.Popen.__init__, os.fork, os.posix_spawn, os.posix_spawnp = saved
        tempfile.tempdir = tmp
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        shutil.rmtree(root, ignore_errors=True)


FUZZ_STATS: dict[str, dict] = {}  # per command: examples, exits, seconds (printed by the last test)


@pytest.mark.parametrize("path,cmd", FUZZED, ids=[" ".join(p) for p, _ in FUZZED])
def test_fuzz_each_command_ends_in_a_result_or_one_line_and_leaves_nothing(path, cmd):
    """Per command, EXAMPLES command lines drawn from its declared options and junk environment."""
    path = tuple(path)
    stats = FUZZ_STATS.setdefault(" ".join(path), {"examples": 0, "exits": {}, "seconds": 0.0, "blocked": 0})
    kids = {c.pid for c in psutil.Process().children(recursive=True)}

    @FUZZ
    @given(argv=fuzz_line(path, cmd), env=ENVIRONMENTS)
    def one(argv, env):
        # the session's QEMU guests (tests/vm) start beside the host's tests: none starts while the
        # sandbox blocks process starts in this process, and theirs are not this command's children
        with harness.START_GATE:
            check(argv, env)

    def check(argv, env):
        t0 = time.monotonic()
        with sandbox(env) as root:
            argv = [a.replace("{SB}", str(root)) for a in argv]
            before = _tree(root, INPUTS)
            try:
                code, _, err = invoke(*argv)
            except _Hung:
                pytest.fail(f"no result within {HANG_S} s: tilewise {' '.join(argv)}")
            after = _tree(root, INPUTS)
        stats["examples"] += 1
        stats["exits"][code] = stats["exits"].get(code, 0) + 1
        stats["seconds"] += time.monotonic() - t0
        stats["blocked"] += "the fuzz sandbox starts no process" in err
        event(f"exit {code}")
        where = f"tilewise {' '.join(argv)} (env {env})"
        assert code in (0, 1, 2), (where, code, err)
        assert_one_error_line(code, err, expect_code=None)
        if code:
            assert err.strip().splitlines()[-1].startswith("Error: "), (where, err)
            assert len([ln for ln in err.splitlines() if ln.startswith("Error:")]) == 1, (where, err)
            left, gone = changes(root, before, after)
            assert not left and not gone, (where, err, sorted(left)[:5], sorted(gone)[:5])
        guests = harness.live_pids()  # first: a guest's QEMU leaves it only once reaped
        now = {c.pid for c in psutil.Process().children(recursive=True)} - guests
        assert now <= kids, (where, now - kids)
        assert _dev_null_intact(), (where, "replaced /dev/null (restored)")

    one()


def test_fuzz_figures_per_command():
    """The fuzz's figures (cases, exits, time per command), printed with -s and kept in
    $TILEWISE_FUZZ_REPORT when set; runs after the fuzz in file order."""
    if not FUZZ_STATS:
        pytest.skip("the fuzz did not run in this session")
    lines = [f"{k}: {v['examples']} cases, exits {dict(sorted(v['exits'].items()))}, {v['blocked']} reached a process "
             f"start, {v['seconds']:.1f} s" for k, v in sorted(FUZZ_STATS.items())]
    print("\n".join(lines))
    if os.environ.get("TILEWISE_FUZZ_REPORT"):
        Path(os.environ["TILEWISE_FUZZ_REPORT"]).write_text("\n".join(lines) + "\n")
    assert all(v["examples"] for v in FUZZ_STATS.values())
