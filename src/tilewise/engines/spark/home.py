"""Where Spark is: the pyspark installation (it ships bin/spark-class and the jars) and a Java runtime.
Apart from the runtime so that the spec's missing() can ask without importing it."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from tilewise.errors import TilewiseError
from tilewise.parts import Part, apt_install

JAVA_PACKAGE = "openjdk-17-jre-headless"
PART = Part("spark", extra="spark", group="engines",
            size="about 0.5 GB: pyspark, and Debian's openjdk-17-jre-headless when no Java runtime is found",
            what="Spark SQL: a standalone master and bound workers")


class SparkError(TilewiseError):
    pass


def spark_home() -> Path:
    """The pyspark installation (it ships bin/spark-class and the jars); checks java too."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkError("pyspark is not installed", f"run `{PART.install_command()}` ({PART.size})")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise SparkError(f"pyspark at {home} has no bin/spark-class or jars/", "reinstall pyspark from PyPI")
    if not java_found():
        raise SparkError("no Java runtime found (java not on PATH, JAVA_HOME unset)",
                         f"run `{PART.install_command()}` (it installs Debian's {JAVA_PACKAGE})")
    return home


def java_found() -> bool:
    return bool(os.environ.get("JAVA_HOME") or shutil.which("java"))


def install_step(version: str | None = None, progress=None, keep_download: bool = False) -> dict:
    """After pyspark (the part): a Java runtime from Debian when none is found."""
    say = progress.message if progress is not None else (lambda s: None)
    debs = [] if java_found() else apt_install([JAVA_PACKAGE], say)
    home = spark_home()
    return {"engine": "spark", "debian": debs, "spark_home": str(home),
            "notes": [f"pyspark: {home}", f"java: {shutil.which('java') or os.environ.get('JAVA_HOME')}"]}
