"""`tilewise engines list|install|remove`, and the --engine choices and help texts every command
takes from the engine registry (tilewise.engines): no command lists engine names itself."""

from __future__ import annotations

from collections.abc import Callable

import click

from tilewise import engines, parts
from tilewise.cli.common import console, emit_json, json_option
from tilewise.errors import TilewiseError, UsageError


# ---- what commands take from the registry ----------------------------------------------------

class EngineChoice(click.Choice):
    """The registered engines (those `where` accepts), read when first needed: a plug-in installed
    later is a choice too, and importing a command does not import every engine."""

    def __init__(self, where: Callable | None = None) -> None:
        self._where = where
        self._choices: list[str] | None = None
        self.case_sensitive = False

    @property
    def choices(self) -> list[str]:  # type: ignore[override]
        if self._choices is None:
            self._choices = (engines.names() if self._where is None else
                             [s.name for s in engines.specs(self._where)])
        return self._choices

    @choices.setter
    def choices(self, value) -> None:  # click assigns it in Choice.__init__, which this class skips
        self._choices = list(value)


class LazyHelpOption(click.Option):
    """An option whose help text is computed when help is shown (from the registry)."""

    def __init__(self, *args, help_text: Callable[[], str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._help_text = help_text

    def get_help_record(self, ctx):
        self.help = self._help_text()
        return super().get_help_record(ctx)


def engine_summaries() -> str:
    return "; ".join(f"{s.name}: {s.summary}" for s in engines.specs()) + "."


def memory_help(prefix: str) -> str:
    knobs = "; ".join(f"{s.name}: {s.capabilities.memory.describe()}"
                      for s in engines.specs(lambda s: s.capabilities.memory is not None))
    return (f"{prefix} (default: derived from its NUMA node's memory, split between the instances on that node; "
            f"{knobs}).")


def exchange_help() -> str:
    """--exchange's help: the engines that offer a choice, with theirs (from the registry)."""
    offered = "; ".join(f"{s.name}: {', '.join(s.capabilities.exchanges)}, default {s.capabilities.exchanges[0]}"
                        for s in engines.specs(lambda s: bool(s.capabilities.exchanges)))
    return f"How cooperating tiles exchange data, where the engine offers a choice ({offered or 'none installed'})."


def coordinator_help() -> str:
    knobs = "; ".join(f"{s.name}: {s.capabilities.coordinator_memory.describe()}"
                      for s in engines.specs(lambda s: s.capabilities.coordinator_memory is not None))
    return f"Memory of the coordinator, e.g. 2g ({knobs})."


# ---- tilewise engines ... --------------------------------------------------------------------

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
            "items": (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")),
        }
        self._progress_cls = Progress
        self.progress = None
        self.task = None

    def begin(self, what: str, total, done: int = 0, unit: str = "items") -> None:
        self.progress = self._progress_cls(*self._cols.get(unit, self._cols["items"]), console=self.err,
                                           transient=True, disable=self.quiet or not self.err.is_terminal)
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


def _has_install(s) -> bool:
    return s.install is not None or s.part is not None


def _downloads(s) -> bool:
    """An install step that downloads a release into the cache: --version and --keep-tarball apply."""
    return s.uninstall is not None


def install_help() -> str:
    steps = "; ".join(f"{s.name}: {s.install_help}" for s in engines.specs(lambda s: _downloads(s) and s.install_help))
    return "The release to install, for engines downloaded into the cache" + (f" ({steps})." if steps else ".")


def install_list_help() -> str:
    return "What each engine installs: " + "; ".join(
        f"{s.name}: {s.install_help or 'nothing'}" for s in engines.specs(_has_install)) + "."


def engine_rows() -> list[dict]:
    rows = []
    for name in engines.names():
        try:
            spec = engines.get(name)
            why = spec.why_not()
            summary = spec.summary
            exchanges = list(spec.capabilities.exchanges)
        except TilewiseError as e:  # a plug-in that cannot be loaded is listed, with why
            why, summary, exchanges = str(e), "", []
        rows.append({"engine": name, "usable": why is None, "missing": why, "summary": summary,
                     "exchanges": exchanges, "origin": engines.REGISTRY.entry(name).origin})
    return rows


def _installable(name: str, ver: str | None, keep_tarball: bool):
    spec = engines.get(name)
    if not _has_install(spec):
        who = [s.name for s in engines.specs(_has_install)]
        raise UsageError(f"{spec.name!r} needs no install step here ({spec.missing() or 'it is ready'})",
                         f"engines with one: {', '.join(who) or 'none'}")
    if not _downloads(spec):
        for opt, given in (("--version", ver is not None), ("--keep-tarball", keep_tarball)):
            if given:
                raise UsageError(f"{opt} does not apply to {spec.name} (it installs packages, it downloads no release)",
                                 f"drop {opt}")
    return spec


@click.group("engines")
def engines_cmd() -> None:
    """Engines tilewise can drive, and installing the ones that are not pip packages."""


@engines_cmd.command("list")
@json_option
def list_cmd(as_json):
    """Each engine and whether it can run here (and what to install when not)."""
    rows = engine_rows()
    if as_json:
        emit_json(rows)
        return
    out = console()
    width = max([8, *(len(r["engine"]) for r in rows)])
    for r in rows:
        out.print(f"{r['engine']:{width}} {'ready' if r['usable'] else 'cannot run: ' + r['missing']}", markup=False)


class _InstallCommand(click.Command):
    def get_help(self, ctx):
        self.help = f"{self.__doc__ or ''}\n\n{install_list_help()}"
        return super().get_help(ctx)


@engines_cmd.command("install", cls=_InstallCommand)
@click.argument("name")
@click.option("--version", "ver", default=None, metavar="V", cls=LazyHelpOption, help_text=install_help)
@click.option("--keep-tarball", is_flag=True, help="Keep the downloaded archive beside the unpacked server.")
@json_option
def install_cmd(name, ver, keep_tarball, as_json):
    """Install an engine the main job does not need: its Python packages into this environment, then
    what is not a pip package (a Debian package, a server downloaded into the user cache, checked and
    resumable). Nothing is installed twice."""
    spec = _installable(name, ver, keep_tarball)
    progress = _RichProgress(quiet=as_json)
    python = parts.install(spec.part, progress.message) if spec.part is not None else []
    doc = spec.install(ver, progress, keep_tarball) if spec.install is not None else {
        "engine": spec.name, "notes": [f"{spec.name}: {spec.missing() or 'ready'}"]}
    doc["python"] = python
    if as_json:
        emit_json(doc)
        return
    out = console()
    for line in doc.get("notes", []):
        out.print(line, markup=False)


@engines_cmd.command("remove")
@click.argument("name")
@click.option("--version", "ver", default=None, metavar="V", help="The release to remove (default: the current one).")
@json_option
def remove_cmd(name, ver, as_json):
    """Delete a downloaded engine from the user cache."""
    spec = engines.get(name)
    if spec.uninstall is None:
        raise UsageError(f"{spec.name!r} was not downloaded by tilewise",
                         f"only {', '.join(s.name for s in engines.specs(lambda s: s.uninstall is not None))} are")
    gone = spec.uninstall(ver)
    if as_json:
        emit_json({"removed": gone})
        return
    console().print(f"removed {len(gone)} path(s)" + (f": {', '.join(gone)}" if gone else ""), markup=False)


# ---- tilewise extras ... ---------------------------------------------------------------------

def extras_help() -> str:
    return "Extras: " + "; ".join(f"{p.name}: {p.what} ({p.size})" for p in parts.EXTRAS.values()) + "."


class _ExtrasGroup(click.Group):
    def get_help(self, ctx):
        self.help = f"{self.__doc__ or ''}\n\n{extras_help()}"
        return super().get_help(ctx)


@click.group("extras", cls=_ExtrasGroup)
def extras_cmd() -> None:
    """Optional parts that are not engines (the main job needs none of them)."""


@extras_cmd.command("list")
@json_option
def extras_list_cmd(as_json):
    """Each extra, its size and whether it is installed."""
    rows = [{"extra": p.name, "installed": not p.missing(), "missing": p.missing(), "size": p.size, "what": p.what}
            for p in parts.EXTRAS.values()]
    if as_json:
        emit_json(rows)
        return
    out = console()
    for r in rows:
        state = "installed" if r["installed"] else f"not installed ({r['size']})"
        out.print(f"{r['extra']:8} {state}: {r['what']}", markup=False)


@extras_cmd.command("install")
@click.argument("name")
@json_option
def extras_install_cmd(name, as_json):
    """Install an extra's Python packages into this environment (nothing that is already there)."""
    part = parts.extra(name)
    done = parts.install(part, _RichProgress(quiet=as_json).message)
    if as_json:
        emit_json({"extra": part.name, "python": done})
        return
    console().print(f"{part.name}: " + (f"installed {', '.join(done)}" if done else "already installed"), markup=False)
