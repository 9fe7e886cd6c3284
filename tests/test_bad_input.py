"""Bad input on the newer commands (issue 31): each case the report named, through the real entry point
in the fuzz's sandbox (tests/test_cli_inputs.py: no process may start, its own cache, state and
working directories). Each ends in exactly one `Error:` line naming what is wrong, with exit 1 or 2,
and leaves the sandbox and its input files as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from test_cli_inputs import FILES, INPUTS, _tree, assert_one_error_line, changes, invoke, sandbox
from tilewise import envvars, userfiles
from tilewise.cli import modes
from tilewise.errors import UsageError

ONE_NODE = "synthetic:Package:1 [NUMANode] Core:2 PU:1"
F = {k: str(v) for k, v in FILES.items()}


def _tables(d: Path, tables: list[str], damaged: str | None = None) -> str:
    """Tiny Parquet files for tables (the one named damaged cut short): what `data check --dir` reads."""
    d.mkdir(parents=True, exist_ok=True)
    for t in tables:
        pq.write_table(pa.table({"x": [1]}), d / f"{t}.parquet")
    if damaged:
        p = d / f"{damaged}.parquet"
        p.write_bytes(p.read_bytes()[:30])
    return str(d)


JCCH = ["customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"]
CHECK_DIR = _tables(INPUTS / "jcch-damaged", JCCH, damaged="nation")
SCHEMA_MISMATCH = INPUTS / "tables-schema"
SCHEMA_MISMATCH.mkdir()
(SCHEMA_MISMATCH / "t.csv").write_text("a,b\n1,x\n")
(SCHEMA_MISMATCH / "schema.json").write_text(json.dumps(
    {"format": "tilewise-schema/1", "tables": {"t": {"format": "csv", "columns": [["a", "int64"], ["b", "int64"]],
                                                      "delimiter": ",", "header": True, "trailing": False}}}))

# (class, argv, environment, what the one line says)
CASES = [
    # 1: files read through one reader
    ("1", ["data", "check", "--dir", CHECK_DIR], {}, "nation.parquet: is not a Parquet file"),
    ("1", ["data", "layout", "--data", F["tables-cut/t.parquet"].rsplit("/", 1)[0], "--sql", F["query.sql"]], {},
     "is not a Parquet file"),
    ("1", ["data", "layout", "--data", F["tables-text/t.parquet"].rsplit("/", 1)[0], "--sql", F["query.sql"]], {},
     "is not a Parquet file"),
    ("1", ["up", "--data", F["tables-cut/t.parquet"].rsplit("/", 1)[0]], {}, "is not a Parquet file"),
    ("1", ["bench", "tpch", "--config", F["image.png"]], {}, "is not text: byte 0x89 at line 1"),
    ("1", ["exec", "--plan", F["image.png"], "--", "true"], {}, "plan"),
    ("1", ["elastic", "--dry-run", "--trace", F["image.png"]], {}, "trace"),
    ("1", ["query", "-f", F["image.png"]], {}, "--file"),
    ("1", ["report", F["results-png/results.json"].rsplit("/", 1)[0]], {}, "not a results document (not text)"),
    ("1", ["report", F["deep.json"]], {}, "nests deeper than 128 levels"),
    ("1", ["bench", "tpch", "--config", F["deep.json"]], {}, "nests deeper than 128 levels"),
    ("1", ["exec", "--plan", F["deep.json"], "--", "true"], {}, "nests deeper than 128 levels"),
    ("1", ["report", F["results-strings.json"]], {}, "metrics[0].values[0] is not a number (found str 'fast')"),
    ("1", ["up", "--data", F["tables-dup/t.csv"].rsplit("/", 1)[0]], {}, "column 'a' is named twice"),
    ("1", ["bench", "tpch"], {"TILEWISE_STATE_DIR": F["image.png"]}, "TILEWISE_STATE_DIR="),
    ("1", ["up"], {"TILEWISE_STATE_DIR": F["image.png"]}, "is not a directory: it is a file"),
    ("1", ["topo", "--topology", F["fifo"]], {}, "is a FIFO (named pipe), not a file"),
    ("1", ["exec", "--plan", F["plan-bad.json"], "--", "true"], {}, "malformed plan"),
    # 2: options that do not apply are refused
    ("2", ["bench", "tpcds", "--params", "qualification", "--seed", "5"], {}, "--seed applies only to drawn parameters"),
    ("2", ["bench", "tpcds", "--tests", "power", "--streams", "3"], {}, "--streams applies only to the throughput test"),
    ("2", ["bench", "tpcds", "--tests", "power,power"], {}, "--tests names power twice"),
    ("2", ["bench", "tpch", "--layout-dir", "x"], {}, "--layout-dir applies only to --layout"),
    ("2", ["data", "layout", "--data", F["folder"], "--sf", "0.01"], {}, "--sf applies only to a benchmark's own tables"),
    ("2", ["data", "layout", "--data", F["folder"], "--raw", "tbl"], {}, "--raw applies only"),
    ("2", ["data", "layout", "--data", F["folder"], "--sql", F["query.sql"], "--queries", "1"], {},
     "--queries applies only to a benchmark's queries"),
    ("2", ["data", "check", "--dir", F["folder"], "--generate"], {}, "--generate applies only to the cached set"),
    ("2", ["up", "--data", F["folder"], "--layout-dir", "x"], {}, "--layout-dir applies only to --crack"),
    ("2", ["up", "--raw", "csv"], {}, "--raw applies only to --sf"),
    ("2", ["up", "--host", "999.1.1.1"], {}, "'999.1.1.1' is not an IP address"),
    ("2", ["up", "--host", "10.255.255.254"], {}, "this machine cannot listen there"),
    ("2", ["workload", "W1", "--variants", "eager"], {}, "--variants applies to the tensor workloads T1-T3, not W1"),
    ("2", ["workload", "W1", "--rename", "none"], {}, "--rename applies to T1 and T2, not W1"),
    ("2", ["workload", "W1", "--bincount-memory", "1GB"], {}, "--bincount-memory applies to T1 and T2, not W1"),
    ("2", ["workload", "T1", "--ops", "5"], {}, "--ops applies to the allocator microbenchmark (alloc), not T1"),
    ("2", ["plan", "--topology", ONE_NODE, "--mem", "weighted-interleave"], {}, "has only node(s) 0 to interleave over"),
    ("2", ["probe", "memory", "--threads", "65536"], {}, "more than any initiator's CPUs"),
    ("2", ["report", F["results-strings.json"].replace("results-strings.json", "results-png"), "--plot", "p.png"], {},
     "--plot applies only to a comparison of two or more results"),
    ("2", ["plan", "--save", F["fifo"]], {}, "is a FIFO (named pipe), not a file"),
    ("2", ["topo", "--export", "/dev/null"], {}, "is a character device, not a file"),  # it replaced /dev/null
    ("2", ["plan", "--save", "/dev/null"], {}, "is a character device, not a file"),
    ("2", ["elastic", "--dry-run", "--trace", F["trace-nan.csv"]], {}, "load is nan, not a finite number"),
    ("2", ["elastic", "--dry-run", "--trace", F["trace-backwards.csv"]], {}, "time runs backwards (0.5 after 1)"),
    # 3: nothing is written before the input is accepted (the sandbox check below is the point)
    ("3", ["bench", "tpch", "--sf", "0.01", "--layout", "bogus"], {}, "unknown layout 'bogus'"),
    ("3", ["bench", "tpcds", "--sf", "0.01", "--layout", "parquet-0"], {}, "0 files per table is out of range"),
    ("3", ["bench", "tpcds", "--sf", "0.01", "--data-dir", F["image.png"]], {}, "--data-dir"),
    ("3", ["data", "layout", "--data", str(SCHEMA_MISMATCH), "--sql", F["query.sql"]], {},
     "column b: Could not convert string"),
    # 4: messages that say what is wrong
    ("4", ["topo", "--topology", "sysfs:"], {}, "--topology sysfs: names no directory"),
    ("4", ["up", "--data", str(INPUTS / "tables-ok"), "--layout-dir", "/proc/nope", "--crack",
           "auto"], {}, "--layout-dir"),
]


def _id(cls: str, argv: list[str]) -> str:
    return f"{cls}:" + " ".join(Path(a).name if a.startswith("/") else a for a in argv[:4])


@pytest.mark.parametrize("cls,argv,env,says", CASES, ids=[_id(c, a) for c, a, _, _ in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(cls, argv, env, says):
    with sandbox(env) as root:
        before = _tree(root, INPUTS)
        code, _, err = invoke(*argv)
        after = _tree(root, INPUTS)
    assert code in (1, 2), (argv, code, err)
    assert_one_error_line(code, err, expect_code=None)
    assert err.strip().splitlines()[-1].startswith("Error: ") and says in err, (argv, err)
    left, gone = changes(root, before, after)
    assert not left and not gone, (argv, err, sorted(left)[:5], sorted(gone)[:5])


def test_a_bad_engine_variable_is_why_engines_list_says_it_cannot_run():
    with sandbox({"TILEWISE_POSTGRES_PORT": "notaport"}):
        code, out, err = invoke("engines", "list")
        assert code == 0, err
        line = next(ln for ln in out.splitlines() if ln.startswith("postgres"))
        assert "cannot run: TILEWISE_POSTGRES_PORT='notaport' is not a port number (1024-65535)" in line
        code, out, _ = invoke("engines", "list", "--json")
        row = next(r for r in json.loads(out) if r["engine"] == "postgres")
        assert not row["usable"] and "TILEWISE_POSTGRES_PORT" in row["missing"]


# ---- the mechanisms, unit by unit ----------------------------------------------------------------------

def test_the_reader_names_each_kind_of_unreadable_file(tmp_path):
    cases = {"missing": "does not exist", "folder": "is a folder, not a file", "fifo": "is a FIFO",
             "dangling": "is a link to", "loop": "is a link that loops", "under-a-file": "is a file, not a folder"}
    for name, says in cases.items():
        with pytest.raises(UsageError, match=says):
            userfiles.read_text(FILES[name], "the thing")
    with pytest.raises(UsageError, match=r"is not text: byte 0x89 at line 1 \(offset 0\) is not UTF-8"):
        userfiles.read_text(FILES["image.png"], "the thing")
    p = tmp_path / "late.txt"
    p.write_bytes(b"ok\nok\n\xff")
    with pytest.raises(UsageError, match="at line 3"):
        userfiles.read_text(p)
    with pytest.raises(UsageError, match=r"is not valid JSON \(Expecting .* at line 1 column"):
        userfiles.read_json(FILES["broken.json"])
    with pytest.raises(UsageError, match="nests deeper than 128 levels"):
        userfiles.read_json(FILES["deep.json"])
    shallow = tmp_path / "129.json"
    shallow.write_text("[" * 129 + "]" * 129)  # too deep for tilewise, not for Python's parser
    with pytest.raises(UsageError, match="nests deeper"):
        userfiles.read_json(shallow)
    assert userfiles.read_json(FILES["list.json"]) == [1, 2, 3]
    assert userfiles.read_text(FILES["empty"]) == ""
    with pytest.raises(UsageError, match="is empty, not a Parquet file"):
        userfiles.parquet_file(FILES["empty"])
    assert userfiles.depth({"a": [1, {"b": []}]}) == 4 and userfiles.depth(5) == 0


def test_output_files_are_checked_without_making_anything(tmp_path):
    assert userfiles.output_problem(tmp_path / "new.json") is None
    assert "folder" in userfiles.output_problem(tmp_path)
    assert "FIFO" in userfiles.output_problem(FILES["fifo"])
    assert "does not exist" in userfiles.output_problem(tmp_path / "no" / "x.json")
    assert list(tmp_path.iterdir()) == []
    from tilewise import fsutil

    with pytest.raises(UsageError, match="is not a regular file"):  # the last line of defence: never swapped
        fsutil.atomic_write(FILES["fifo"], "x")
    assert Path(FILES["fifo"]).is_fifo()


def test_environment_variables_are_declared_and_parsed_once():
    calls = []

    def parse(text):
        calls.append(text)
        return int(text)

    var = envvars.Var("TILEWISE_TEST_ONCE", parse, "a number", "fix it")
    assert var.value({"TILEWISE_TEST_ONCE": "7"}) == 7 and var.value({"TILEWISE_TEST_ONCE": "7"}) == 7
    assert calls == ["7"] and var.value({}) is None and var.value({"TILEWISE_TEST_ONCE": " "}) is None
    port = envvars.Var("P", envvars.port(1024), "a port", "unset it")
    assert envvars.problem([port], {"P": "80"}) == "P='80' is not a port number (1024-65535); unset it"
    assert envvars.problem([port], {"P": "8080"}) is None
    d = envvars.Var("D", envvars.directory, "a directory", "unset it")
    assert "is not a directory: it is a file" in envvars.problem([d], {"D": str(FILES["image.png"])})
    assert "a part of the path is a file" in envvars.problem([d], {"D": str(FILES["under-a-file"])})
    from tilewise import engines

    names = {v.name for s in engines.specs() for v in s.env}
    assert {"TILEWISE_POSTGRES_PORT", "TILEWISE_TRINO_START_TIMEOUT", "TILEWISE_TILES_CACHE"} <= names


def test_modes_are_data_checked_once_and_shown_in_help():
    import click

    @click.command("t")
    @click.option("--data")
    @click.option("--sf")
    def t(data, sf):
        return "ran"

    with pytest.raises(AssertionError, match="none of its parameters"):  # a misspelt name checks nothing
        modes.declare(modes.Mode("x", lambda a: True, ("sf_typo",)))(t)
    cmd = modes.declare(modes.Mode("a benchmark's tables", lambda a: a["data"] is None, ("sf",)))(t)
    assert "[only for a benchmark's tables]" in cmd.get_help(click.Context(cmd))
    assert cmd.main(["--sf", "1"], standalone_mode=False) == "ran"
    with pytest.raises(UsageError, match="--sf applies only to a benchmark's tables; drop it"):
        cmd.main(["--data", "d", "--sf", "1"], standalone_mode=False)
    assert cmd.main(["--data", "d"], standalone_mode=False) == "ran"  # a default is never refused
