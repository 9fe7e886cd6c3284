"""`tilewise engines list|install|remove`: which engines are usable here; install Trino on request."""

from __future__ import annotations

import click

from tilewise.cli.common import console, emit_json, json_option
from tilewise.errors import UsageError


class _RichProgress:
    """Download and unpack progress on stderr: a rich bar with bytes, speed and time left."""

    def __init__(self, quiet: bool) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self.err = console(stderr=True)
        self.quiet = quiet
        self._cols = {
            "bytes": (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      TimeRemainingColumn()),
            "count": (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")),
        }
        self._progress_cls = Progress
        self.progress = None
        self.task = None

    def begin(self, what: str, total, done: int = 0) -> None:
        kind = "bytes" if what.startswith("trino-server") else "count"
        self.progress = self._progress_cls(*self._cols[kind], console=self.err, transient=True,
                                           disable=self.quiet or not self.err.is_terminal)
        self.progress.start()
        self.task = self.progress.add_task(what, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=n)

    def end(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def message(self, text: str) -> None:
        if not self.quiet:
            self.err.print(f"tilewise: {text}", markup=False)


def engine_rows() -> list[dict]:
    from tilewise import engines

    rows = []
    for name in engines.ENGINES:
        why = engines.missing(name)
        rows.append({"engine": name, "usable": why is None, "missing": why})
    return rows


@click.group("engines")
def engines_cmd() -> None:
    """Engines tilewise can drive, and installing the ones that are not pip packages (Trino)."""


@engines_cmd.command("list")
@json_option
def list_cmd(as_json):
    """Each engine and whether it can run here (and what to install when not)."""
    rows = engine_rows()
    if as_json:
        emit_json(rows)
        return
    out = console()
    for r in rows:
        out.print(f"{r['engine']:8} {'ready' if r['usable'] else 'missing: ' + r['missing']}", markup=False)


@engines_cmd.command("install")
@click.argument("name")
@click.option("--version", "ver", default=None, metavar="V",
              help="Trino release (default 476, or TILEWISE_TRINO_VERSION); the mirror serves 352, 356, 368, 470, 476.")
@click.option("--keep-tarball", is_flag=True, help="Keep the downloaded .tar.gz beside the unpacked server.")
@json_option
def install_cmd(name, ver, keep_tarball, as_json):
    """Download and unpack an engine into the user cache (trino: about 820 MB, checked, resumable)."""
    from tilewise.engines import trino_install as ti

    if name.lower() != "trino":
        raise UsageError(f"{name!r} needs no install step here (pip installs duckdb and pyspark)",
                         "`tilewise engines install trino` is the one that downloads")
    rep = _RichProgress(quiet=as_json)
    path = ti.install(ver, progress=rep, keep_tarball=keep_tarball)
    try:
        java = str(ti.java_home())
        java_problem = None
    except ti.InstallError as e:
        java, java_problem = None, str(e)
    doc = {"engine": "trino", "version": ver or ti.version(), "server": str(path), "java_home": java,
           "java_problem": java_problem, "client": ti.client_available()}
    if as_json:
        emit_json(doc)
        return
    out = console()
    out.print(f"trino-server {doc['version']}: {path}", markup=False)
    out.print(f"java: {java or java_problem}", markup=False)
    if not doc["client"]:
        out.print("python client missing: pip install 'tilewise[trino]'", markup=False)


@engines_cmd.command("remove")
@click.argument("name")
@click.option("--version", "ver", default=None, metavar="V", help="Trino release to remove (default: the current one).")
@json_option
def remove_cmd(name, ver, as_json):
    """Delete a downloaded engine from the user cache."""
    from tilewise.engines import trino_install as ti

    if name.lower() != "trino":
        raise UsageError(f"{name!r} was not downloaded by tilewise", "only trino is")
    gone = ti.uninstall(ver)
    if as_json:
        emit_json({"removed": gone})
        return
    console().print(f"removed {len(gone)} path(s) from {ti.cache_root()}", markup=False)
