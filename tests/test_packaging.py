"""A newcomer's install is quiet: setuptools reads pyproject.toml without a deprecation warning
(`project.license` as a table, license classifiers and the like print dozens of lines on every
`pip install -e .`, and those forms stop building after 2027-02-18). Offline and under a second:
setuptools' own pyproject reader, as `pip install` runs it, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

READ = """
import sys, warnings
from setuptools.config import pyprojecttoml
from setuptools.dist import Distribution
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    d = Distribution()
    pyprojecttoml.apply_configuration(d, sys.argv[1])
    d.finalize_options()
for w in got:
    print(f"{w.category.__name__}: {str(w.message).strip().splitlines()[0]}")
"""


def _setuptools_major() -> int:
    setuptools = pytest.importorskip("setuptools")
    return int(setuptools.__version__.split(".")[0])


def test_pyproject_reads_without_a_setuptools_deprecation_warning():
    if _setuptools_major() < 77:
        pytest.skip("setuptools older than pyproject's build requirement (77: SPDX license strings)")
    cp = subprocess.run([sys.executable, "-c", READ, str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                        cwd=ROOT, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.strip() == "", cp.stdout


def test_the_build_requirement_reads_the_license_as_written():
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(doc["project"]["license"], str)  # an SPDX expression, not the deprecated table
    assert not [c for c in doc["project"].get("classifiers", []) if c.startswith("License ::")]
    assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
               for r in doc["build-system"]["requires"])
