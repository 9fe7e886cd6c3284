"""Crash-safe writes: whole file or nothing, permissions as asked, no temp file left behind."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tilewise import fsutil


def test_atomic_write_json_and_mode(tmp_path):
    p = fsutil.atomic_write_json(tmp_path / "sub" / "a.json", {"x": [1, 2]}, mode=0o600)
    assert json.loads(p.read_text()) == {"x": [1, 2]}
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    fsutil.atomic_write(p, b"new")
    assert p.read_bytes() == b"new" and stat.S_IMODE(os.stat(p).st_mode) == 0o644
    assert os.listdir(p.parent) == ["a.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "a.json"
    fsutil.atomic_write_json(p, {"old": True})
    with pytest.raises(TypeError):
        fsutil.atomic_write_json(p, {"bad": object()})
    assert json.loads(p.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["a.json"]
