"""Where tilewise keeps its files: the one resolver for state and cache directories.

The XDG base directories come from platformdirs; the rules on top of them are tilewise's own:

| what | first match wins |
|---|---|
| state: undo journals and locks (``state_dir``) | ``$TILEWISE_STATE_DIR``; ``/run/tilewise`` for root (reset at boot, like everything recorded there); ``$XDG_RUNTIME_DIR/tilewise``; the user state directory (``$XDG_STATE_HOME/tilewise``, else ``~/.local/state/tilewise``) |
| clusters: `tilewise up` state files, logs, work dirs (``cluster_dir``) | ``$TILEWISE_CLUSTER_DIR``; ``$XDG_RUNTIME_DIR/tilewise/clusters``; ``cache_dir("clusters")`` |
| caches: data sets, engines' installs, the test guests' files (``cache_dir(kind)``) | the caller's own variable when it has one (``$TILEWISE_TRINO_HOME``, ``$TILEWISE_VM_CACHE``); ``$XDG_CACHE_HOME/tilewise/<kind>``, else ``~/.cache/tilewise/<kind>`` |
| a run's own scratch directory: sockets, logs, spill, generator output (``scratch_base``) | the temporary directory (``$TMPDIR``), or ``/tmp`` when that is too long for the Unix sockets inside it |
| scratch that is read like /proc, many times a second (``memory_base``) | ``/dev/shm`` where it is writable, else ``scratch_base()`` |

An empty variable counts as unset; platformdirs, following the XDG spec, also ignores a relative
``$XDG_CACHE_HOME``/``$XDG_STATE_HOME``. ``$XDG_RUNTIME_DIR`` is taken as it is (platformdirs'
runtime directory would check its owner and mode, warn, and fall back to /run/user/<uid> or /tmp:
tilewise has always used the variable as given, and falls back to the state directory instead).
Nothing here creates a directory: each user creates (and reports failing to create) its own.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from tilewise import envvars

APP = "tilewise"
STATE_VAR = envvars.STATE_DIR.name
CLUSTER_VAR = envvars.CLUSTER_DIR.name
ROOT_STATE_DIR = Path("/run/tilewise")


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _runtime_dir() -> Path | None:
    d = _env("XDG_RUNTIME_DIR")
    return Path(d) / APP if d else None


def state_dir(*, euid: int | None = None) -> Path:
    """Undo journals and locks (tilewise.changes). euid: whose directory (default: this process's)."""
    if d := envvars.STATE_DIR.value():
        return d
    if (os.geteuid() if euid is None else euid) == 0:
        return ROOT_STATE_DIR
    if runtime := _runtime_dir():
        return runtime
    return platformdirs.user_state_path(APP)


def cluster_dir() -> Path:
    """State files of the clusters `tilewise up` started, with their logs and work directories."""
    if d := envvars.CLUSTER_DIR.value():
        return d
    if runtime := _runtime_dir():
        return runtime / "clusters"
    return cache_dir("clusters")


def cache_dir(kind: str, *, override: envvars.Var | str | None = None) -> Path:
    """The cache of one kind of thing (a data set, an engine's install). override: the caller's own
    environment variable (a Var, or its name) that, when set, names the directory itself."""
    if isinstance(override, str):
        override = envvars.Var(override, envvars.directory, "a directory",
                               "set it to a directory tilewise can write, or unset it")
    if override and (d := override.value()):
        return d
    return platformdirs.user_cache_path(APP) / kind


# a run's own directory holds Unix sockets (sun_path: 108 bytes); below this length the temporary
# directory leaves room for them
SHORT_TMP = 64


def scratch_base(tmp: str | None = None) -> str:
    """Where a run's own directory goes: the temporary directory ($TMPDIR), or /tmp when that is too
    long for the sockets inside it (a long TMPDIR must not make a benchmark fail)."""
    tmp = tmp or tempfile.gettempdir()
    if len(tmp) > SHORT_TMP and os.access("/tmp", os.W_OK | os.X_OK):
        return "/tmp"
    return tmp


def memory_base() -> str:
    """tmpfs (/dev/shm) where there is one: scratch files read as often as /proc's are cheapest in
    memory; else scratch_base()."""
    d = "/dev/shm"
    return d if os.path.isdir(d) and os.access(d, os.W_OK) else scratch_base()
