"""tilewise's environment variables, declared once: each one's name, what it holds and how to fix a
bad value. ``value(VAR)`` parses it (None when unset or empty) or raises one UsageError that names the
variable, the value and the fix; ``problem(vars)`` says the same as text, for `engines list` to give as
the reason an engine cannot run. A value is parsed once per distinct text (the parse is cached), so a
variable reads the same wherever it is used.

Engines declare the variables they read in their spec (``EngineSpec.env``); the variables of tilewise
itself are here.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilewise import userfiles
from tilewise.errors import UsageError


@dataclass(frozen=True)
class Var:
    name: str
    parse: Callable[[str], Any]  # the value, or ValueError saying what is wrong with it
    holds: str  # what it holds, for messages: "a port number (1024-65535)"
    fix: str  # what to do about a bad value

    def value(self, environ: Mapping[str, str] | None = None) -> Any:
        text = (os.environ if environ is None else environ).get(self.name)
        if text is None or not text.strip():
            return None
        return _parsed(self, text)


@functools.lru_cache(maxsize=256)
def _parsed(var: Var, text: str) -> Any:
    try:
        return var.parse(text)
    except ValueError as e:
        why = str(e) or f"is not {var.holds}"
        raise UsageError(f"{var.name}={text!r} {why}", var.fix) from None


def problem(variables, environ: Mapping[str, str] | None = None) -> str | None:
    """The first bad value among variables, as one line; None when every one is unset or good."""
    for v in variables:
        try:
            v.value(environ)
        except UsageError as e:
            return str(e)
    return None


# ---- parsers --------------------------------------------------------------------------------------

def port(lowest: int = 1024) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text.strip())
        except ValueError:
            raise ValueError(f"is not a port number ({lowest}-65535)") from None
        if not lowest <= n <= 65535:
            raise ValueError(f"is not a port number ({lowest}-65535)")
        return n
    return parse


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise ValueError("is not a positive number of seconds")
    return v


def choice(*words: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        w = text.strip().lower()
        if w not in words:
            raise ValueError(f"is not one of {', '.join(words)}")
        return w
    return parse


def directory(text: str) -> Path:
    """A directory tilewise may create: an existing one, or a path whose first existing part is one."""
    p = Path(text).expanduser()
    why = userfiles.dir_problem(p)
    if why:
        raise ValueError("is not a directory: it is a file" if why.startswith("is a file") else
                         f"is not a directory: {why}")
    return p


def text(value: str) -> str:
    return value


# ---- tilewise's own ----------------------------------------------------------------------------------

STATE_DIR = Var("TILEWISE_STATE_DIR", directory, "a directory",
                "set it to a directory tilewise can write (made when missing), or unset it")
CLUSTER_DIR = Var("TILEWISE_CLUSTER_DIR", directory, "a directory",
                  "set it to a directory tilewise can write (made when missing), or unset it")
