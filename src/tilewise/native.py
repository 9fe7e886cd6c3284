"""Paths of the native tools (probes, workloads) built by `make setup` into tilewise/_bin."""

from __future__ import annotations

import os
from pathlib import Path

from tilewise.errors import UsageError

BIN_DIR = Path(os.environ.get("TILEWISE_BIN_DIR", Path(__file__).resolve().parent / "_bin"))


def binary(name: str) -> str:
    path = BIN_DIR / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"native tool {name} is not built (looked in {BIN_DIR})", "run `make setup` in the tilewise checkout")
    return str(path)
