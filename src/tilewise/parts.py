"""Parts of tilewise installed on demand, so that the main job's first run installs only what it runs.

A part is an engine (`tilewise engines install NAME`) or an extra (`tilewise extras install NAME`):
the Python packages of one of pyproject's optional dependencies (read from the installed package's
metadata, so the list is written once, in pyproject.toml) and the Debian packages it needs. An
engine may add a step of its own after these (Trino downloads its server, PostgreSQL creates the
user its servers run as). `make setup-all` installs every part; `make test` and CI do too.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from packaging.requirements import Requirement

from tilewise.errors import TilewiseError, UsageError

DIST = "tilewise"


@dataclass(frozen=True)
class Part:
    """The Python packages (pyproject's extra `extra`) that one feature needs; an engine's own install
    step adds what is not a Python package (a Debian package, a server download)."""

    name: str
    extra: str | None = None  # the optional-dependency group in pyproject.toml
    size: str = ""  # what installing it costs, for help texts: "about 0.5 GB"
    what: str = ""  # one line: what it is for
    group: str = "extras"  # the command that installs it: `tilewise extras|engines install NAME`

    def requirements(self) -> list[str]:
        return extra_requirements(self.extra) if self.extra else []

    def missing(self) -> list[str]:
        """The requirements (as written) whose packages are not installed yet."""
        return missing_python(self.requirements())

    def install_command(self) -> str:
        """The command that installs it, for hints."""
        return f"tilewise {self.group} install {self.name}"


# ---- what is installed ---------------------------------------------------------------------------

def extra_requirements(extra: str) -> list[str]:
    """The requirement strings of one of tilewise's extras, from the installed metadata."""
    try:
        reqs = importlib.metadata.requires(DIST) or []
    except importlib.metadata.PackageNotFoundError:
        raise TilewiseError("tilewise's package metadata is missing (it was not installed with pip)",
                            "install it: pip install -e . in the checkout (make setup does)") from None
    out = [str(_without_marker(r)) for r in map(Requirement, reqs)
           if r.marker is not None and r.marker.evaluate({"extra": extra})]
    if not out:
        raise TilewiseError(f"tilewise declares no optional dependencies named {extra!r}",
                            "reinstall tilewise from its checkout (make setup)")
    return out


def _without_marker(r: Requirement) -> Requirement:
    r.marker = None
    return r


def missing_python(requirements: list[str]) -> list[str]:
    """The requirements whose distribution is not installed in this environment."""
    out = []
    for r in requirements:
        try:
            importlib.metadata.version(Requirement(r).name)
        except importlib.metadata.PackageNotFoundError:
            out.append(r)
    return out


# ---- installing ------------------------------------------------------------------------------------

def install(part: Part, message: Callable[[str], None] = lambda s: None) -> list[str]:
    """Install the Python packages of `part` that are missing into this environment; what was installed."""
    reqs = part.missing()
    if reqs:
        message(f"installing {', '.join(reqs)} into {sys.prefix}")
        _run([sys.executable, "-m", "pip", "install", "-q", *reqs], f"pip install {' '.join(reqs)}")
    return reqs


def missing_debian(packages: list[str]) -> list[str]:
    """The Debian packages not installed (all of them on a machine without dpkg)."""
    if shutil.which("dpkg-query") is None:
        return list(packages)
    out = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            out.append(p)
    return out


def apt_command() -> list[str] | None:
    """The apt-get prefix this user can run (root, or sudo without a password), or None."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo"]
    return None


def apt_install(packages: list[str], message: Callable[[str], None] = lambda s: None) -> list[str]:
    """Install the Debian packages of `packages` that are missing (as root, or with sudo that asks no
    password); what was installed. UsageError naming the command when this user cannot."""
    packages = missing_debian(packages)
    if not packages:
        return []
    prefix = apt_command()
    if prefix is None:
        raise UsageError(f"Debian package(s) {', '.join(packages)} are missing and installing them needs root",
                         f"an administrator runs: apt-get install --no-install-recommends {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    message(f"installing Debian package(s) {', '.join(packages)}")
    _run([*prefix, "apt-get", "update", "-qq"], "apt-get update", env)
    _run([*prefix, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
         f"apt-get install {' '.join(packages)}", env)
    return packages


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else f"exit {r.returncode}")
        raise TilewiseError(f"{what} failed: {first.strip()[:300]}", "fix the cause above and run the install again")


# ---- the extras ----------------------------------------------------------------------------------------

EXTRAS: dict[str, Part] = {
    "tensor": Part("tensor", extra="tensor",
                   size="about 5.3 GB installed, 2.8 GB to download: PyPI's Linux torch is the CUDA build",
                   what="the tensor workloads T1-T3 and `probe gpu` (torch, scipy, nvidia-ml-py)"),
}


def extra(name: str) -> Part:
    try:
        return EXTRAS[name]
    except KeyError:
        raise UsageError(f"no extra named {name!r}", f"extras: {', '.join(EXTRAS)}") from None


def require(part: Part, what: str) -> None:
    """A UsageError naming the install command when `part`'s Python packages are not installed."""
    gone = missing_python(part.requirements())
    if gone:
        raise UsageError(f"{what} needs {', '.join(Requirement(r).name for r in gone)}, which is not installed",
                         f"run `{part.install_command()}` ({part.size})")
