"""The `tilewise` command line. Subcommands live in modules of this package and load lazily,
so `tilewise topo` does not pay for importing engines or plotting.

Exit codes: 0 success, 1 error (one line, `Error: ...`), 2 bad usage, 130 interrupted (SIGINT,
SIGTERM or SIGHUP, after stopping and restoring everything). `tilewise exec` exits with its
command's status instead (128+n when the command died of signal n; 127 not found, 126 not executable).
"""

from __future__ import annotations

import errno
import importlib
import sys

import click

from tilewise import __version__
from tilewise import envvars, fsutil, signals
from tilewise.errors import TilewiseError, UsageError

# name -> "module:attribute"; a new subcommand is one line here.
COMMANDS = {
    "topo": "tilewise.cli.topo:topo",
    "plan": "tilewise.cli.plan:plan_cmd",
    "exec": "tilewise.cli.exec:exec_cmd",
    "bench": "tilewise.cli.bench:bench",
    "data": "tilewise.cli.data:data",
    "up": "tilewise.cli.cluster:up_cmd",
    "status": "tilewise.cli.cluster:status_cmd",
    "down": "tilewise.cli.cluster:down_cmd",
    "join": "tilewise.cli.cluster:join_cmd",
    "query": "tilewise.cli.cluster:query_cmd",
    "engines": "tilewise.cli.engines:engines_cmd",
    "extras": "tilewise.cli.engines:extras_cmd",
    "elastic": "tilewise.cli.elastic:elastic",
    "probe": "tilewise.cli.probe:probe",
    "workload": "tilewise.cli.workload:workload_cmd",
    "tune": "tilewise.cli.tune:tune_cmd",
    "restore": "tilewise.cli.restore:restore_cmd",
    "report": "tilewise.cli.report:report_cmd",
}


class LazyGroup(click.Group):
    registry: dict[str, str] | None = None  # None: the top-level COMMANDS

    def _registry(self) -> dict[str, str]:
        return COMMANDS if self.registry is None else self.registry

    def list_commands(self, ctx):
        return sorted(self._registry())

    def get_command(self, ctx, name):
        target = self._registry().get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        from tilewise.cli.common import harden

        return harden(getattr(importlib.import_module(module), attr))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tilewise")
def cli() -> None:
    """Measure the machine, plan a NUMA/chiplet-aware deployment, launch it, run, report."""


def main(argv: list[str] | None = None) -> None:
    signals.install()  # SIGINT, SIGTERM and SIGHUP raise, so every cleanup runs
    try:
        _main(argv)
    except SystemExit as e:
        if e.code not in (0, None):  # a refused or failed command leaves no empty --out it made
            fsutil.discard_made_dirs()
        raise
    except BaseException:
        fsutil.discard_made_dirs()
        raise


def _main(argv: list[str] | None) -> None:
    try:
        # tilewise's own directories: a bad value is refused before any command writes anything
        why = envvars.problem((envvars.STATE_DIR, envvars.CLUSTER_DIR))
        if why and not _asks_for_help(argv):
            raise UsageError(why)
        cli.main(args=argv, prog_name="tilewise", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:  # click's form of a KeyboardInterrupt
        signals.ignore()  # a burst of Ctrl-C: the next one must not kill us while we say so
        click.echo("Error: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        msg = " ".join(e.format_message().split())
        click.echo(f"Error: {msg} (see `tilewise {_sub(argv)}--help`)", err=True)
        sys.exit(e.exit_code)
    except TilewiseError as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, signals.Terminated) as e:
        # what was stopped or restored has been reported by the code that did it, after checking
        signals.ignore()
        how = signals.name(e.signum) if isinstance(e, signals.Terminated) else "SIGINT"
        click.echo(f"Error: interrupted ({how})", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    except OSError as e:
        if e.errno not in FULL:
            raise
        # a full (or read-only) file system on any write path: data, layouts, references, results,
        # state, journals, locks. What was being written is left half-made nowhere (atomic writes:
        # a temporary file renamed into place) and what was started is stopped on the way here
        where = f" {e.filename}" if e.filename else ""
        click.echo(f"Error: cannot write{where}: {e.strerror or e}; free space there, or point tilewise elsewhere "
                   "(--out, --data-dir, TMPDIR, TILEWISE_STATE_DIR, TILEWISE_CLUSTER_DIR)", err=True)
        sys.exit(1)


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # OSErrors that say where cannot be written, as one line


def _asks_for_help(argv: list[str] | None) -> bool:
    args = sys.argv[1:] if argv is None else argv
    return not args or "--help" in args or "-h" in args or "--version" in args


def _sub(argv: list[str] | None) -> str:
    """The (sub)command the arguments name, for the `--help` hint: "bench tpch ", "topo ", ""."""
    args = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(args):
        if a in COMMANDS:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            if a in ("bench", "probe", "data") and nxt and not nxt.startswith("-"):
                return f"{a} {nxt} "
            return a + " "
    return ""
