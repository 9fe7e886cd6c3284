"""Trino: a coordinator plus one bound worker per plan instance, over the data set's Parquet; the
workers cooperate on every query.

The runtime (runtime.TrinoCluster) serves `bench tpch` and `up/join/status/query/down`; the data set
is served by the Hive connector through hard links, no copy (hive.py), with statistics gathered once
per data set. The server is not a pip package: `tilewise engines install trino` downloads it
(install.py). Trino does not write tilewise's tables: no refresh functions. Memory knobs: the
worker heap (--worker-memory) and the coordinator heap (--coordinator-memory). Where Trino's SQL
differs from a benchmark's text, dialect.py rewrites it (documented per query).
"""

from __future__ import annotations

from tilewise.engines import splits
from tilewise.engines.contract import Capabilities, EngineSpec
from tilewise.engines.memory import MemoryKnob
from tilewise.engines.trino import env, install
from tilewise.engines.trino.dialect import dialect

COORDINATOR_MIN_MB = 768


def missing() -> str | None:
    return install.missing()


def version() -> str:
    return f"trino {install.version()}"


def install_step(version: str | None = None, progress=None, keep_download: bool = False) -> dict:
    """Download, check and unpack the server into the user cache; what `engines install trino` shows."""
    path = install.install(version, progress=progress, keep_tarball=keep_download)
    try:
        java, java_problem = str(install.java_home()), None
    except install.InstallError as e:
        java, java_problem = None, str(e)
    doc = {"engine": "trino", "version": version or install.version(), "server": str(path), "java_home": java,
           "java_problem": java_problem, "client": install.client_available()}
    doc["notes"] = [f"trino-server {doc['version']}: {path}", f"java: {java or java_problem}"]
    if not doc["client"]:
        doc["notes"].append(f"python client missing: run `{install.PART.install_command()}` again")
    return doc


def uninstall_step(version: str | None = None) -> list[str]:
    return install.uninstall(version)


SPEC = EngineSpec(
    name="trino",
    title="Trino",
    summary="a Trino coordinator + one bound worker per instance (they cooperate on every query)",
    runtime="tilewise.engines.trino.runtime:TrinoCluster",
    capabilities=Capabilities(replicas=False, refresh=False, join=True,
                              memory=MemoryKnob("worker JVM heap", default_min_mb=COORDINATOR_MIN_MB),
                              coordinator_memory=MemoryKnob("coordinator JVM heap", default_text="half the smallest "
                                                            "worker's heap, 768 MiB to 4 GiB"),
                              reads=("parquet",)),  # CSV/TBL/JSON through the Hive connector: not yet
    missing=missing,
    version=version,
    part=install.PART,
    install=install_step,
    uninstall=uninstall_step,
    install_help=(f"default {install.DEFAULT_VERSION}, or TILEWISE_TRINO_VERSION; the mirror serves 352, 356, 368, "
                  "470, 476; about 820 MB"),
    dialect=dialect,  # dialect.py: its rewrites of benchmark queries (TPC-DS)
    endpoint_label="coordinator",
    # the Hive connector: the first 200 splits at most 32 MB, then 64 MB; a row group read by the
    # split its first byte is in
    scan_split=splits.ByteRanges(64 * splits.MB, 0, row_group_at="start", initial_splits=200,
                                 initial_split_bytes=32 * splits.MB),
    env=env.ALL,
)
