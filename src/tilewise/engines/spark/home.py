"""Where Spark is: the pyspark installation (it ships bin/spark-class and the jars) and a Java runtime.
Apart from the runtime so that the spec's missing() can ask without importing it."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from tilewise.errors import TilewiseError


class SparkError(TilewiseError):
    pass


def spark_home() -> Path:
    """The pyspark installation (it ships bin/spark-class and the jars); checks java too."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkError("pyspark is not installed", "install it with `pip install pyspark` (make setup does)")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise SparkError(f"pyspark at {home} has no bin/spark-class or jars/", "reinstall pyspark from PyPI")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise SparkError("no Java runtime found (java not on PATH, JAVA_HOME unset)",
                         "install one: apt-get install openjdk-17-jre-headless (scripts/setup-system.sh)")
    return home
