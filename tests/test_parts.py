"""Parts installed on demand (tilewise.parts): the main job installs none of them; each engine and
extra says in one line how to install it, and `engines install` / `extras install` install only
what is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tilewise import engines, parts
from tilewise.errors import TilewiseError, UsageError

TW = [sys.executable, "-m", "tilewise"]


def test_an_extras_requirements_come_from_the_installed_metadata():
    # pyproject.toml is the one list: these are its [project.optional-dependencies]
    assert parts.extra_requirements("spark") == ["pyspark>=3.5"]
    assert parts.extra_requirements("postgres") == ["psycopg[binary]>=3.1"]
    assert {r.split(">")[0] for r in parts.extra_requirements("tensor")} == {"torch", "scipy", "nvidia-ml-py"}
    with pytest.raises(TilewiseError, match="no optional dependencies named 'nope'"):
        parts.extra_requirements("nope")


def test_missing_python_names_only_what_is_not_installed():
    assert parts.missing_python(["click>=8", "tilewise-no-such-package>=1", "rich[jupyter]>=1"]) == [
        "tilewise-no-such-package>=1"]


def test_a_missing_part_is_refused_in_one_line_naming_its_install_command():
    part = parts.Part("gadget", size="about 1 MB")
    object.__setattr__(part, "requirements", lambda: ["tilewise-no-such-package>=1"])
    with pytest.raises(UsageError) as e:
        parts.require(part, "workload X")
    assert str(e.value) == ("workload X needs tilewise-no-such-package, which is not installed; "
                            "run `tilewise extras install gadget` (about 1 MB)")
    engine = parts.Part("gadget", group="engines")
    assert engine.install_command() == "tilewise engines install gadget"


def test_every_engine_but_the_embedded_default_installs_as_a_part_with_its_size():
    for spec in engines.specs():
        if spec.name == engines.DEFAULT_BENCH:
            assert spec.part is None and spec.install is None  # DuckDB is the main job's: always there
            continue
        assert spec.part is not None and spec.part.install_command() == f"tilewise engines install {spec.name}"
        assert "MB" in spec.part.size or "GB" in spec.part.size, spec.name


def test_installing_debian_packages_without_root_is_refused_naming_the_command(monkeypatch):
    monkeypatch.setattr(parts, "missing_debian", lambda pkgs: list(pkgs))
    monkeypatch.setattr(parts, "apt_command", lambda: None)
    ran = []
    monkeypatch.setattr(parts, "_run", lambda *a, **k: ran.append(a))
    with pytest.raises(UsageError, match="an administrator runs: apt-get install --no-install-recommends "
                                         "openjdk-17-jre-headless"):
        parts.apt_install(["openjdk-17-jre-headless"])
    assert ran == []  # nothing was started


def test_nothing_is_installed_twice(monkeypatch):
    ran = []
    monkeypatch.setattr(parts, "_run", lambda *a, **k: ran.append(a))
    assert parts.install(parts.Part("x", extra="dev")) == []  # pytest and the others are here
    monkeypatch.setattr(parts, "missing_debian", lambda pkgs: [])
    assert parts.apt_install(["hwloc"]) == []
    assert ran == []


def test_engines_and_extras_install_from_the_command_line():
    ok = subprocess.run([*TW, "engines", "install", "clickhouse", "--json"], capture_output=True, text=True)
    if engines.get("clickhouse").missing() is None:  # installed (make test installs every part)
        assert ok.returncode == 0, ok.stderr
        assert '"python": []' in ok.stdout
    bad = subprocess.run([*TW, "engines", "install", "clickhouse", "--version", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "Error: --version does not apply to clickhouse (it installs packages, it downloads no release); drop --version"]
    none = subprocess.run([*TW, "engines", "install", "duckdb"], capture_output=True, text=True)
    assert none.returncode == 2 and "needs no install step" in none.stderr
    extra = subprocess.run([*TW, "extras", "install", "nope"], capture_output=True, text=True)
    assert extra.returncode == 2 and extra.stderr.strip() == "Error: no extra named 'nope'; extras: tensor"
    listed = subprocess.run([*TW, "extras", "list", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0 and '"extra": "tensor"' in listed.stdout
    helped = subprocess.run([*TW, "extras", "--help"], capture_output=True, text=True)
    assert "tensor" in helped.stdout and "GB" in helped.stdout
