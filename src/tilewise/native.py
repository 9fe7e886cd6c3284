"""Paths of the native tools (probes, workloads) built by `make setup` into tilewise/_bin."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tilewise.errors import UsageError

BIN_DIR = Path(os.environ.get("TILEWISE_BIN_DIR", Path(__file__).resolve().parent / "_bin"))


def binary(name: str) -> str:
    path = BIN_DIR / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"native tool {name} is not built (looked in {BIN_DIR})", "run `make setup` in the tilewise checkout")
    return str(path)


def python_worker(module: str, *args: str, env: dict | None = None) -> tuple[list[str], dict]:
    """(argv, environment) that run `python -m module args` with this interpreter and this tilewise
    (a worktree's sources included: the child imports the tilewise running now)."""
    e = dict(os.environ if env is None else env)
    src = str(Path(__file__).resolve().parent.parent)
    e["PYTHONPATH"] = src + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return [sys.executable, "-m", module, *args], e
