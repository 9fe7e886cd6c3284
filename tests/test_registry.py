"""The extension-point registry: built-ins by module path, plug-ins by entry point."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tilewise.errors import TilewiseError, UsageError
from tilewise.registry import Registry


def _plugin(tmp_path, monkeypatch, *, group="tilewise.testkinds", name="ext", target="extpkg:SPEC",
            body='class _S:\n    name = "ext"\nSPEC = _S()\n'):
    """A package outside the tree with an entry point, found through sys.path (no pip install)."""
    (tmp_path / "extpkg.py").write_text(body)
    di = tmp_path / "extpkg-1.0.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: extpkg\nVersion: 1.0\n")
    (di / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [{group}]
        {name} = {target}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("extpkg", None)


def test_builtin_names_need_no_import():
    reg = Registry("thing", "tilewise.testkinds.none", {"a": "no.such.module", "b": "json:dumps"})
    assert reg.names() == ["a", "b"]
    with pytest.raises(TilewiseError, match="cannot be imported"):
        reg.get("a")


def test_unknown_name_lists_the_choices():
    reg = Registry("thing", "tilewise.testkinds.none", {"a": "json"})
    with pytest.raises(UsageError, match="unknown thing 'zz'.*choose one of a"):
        reg.get("zz")


def test_entry_point_plugin_is_found_and_loaded(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch)
    reg = Registry("thing", "tilewise.testkinds", {})
    assert reg.names() == ["ext"]
    assert reg.entry("ext").origin.startswith("entry point tilewise.testkinds of extpkg")
    assert reg.get("EXT").name == "ext"


def test_builtin_name_is_not_taken_over(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, name="a")
    reg = Registry("thing", "tilewise.testkinds", {"a": "json:loads"})
    assert reg.names() == ["a"]
    assert reg.entry("a").origin == "built-in"


def test_spec_must_carry_its_registered_name(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, name="other")
    reg = Registry("thing", "tilewise.testkinds", {})
    with pytest.raises(TilewiseError, match="calls itself 'ext'"):
        reg.get("other")


def test_missing_attribute_is_one_line(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, target="extpkg:NOPE")
    reg = Registry("thing", "tilewise.testkinds", {})
    with pytest.raises(TilewiseError, match="has no NOPE in extpkg"):
        reg.get("ext")


def test_entries_are_read_once_until_refreshed(tmp_path, monkeypatch):
    reg = Registry("thing", "tilewise.testkinds", {})
    assert reg.names() == []
    _plugin(tmp_path, monkeypatch)
    assert reg.names() == []  # read once per registry: a plug-in installed later needs refresh()
    reg.refresh()
    assert reg.names() == ["ext"]
