"""The import graph: no circle anywhere in src/, the layers of pyproject.toml's import-linter
contracts hold, and outside the command line no module imports tilewise modules inside functions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

import tilewise
from conftest import REPO

SRC = Path(tilewise.__file__).resolve().parent.parent  # the tilewise these tests import
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


# The rule: function-local imports of tilewise modules only for CLI dispatch and heavy optional
# third-party modules. Every module outside tilewise.cli imports the tilewise modules it uses at
# the top, except these (module: why).
LOCAL_IMPORTS_ALLOWED = {
    # topology.load imports the hwloc XML and synthetic loaders only for those sources: every command
    # loads a topology first, most of them this machine's (sysfs), and those two pull in an XML parser
    # and decimal (start-up time: scripts/bench_cli_speed.py; `elastic` must reach its admission check fast)
    "tilewise.topology",
    # its own command line (`python -m tilewise.bench.plain_duckdb`, the harness-overhead baseline,
    # "no tilewise in the loop"): it imports as little of tilewise as the options it is given need
    "tilewise.bench.plain_duckdb",
}


def _import_graph_script():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _circles(package: str) -> set[frozenset[str]]:
    """Strongly connected components of the module graph, every import counted (function-local
    ones too, as import-linter counts them), each module importing only the modules it names."""
    g = grimp.build_graph(package, cache_dir=None)
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    return {frozenset(c) for c in _import_graph_script().circles(edges)}


def test_there_is_no_import_circle_in_src():
    found = _circles("tilewise")
    assert not found, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_a_circle_through_a_function_local_import_is_found(tmp_path, monkeypatch):
    # what launch <-> changes was: a module-level import one way, a function-local one back
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def members():\n    from circ import high\n    return high.Tree\n")
    (pkg / "high.py").write_text("from circ import low\n\nclass Tree:\n    pass\n")
    (pkg / "alone.py").write_text("from circ import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _circles("circ") == {frozenset({"circ.low", "circ.high"})}
    r = _import_graph_script().scan(tmp_path, "circ")
    assert r["circles_all_imports"] == [["circ.high", "circ.low"]] and r["circles_module_level"] == []
    assert r["function_local"] == 1 and r["function_local_list"] == ["circ/low.py:2 circ.high"]


def test_the_import_layer_contracts_hold():
    if not LINT_IMPORTS.exists():
        pytest.fail(f"import-linter is not installed next to {sys.executable}: pip install -e '.[dev]'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cp = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", "--config", str(REPO / "pyproject.toml")],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in cp.stdout


def _module_of(line: str) -> str:
    """'tilewise/x/y.py:12 tilewise.z' (scripts/import_graph.py --list) -> 'tilewise.x.y'."""
    return line.split(":")[0].removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def test_outside_the_command_line_tilewise_is_imported_at_module_level_only():
    r = _import_graph_script().scan(SRC)
    local = [line for line in r["function_local_list"] if (m := _module_of(line)) != "tilewise.cli"
             and not m.startswith("tilewise.cli.") and m not in LOCAL_IMPORTS_ALLOWED]
    assert local == [], "function-local imports of tilewise modules: " + ", ".join(local)
    gone = LOCAL_IMPORTS_ALLOWED - {_module_of(line) for line in r["function_local_list"]}
    assert not gone, f"no function-local imports left in {', '.join(sorted(gone))}: delete from LOCAL_IMPORTS_ALLOWED"


def test_engines_and_benchmarks_are_independent_layers_above_the_data():
    layers = next(c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                  if c["id"] == "layers")["layers"]
    at = {name.strip(): i for i, layer in enumerate(layers) for name in layer.replace(":", "|").split("|")}
    assert "tilewise.engines | tilewise.benchmarks" in layers, "an engine never sees a benchmark, nor the reverse"
    assert at["tilewise.engines"] == at["tilewise.benchmarks"] < at["tilewise.data"]
