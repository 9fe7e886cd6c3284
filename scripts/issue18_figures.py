#!/usr/bin/env python3
"""The before/after figures of issue 18, read with ast from a source tree (nothing is imported or run).

    python scripts/issue18_figures.py                      # this checkout's src/
    python scripts/issue18_figures.py --rev c6e73bd        # a commit (git archive into a temporary folder)
    python scripts/issue18_figures.py --rev c6e73bd --rev HEAD --json
    python scripts/issue18_figures.py --rev HEAD --list    # + every command's length, every name branch

Prints, per tree:
- function-local imports of tilewise modules (statements, in total and outside tilewise/cli/), the
  largest module and the import circles: scripts/import_graph.py's scan, unchanged;
- lines per command body: every function under src/tilewise/cli/ decorated as a click command
  (`@click.command`, `@<group>.command`) or passed to `click.command(...)` (a factory such as
  bench_tpch.make_command); its body is the lines from its first statement after the docstring to
  its last line (blank and comment lines inside included); a command whose body is one call to a
  function of its own file is measured by that function; max, median, and the commands over
  --limit (60) lines;
- engine-name and benchmark-name branches: comparisons (==, !=, in, not in, also against a tuple,
  list or set of names), `match` cases and `.startswith()` on a name string, and dict literals keyed
  by two or more names (a per-engine table); a name in a text, a default value or a one-key record
  is not a branch. Counted outside engines/ (benchmarks/) as a whole, and outside each name's own
  package (engines/<name>/ or engines/<name>*.py, benchmarks/<name>/) and the registries
  (engines/__init__.py, benchmarks/__init__.py). A result-kind or data-format name that equals a
  benchmark's ("tpch") is still counted: --list shows each hit, to be judged.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES = ("duckdb", "spark", "trino")
BENCHMARKS = ("tpch", "jcch", "tpcds")


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", HERE / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _is_command_decorator(d: ast.expr) -> bool:
    f = d.func if isinstance(d, ast.Call) else d
    return (isinstance(f, ast.Attribute) and f.attr == "command") or (isinstance(f, ast.Name) and f.id == "command")


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _body_lines(fn: ast.FunctionDef) -> int:
    body = _body(fn)
    return 0 if not body else fn.end_lineno - body[0].lineno + 1


def _delegate(fn: ast.FunctionDef, funcs: dict[str, ast.FunctionDef]) -> ast.FunctionDef | None:
    """The function of the same file a command hands all its work to (its body is one call to it)."""
    body = _body(fn)
    if len(body) != 1 or not isinstance(body[0], (ast.Expr, ast.Return)) or not isinstance(body[0].value, ast.Call):
        return None
    f = body[0].value.func
    return funcs.get(f.id) if isinstance(f, ast.Name) and f.id != fn.name else None


def command_bodies(pkg_dir: Path) -> list[dict]:
    """Every click command function under cli/ (decorated, or passed to click.command(...)): file,
    function, body lines. A command whose body is one call to a function of its own file (`up` ->
    `_start`, `bench tpch` -> `_run`) is measured by that function's body: the work is there."""
    out = []
    for f in sorted((pkg_dir / "cli").rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        cmds = [n for n in funcs.values() if any(_is_command_decorator(d) for d in n.decorator_list)]
        cmds += [funcs[c.args[0].id] for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Call)
                 and _is_command_decorator(c.func) and c.args and isinstance(c.args[0], ast.Name)
                 and c.args[0].id in funcs]
        for node in cmds:
            d = _delegate(node, funcs)
            out.append({"file": str(f.relative_to(pkg_dir.parent)), "function": node.name, "line": node.lineno,
                        "lines": _body_lines(d if d is not None else node),
                        "via": d.name if d is not None else None})
    return out


def _names_in(node: ast.expr, names: set[str]) -> list[str]:
    """The names a string constant, or a tuple/list/set of them, holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value.lower()] if node.value.lower() in names else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _names_in(e, names)]
    return []


def name_branches(pkg_dir: Path, names: tuple[str, ...]) -> list[dict]:
    """Every branch on one of `names` (see the module's docstring) in the package."""
    want = set(names)
    hits = []
    for f in sorted(pkg_dir.rglob("*.py")):
        rel = str(f.relative_to(pkg_dir.parent))
        lines = f.read_text().splitlines()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            found, how = [], ""
            if isinstance(node, ast.Compare):
                found = [n for x in [node.left, *node.comparators] for n in _names_in(x, want)]
                how = "compare"
            elif isinstance(node, ast.match_case):
                found = [n for p in ast.walk(node.pattern) if isinstance(p, ast.MatchValue)
                         for n in _names_in(p.value, want)]
                how = "match"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "startswith", "endswith"):
                found = [n for a in node.args for n in _names_in(a, want)]
                how = node.func.attr
            elif isinstance(node, ast.Dict):
                keys = [n for k in node.keys if k is not None for n in _names_in(k, want)]
                found, how = (keys, "table") if len(keys) >= 2 else ([], "")
            if found:
                line = getattr(node, "lineno", getattr(getattr(node, "pattern", None), "lineno", 0))
                hits.append({"file": rel, "line": line, "kind": how, "names": sorted(set(found)),
                             "text": lines[line - 1].strip()[:140] if line else ""})
    return hits


def _outside(hits: list[dict], folder: str, registry: str) -> tuple[list[dict], list[dict]]:
    """(hits outside tilewise/<folder>/, hits outside each name's own package and the registry)."""
    top = [h for h in hits if not h["file"].startswith(f"tilewise/{folder}/")]
    own = []
    prefix = f"tilewise/{folder}/"
    for h in hits:
        f = h["file"]
        if f == prefix + registry:
            continue
        first = f[len(prefix):].split("/")[0] if f.startswith(prefix) else ""
        if first and all(first == n or (first.endswith(".py") and first.startswith(n)) for n in h["names"]):
            continue  # engines/<name>/... or, before the packages, engines/<name>*.py
        own.append(h)
    return top, own


def figures(src: Path, limit: int) -> dict:
    g = _import_graph().scan(src)
    pkg = src / "tilewise"
    cmds = command_bodies(pkg)
    sizes = [c["lines"] for c in cmds]
    eng_top, eng_own = _outside(name_branches(pkg, ENGINES), "engines", "__init__.py")
    bm_top, bm_own = _outside(name_branches(pkg, BENCHMARKS), "benchmarks", "__init__.py")
    return {
        "function_local_imports": g["function_local"],
        "function_local_imports_outside_cli": g["function_local_outside_cli"],
        "largest_module": g["largest"],
        "import_circles": len(g["circles_all_imports"]),
        "import_circles_module_level": len(g["circles_module_level"]),
        "commands": len(cmds),
        "command_body_max": max(sizes, default=0),
        "command_body_median": statistics.median(sizes) if sizes else 0,
        "commands_over_limit": sorted(({"command": f"{c['file']}:{c['function']}", "lines": c["lines"]}
                                       for c in cmds if c["lines"] > limit), key=lambda c: -c["lines"]),
        "command_bodies": cmds,
        "engine_branches_outside_engines": len(eng_top),
        "engine_branches_outside_own_package": len(eng_own),
        "benchmark_branches_outside_benchmarks": len(bm_top),
        "benchmark_branches_outside_own_package": len(bm_own),
        "engine_branch_list": eng_own,
        "benchmark_branch_list": bm_own,
    }


def _tree(rev: str, tmp: Path) -> Path:
    """src/ of git revision rev, unpacked under tmp."""
    repo = HERE.parent
    dest = tmp / rev.replace("/", "_")
    dest.mkdir()
    data = subprocess.run(["git", "-C", str(repo), "archive", rev, "src"], check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="data")
    return dest / "src"


def _print(label: str, r: dict, limit: int, full: bool) -> None:
    print(f"== {label}")
    print(f"function-local imports of tilewise modules: {r['function_local_imports']} "
          f"({r['function_local_imports_outside_cli']} outside tilewise/cli/)")
    print(f"largest module: {r['largest_module']['module']} ({r['largest_module']['lines']} lines)")
    print(f"import circles: {r['import_circles']} (module-level imports only: {r['import_circles_module_level']})")
    print(f"command bodies: {r['commands']} commands, max {r['command_body_max']} lines, "
          f"median {r['command_body_median']:g}; over {limit}: "
          + (", ".join(f"{c['command']} ({c['lines']})" for c in r["commands_over_limit"]) or "none"))
    print(f"engine-name branches: {r['engine_branches_outside_engines']} outside engines/, "
          f"{r['engine_branches_outside_own_package']} outside each engine's own package and the registry")
    print(f"benchmark-name branches: {r['benchmark_branches_outside_benchmarks']} outside benchmarks/, "
          f"{r['benchmark_branches_outside_own_package']} outside each benchmark's own package and the registry")
    if full:
        for c in sorted(r["command_bodies"], key=lambda c: -c["lines"]):
            via = f" (its body: {c['via']})" if c["via"] else ""
            print(f"  command {c['lines']:4} {c['file']}:{c['line']} {c['function']}{via}")
        for key in ("engine_branch_list", "benchmark_branch_list"):
            for h in r[key]:
                print(f"  {key.split('_')[0]} branch {h['file']}:{h['line']} [{h['kind']}] {h['text']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", action="append", default=[], help="a git revision (repeatable); default: this src/")
    ap.add_argument("--src", default=None, help="a source folder holding tilewise/ (default: this checkout's src/)")
    ap.add_argument("--limit", type=int, default=60, help="command body lines counted as over (default 60)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="every command's length and every name branch")
    a = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rev in a.rev:
            results[rev] = figures(_tree(rev, Path(tmp)), a.limit)
        if not a.rev or a.src:
            src = Path(a.src) if a.src else HERE.parent / "src"
            results[str(src)] = figures(src, a.limit)
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    for label, r in results.items():
        _print(label, r, a.limit, a.list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
