"""Where PostgreSQL is, and who runs it: the server binaries, their version, the client library,
and the unprivileged user the servers run as when tilewise runs as root. Apart from the runtime so
that the spec's missing() can ask without importing it.

- Binaries: ``$TILEWISE_POSTGRES_BIN`` (a directory holding ``postgres`` and ``initdb``), else the
  newest major under /usr/lib/postgresql (Debian's layout: ``postgresql`` installs the
  distribution's current major, 15 on Debian 12), else ``postgres``/``initdb`` on PATH.
- User: ``initdb`` and ``postgres`` refuse to run as root. As root, the servers run as
  ``$TILEWISE_POSTGRES_USER``, else the system user ``tilewise`` that `make setup` creates; as
  anyone else, as the calling user.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tilewise.engines.postgres import env
from tilewise.errors import TilewiseError, UsageError
from tilewise.parts import Part, apt_install, missing_debian

BIN_VAR = env.BIN.name
USER_VAR = env.USER.name
DEFAULT_USER = "tilewise"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
PART = Part("postgres", extra="postgres", group="engines",
            size="about 60 MB: Debian's postgresql (the distribution's current major) and the client psycopg",
            what="PostgreSQL: one bound server per instance")
INSTALL_HINT = (f"run `{PART.install_command()}` (Debian's postgresql, the distribution's current major), "
                f"or set {BIN_VAR} to the directory holding postgres and initdb")
USERADD = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
           "--shell", "/usr/sbin/nologin", DEFAULT_USER]
USER_HINT = (f"run `{PART.install_command()}` (as root it creates the system user: {' '.join(USERADD)}) "
             f"or set {USER_VAR} to an existing unprivileged user")


class PostgresError(TilewiseError):
    pass


def _major(d: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", d.name)) or (0,)


def _has_server(d: Path) -> bool:
    return all(os.access(d / exe, os.X_OK) for exe in ("postgres", "initdb"))


def bindir() -> Path:
    """The directory holding the server binaries (postgres, initdb); PostgresError naming the fix."""
    given = env.BIN.value()
    if given:
        d = Path(given)
        if not _has_server(d):
            raise PostgresError(f"{BIN_VAR}={given} holds no executable postgres and initdb",
                                f"point {BIN_VAR} at the server's bin directory (e.g. /usr/lib/postgresql/15/bin) "
                                "or unset it")
        return d
    if DEBIAN_ROOT.is_dir():
        for d in sorted((p / "bin" for p in DEBIAN_ROOT.iterdir()), key=lambda p: _major(p.parent), reverse=True):
            if _has_server(d):
                return d
    on_path = shutil.which("postgres")
    if on_path and _has_server(Path(on_path).parent):
        return Path(on_path).parent
    raise PostgresError("the PostgreSQL server is not installed (no postgres and initdb found)", INSTALL_HINT)


@functools.lru_cache(maxsize=8)
def _version_of(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"(\d+(?:\.\d+)*)", out.stdout)
    if out.returncode != 0 or not m:
        raise PostgresError(f"{exe} --version failed: {(out.stderr or out.stdout).strip()[:200]}", INSTALL_HINT)
    return m.group(1)


def server_version() -> str:
    """'15.18'."""
    return _version_of(str(bindir() / "postgres"))


def major() -> int:
    return int(server_version().split(".")[0])


def client_missing() -> str | None:
    if importlib.util.find_spec("psycopg") is None:
        return f"the Python client psycopg is not installed: {INSTALL_HINT}"
    return None


def missing() -> str | None:
    """None when the server and the client are here, else exactly what to install."""
    try:
        bindir()
        server_version()
    except PostgresError as e:
        return str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return f"the PostgreSQL server cannot be run: {e}; {INSTALL_HINT}"
    return client_missing()


# ---- who runs the servers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RunAs:
    """The user the servers run as: None fields mean "the calling user" (no switch)."""

    name: str
    uid: int
    gid: int
    switch: bool  # True: tilewise is root and starts the servers as this user

    def popen_kwargs(self) -> dict:
        """What subprocess needs to start a process as this user (applied before the binding)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []} if self.switch else {}

    def env(self, base: dict) -> dict:
        env = dict(base)
        if self.switch:
            env.update({"USER": self.name, "LOGNAME": self.name, "HOME": "/"})
        return env


def run_as(euid: int | None = None, environ: dict | None = None, lookup=pwd.getpwnam) -> RunAs:
    """Who runs the servers: the calling user, or, for root, $TILEWISE_POSTGRES_USER / `tilewise`
    (UsageError naming the fix when that user does not exist or is root itself)."""
    euid = os.geteuid() if euid is None else euid
    environ = os.environ if environ is None else environ
    if euid != 0:
        try:
            name = pwd.getpwuid(euid).pw_name
        except KeyError:
            name = str(euid)
        return RunAs(name, euid, os.getegid(), False)
    name = env.USER.value(environ) or DEFAULT_USER
    try:
        pw = lookup(name)
    except KeyError:
        raise UsageError(f"PostgreSQL refuses to run as root, and the user {name!r} to run it as does not exist",
                         USER_HINT) from None
    if pw.pw_uid == 0:
        raise UsageError(f"PostgreSQL refuses to run as root, and {USER_VAR}={name} is root too",
                         f"set {USER_VAR} to an unprivileged user (default {DEFAULT_USER})")
    return RunAs(name, pw.pw_uid, pw.pw_gid, True)


# ---- installing ---------------------------------------------------------------------------------------

def install_step(version: str | None = None, progress=None, keep_download: bool = False) -> dict:
    """After the client (the part): Debian's server, without the "main" cluster Debian would create and
    start on port 5432 on a first install (tilewise starts its own servers), and, as root, the system
    user the servers run as."""
    say = progress.message if progress is not None else (lambda s: None)
    debs = []
    if missing_debian(["postgresql"]) and not os.environ.get(BIN_VAR):
        if not Path("/etc/postgresql").is_dir():
            debs += apt_install(["postgresql-common"], say)
            subprocess.run(["pg_conftool", "/etc/postgresql-common/createcluster.conf", "set",
                            "create_main_cluster", "off"], check=True, capture_output=True)
        debs += apt_install(["postgresql"], say)
    notes = [f"postgresql {server_version()}: {bindir()}"]
    if os.geteuid() == 0 and not os.environ.get(USER_VAR):
        try:
            pwd.getpwnam(DEFAULT_USER)
        except KeyError:
            say(f"creating the system user {DEFAULT_USER} (PostgreSQL refuses to run as root)")
            subprocess.run(USERADD, check=True, capture_output=True)
        notes.append(f"servers run as {DEFAULT_USER}")
    return {"engine": "postgres", "debian": debs, "notes": notes}
