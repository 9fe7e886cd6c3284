"""Installing Trino: checked, resumable, atomic. A loopback HTTP server plays the Maven mirror
(Range requests, published digests), so nothing is downloaded from outside."""

from __future__ import annotations

import hashlib
import http.server
import io
import random
import tarfile
import threading
from pathlib import Path

import pytest

from tilewise.engines.trino import install as ti


def _tarball(top: str = "trino-server-999", extra: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in ((f"{top}/bin/launcher", b"#!/bin/sh\n"), (f"{top}/lib/a.jar", random.Random(1).randbytes(300_000)),
                           *(((extra, b"evil"),) if extra else ())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Mirror:
    """Serves /io/trino/trino-server/999/... with optional digests; counts requests and ranges."""

    def __init__(self, body: bytes, digests: dict[str, str]) -> None:
        self.body, self.digests, self.ranges, self.cut_after = body, digests, [], None
        mirror = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                path = self.path.split("/io/trino/trino-server/999/", 1)[-1]
                for algo, text in mirror.digests.items():
                    if path == f"trino-server-999.tar.gz.{algo}":
                        data = text.encode()
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                if path != "trino-server-999.tar.gz":
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                mirror.ranges.append(rng)
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                else:
                    self.send_response(200)
                data = mirror.body[start:]
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if mirror.cut_after is not None:  # the connection drops mid-way
                    self.wfile.write(data[:mirror.cut_after])
                    mirror.cut_after = None
                    return
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mirror_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_TRINO_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TILEWISE_TRINO_VERSION", "999")
    made = []

    def make(body: bytes, digests: dict[str, str]) -> Mirror:
        m = Mirror(body, digests)
        made.append(m)
        monkeypatch.setenv("TILEWISE_MAVEN_MIRROR", m.url)
        return m

    yield make
    for m in made:
        m.close()


def test_install_checks_sha1_unpacks_atomically_and_is_idempotent(mirror_env):
    body = _tarball()
    m = mirror_env(body, {"sha1": hashlib.sha1(body).hexdigest() + "  trino-server-999.tar.gz\n"})
    path = ti.install()
    root = ti.cache_root()
    assert path == root / "trino-server-999" and ti.is_installed()
    assert (path / "lib" / "a.jar").stat().st_size == 300_000
    assert not list(root.glob("*.part")) and not list(root.glob(".trino-server-999.tmp-*"))
    assert not (root / "trino-server-999.tar.gz").exists()  # not kept unless asked
    n = len(m.ranges)
    assert ti.install() == path and len(m.ranges) == n  # installed: nothing fetched again


def test_strongest_published_digest_wins(mirror_env):
    body = _tarball()
    mirror_env(body, {"sha512": hashlib.sha512(body).hexdigest(), "sha1": "0" * 40})
    assert ti.published_digest(ti.tarball_url("999"))[0] == "sha512"
    ti.install()  # the wrong SHA-1 is never consulted
    assert ti.is_installed()


def test_checksum_mismatch_deletes_the_download(mirror_env):
    body = _tarball()
    mirror_env(body, {"sha1": "f" * 40})
    with pytest.raises(ti.InstallError, match="sha1 is .* the mirror publishes f+; the download was deleted"):
        ti.install()
    root = ti.cache_root()
    assert not list(root.glob("trino-server-999*")) and not ti.is_installed()


def test_no_published_checksum_is_refused(mirror_env):
    mirror_env(_tarball(), {})
    with pytest.raises(ti.InstallError, match="publishes no checksum"):
        ti.install()
    assert not ti.is_installed()


def test_interrupted_download_resumes_with_a_range_request(mirror_env):
    body = _tarball()
    m = mirror_env(body, {"sha1": hashlib.sha1(body).hexdigest()})
    m.cut_after = 1000  # the first transfer stops after 1000 bytes
    with pytest.raises(Exception):
        ti.install(keep_tarball=True)
    part = ti.cache_root() / "trino-server-999.tar.gz.part"
    assert part.exists() and 0 < part.stat().st_size < len(body) and not ti.is_installed()
    have = part.stat().st_size
    ti.install(keep_tarball=True)
    assert m.ranges[-1] == f"bytes={have}-"  # resumed, not restarted
    assert (ti.cache_root() / "trino-server-999.tar.gz").read_bytes() == body and ti.is_installed()


def test_tarball_with_paths_outside_its_directory_is_refused(mirror_env):
    body = _tarball(extra="trino-server-999/../../escape")
    mirror_env(body, {"sha1": hashlib.sha1(body).hexdigest()})
    with pytest.raises(ti.InstallError, match="unexpected path"):
        ti.install()
    assert not ti.is_installed() and not (ti.cache_root().parent / "escape").exists()


def test_unreachable_mirror_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_TRINO_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TILEWISE_MAVEN_MIRROR", "http://127.0.0.1:1")
    with pytest.raises(ti.InstallError, match="cannot reach"):
        ti.install("476")


def test_java_version_from_release_file(tmp_path):
    (tmp_path / "release").write_text('IMPLEMENTOR="x"\nJAVA_VERSION="25.0.2"\n')
    assert ti.java_major(tmp_path) == 25
    (tmp_path / "release").write_text('JAVA_VERSION="17.0.15"\n')
    assert ti.java_major(tmp_path) == 17
    assert ti.java_major(tmp_path / "nope") is None


def test_missing_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_TRINO_HOME", str(tmp_path / "empty"))
    why = ti.missing()
    assert "not installed" in why and "tilewise engines install trino" in why


def test_bad_version_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("TILEWISE_TRINO_VERSION", "latest")
    with pytest.raises(ti.UsageError):
        ti.version()


def test_engines_list_cli(cli, monkeypatch, tmp_path):
    cp = cli("engines", "list", "--json", env={"TILEWISE_TRINO_HOME": str(tmp_path / "none")})
    assert cp.returncode == 0, cp.stderr
    import json

    rows = {r["engine"]: r for r in json.loads(cp.stdout)}
    assert rows["duckdb"]["usable"] is True
    assert rows["trino"]["usable"] is False and "engines install trino" in rows["trino"]["missing"]
    cp = cli("engines", "install", "oracle")
    assert cp.returncode == 2 and cp.stderr.startswith("Error: ")


def test_install_cli_with_progress(cli, tmp_path):
    body = _tarball()
    m = Mirror(body, {"sha1": hashlib.sha1(body).hexdigest()})
    try:
        env = {"TILEWISE_TRINO_HOME": str(tmp_path / "c"), "TILEWISE_TRINO_VERSION": "999",
               "TILEWISE_MAVEN_MIRROR": m.url}
        cp = cli("engines", "install", "trino", env=env)
        assert cp.returncode == 0, cp.stderr
        assert "downloading" in cp.stderr and "checking SHA1" in cp.stderr
        assert Path(tmp_path / "c" / "trino-server-999" / "bin" / "launcher").exists()
        cp = cli("engines", "remove", "trino", "--json", env=env)
        assert cp.returncode == 0 and not (tmp_path / "c" / "trino-server-999").exists()
    finally:
        m.close()
