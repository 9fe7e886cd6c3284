"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import json
import os
import sys

import click

topology_option = click.option(
    "--topology", "topology_src", metavar="SRC", default=None,
    help="hwloc XML file, sysfs:<dir>, or synthetic:<hwloc description>; default: this machine.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


def emit_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=_default)
    sys.stdout.write("\n")


def _default(o):
    if hasattr(o, "to_json"):
        return o.to_json()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def console(stderr: bool = False, *, wide: bool = False):
    """A rich console; plain when not a terminal or when NO_COLOR is set. wide: when the output is
    not a terminal (a pipe, a file) and COLUMNS is not set, tables get 160 columns instead of 80."""
    from rich.console import Console

    c = Console(stderr=stderr, no_color="NO_COLOR" in os.environ, highlight=False, soft_wrap=True)
    if wide and not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = max(c.width, 160)
    return c


class ProgressBars:
    """Rich progress bars on stderr with messages printed above them; shown only on a terminal
    (plain messages otherwise). A context manager; subclasses add the bars they need."""

    def __init__(self, *columns, refresh_per_second: float = 10) -> None:
        from rich.progress import Progress

        self.err = console(stderr=True)
        self.progress = Progress(*columns, console=self.err, transient=True, disable=not self.err.is_terminal,
                                 refresh_per_second=refresh_per_second)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def message(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)
