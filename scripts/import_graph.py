#!/usr/bin/env python3
"""tilewise's own import graph, read with ast (nothing is imported or run).

    python scripts/import_graph.py [--src src] [--json] [--list]

Prints:
- function-local imports of tilewise modules: every `import tilewise...` / `from tilewise... import`
  / relative import that sits inside a function (def, async def or lambda, at any depth), counted
  as statements and as module names (`from tilewise import a, b` inside a function is 1 statement
  naming 2 modules), in total and outside tilewise/cli/; --list names each one (file:line module);
- import circles: the strongly connected components of the module graph with more than one module,
  once over every import (module level and function-local, as import-linter sees them) and once
  over module-level imports only (those that can fail at import time).

An edge goes to the module named (`from tilewise import launch` -> tilewise.launch when that module
exists, else tilewise), the way grimp (import-linter's graph) builds it. Imports under
`if TYPE_CHECKING:` are counted apart and left out of both graphs.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PKG = "tilewise"


def module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, modules: set[str], pkg: str) -> list[str]:
    """The modules of pkg an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == pkg or a.name.startswith(pkg + ".")]
    if node.level:
        base = here.split(".") if is_pkg else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod != pkg and not mod.startswith(pkg + "."):
        return []
    out = []
    for a in node.names:
        sub = f"{mod}.{a.name}"
        out.append(sub if sub in modules else mod)
    return out


def scan(src: Path, pkg: str = PKG) -> dict:
    """The counts and circles above for package pkg under directory src."""
    files = sorted((Path(src) / pkg).rglob("*.py"))
    modules = {module_name(f, src) for f in files}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    top_edges: dict[str, set[str]] = {m: set() for m in modules}
    local: list[tuple[str, int, str, str]] = []  # (file, line, importer, imported)
    type_checking = 0
    for f in files:
        here = module_name(f, src)
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(), str(f))

        def visit(node: ast.AST, in_func: bool, in_tc: bool) -> None:
            nonlocal type_checking
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for t in _targets(child, here, is_pkg, modules, pkg):
                        if t == here:
                            continue
                        if in_tc:
                            type_checking += 1
                            continue
                        edges[here].add(t)
                        if in_func:
                            local.append((str(f.relative_to(src)), child.lineno, here, t))
                        else:
                            top_edges[here].add(t)
                    continue
                func = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                tc = in_tc or (isinstance(child, ast.If) and _is_type_checking(child.test))
                visit(child, func, tc)

        visit(tree, False, False)
    outside_cli = [x for x in local if x[2] != f"{pkg}.cli" and not x[2].startswith(f"{pkg}.cli.")]
    statements = {(p, n) for p, n, _, _ in local}
    statements_outside_cli = {(p, n) for p, n, m, _ in outside_cli}
    largest = max(files, key=lambda p: sum(1 for _ in p.open()))
    return {
        "modules": len(modules),
        "largest": {"module": module_name(largest, src), "lines": sum(1 for _ in largest.open())},
        "function_local": len(statements),
        "function_local_outside_cli": len(statements_outside_cli),
        "function_local_names": len(local),
        "function_local_names_outside_cli": len(outside_cli),
        "function_local_list": [f"{p}:{n} {t}" for p, n, _, t in local],
        "type_checking_imports": type_checking,
        "circles_all_imports": circles(edges),
        "circles_module_level": circles(top_edges),
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="name every function-local import")
    a = ap.parse_args(argv)
    r = scan(Path(a.src))
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"modules: {r['modules']}; largest: {r['largest']['module']} ({r['largest']['lines']} lines)")
    print(f"function-local imports of tilewise modules: {r['function_local']} statements "
          f"({r['function_local_outside_cli']} outside tilewise.cli), naming {r['function_local_names']} modules "
          f"({r['function_local_names_outside_cli']} outside tilewise.cli)")
    if a.list:
        for line in r["function_local_list"]:
            print("  " + line)
    for key, title in (("circles_all_imports", "every import"), ("circles_module_level", "module-level imports")):
        print(f"import circles ({title}): {len(r[key])}")
        for c in r[key]:
            print("  " + " <-> ".join(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
