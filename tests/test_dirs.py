"""Where tilewise keeps its files: the resolution rules of tilewise.dirs, with the environment set
by each test (HOME is a temporary directory: the real home is never read or written)."""

from __future__ import annotations

import pytest

from tilewise import changes, cluster, dirs
from tilewise.data import store
from tilewise.engines import trino_install

VARS = ("TILEWISE_STATE_DIR", "TILEWISE_CLUSTER_DIR", "TILEWISE_TRINO_HOME", "TILEWISE_VM_CACHE",
        "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Set exactly the variables a case names (HOME included); '~' in a value is the test's home."""
    home = tmp_path / "home"
    home.mkdir()

    def set_(**values):
        monkeypatch.setenv("HOME", str(home))
        for var in VARS:
            monkeypatch.delenv(var, raising=False)
        for var, value in values.items():
            monkeypatch.setenv(var, value.replace("~", str(home)))
        return home
    return set_


STATE_CASES = [  # (environment, euid, expected; ~ is HOME)
    ({"TILEWISE_STATE_DIR": "/s", "XDG_RUNTIME_DIR": "/r"}, 0, "/s"),  # the override wins, for root too
    ({"XDG_RUNTIME_DIR": "/r"}, 0, "/run/tilewise"),  # root: reset at boot like what it records
    ({"XDG_RUNTIME_DIR": "/r", "XDG_STATE_HOME": "/x"}, 1000, "/r/tilewise"),
    ({"XDG_STATE_HOME": "/x"}, 1000, "/x/tilewise"),
    ({}, 1000, "~/.local/state/tilewise"),
    ({"TILEWISE_STATE_DIR": "", "XDG_RUNTIME_DIR": ""}, 1000, "~/.local/state/tilewise"),  # empty = unset
]


@pytest.mark.parametrize("values,euid,expected", STATE_CASES)
def test_state_dir(env, values, euid, expected):
    home = env(**values)
    assert str(dirs.state_dir(euid=euid)) == expected.replace("~", str(home))


CLUSTER_CASES = [
    ({"TILEWISE_CLUSTER_DIR": "/c", "XDG_RUNTIME_DIR": "/r"}, "/c"),
    ({"XDG_RUNTIME_DIR": "/r", "XDG_CACHE_HOME": "/k"}, "/r/tilewise/clusters"),
    ({"XDG_CACHE_HOME": "/k"}, "/k/tilewise/clusters"),
    ({}, "~/.cache/tilewise/clusters"),
]


@pytest.mark.parametrize("values,expected", CLUSTER_CASES)
def test_cluster_dir(env, values, expected):
    home = env(**values)
    assert str(dirs.cluster_dir()) == expected.replace("~", str(home))
    assert cluster.state_dir() == dirs.cluster_dir()


CACHE_CASES = [  # (environment, the caller's own variable, expected)
    ({"TILEWISE_TRINO_HOME": "/t", "XDG_CACHE_HOME": "/k"}, "TILEWISE_TRINO_HOME", "/t"),
    ({"TILEWISE_TRINO_HOME": "", "XDG_CACHE_HOME": "/k"}, "TILEWISE_TRINO_HOME", "/k/tilewise/trino"),
    ({"XDG_CACHE_HOME": "/k"}, None, "/k/tilewise/trino"),
    ({}, None, "~/.cache/tilewise/trino"),
    ({"XDG_CACHE_HOME": "relative/cache"}, None, "~/.cache/tilewise/trino"),  # XDG: a relative path is ignored
]


@pytest.mark.parametrize("values,override,expected", CACHE_CASES)
def test_cache_dir(env, values, override, expected):
    home = env(**values)
    assert str(dirs.cache_dir("trino", override=override)) == expected.replace("~", str(home))


def test_every_user_resolves_through_dirs_and_nothing_is_created(env, tmp_path):
    home = env(XDG_CACHE_HOME="~/c", XDG_STATE_HOME="~/s", TILEWISE_TRINO_HOME="~/trino")
    assert changes.state_dir is dirs.state_dir and changes.state_dir(euid=1000) == home / "s" / "tilewise"
    assert store.cache_root("tpch") == home / "c" / "tilewise" / "tpch"
    assert trino_install.cache_root() == home / "trino"
    assert cluster.state_dir() == home / "c" / "tilewise" / "clusters"
    assert list(home.iterdir()) == []  # resolving creates nothing


def test_the_vm_guests_cache(env, tmp_path):
    from vm import harness

    env(TILEWISE_VM_CACHE=str(tmp_path / "vm"))
    assert harness.cache_dir() == tmp_path / "vm"
    home = env(XDG_CACHE_HOME="~/c")
    assert harness.cache_dir() == home / "c" / "tilewise" / "vm" and (home / "c" / "tilewise" / "vm").is_dir()
