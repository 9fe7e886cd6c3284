"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import click

topology_option = click.option(
    "--topology", "topology_src", metavar="SRC", default=None,
    help="hwloc XML file, sysfs:<dir>, or synthetic:<hwloc description>; default: this machine.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


class Number(click.ParamType):
    """A finite number within bounds, for every numeric option.

    float() and click's FLOAT/FloatRange accept "nan" and "inf" (and NaN passes every range check):
    `--interval nan` would busy-loop and `--duration inf` never stop. This type rejects them, checks
    [min, max] (open ends with min_open/max_open), and with suffixes=True reads counts like 1e6, 10M,
    100K, 2G (decimal multipliers).
    """

    MULT = {"k": 10**3, "m": 10**6, "g": 10**9}
    INT_MAX = 2**63 - 1  # what the native tools and the kernel take

    def __init__(self, *, integer: bool = False, min: float | None = None, max: float | None = None,  # noqa: A002
                 min_open: bool = False, max_open: bool = False, suffixes: bool = False, name: str | None = None):
        self.integer, self.min, self.max = integer, min, max
        self.min_open, self.max_open, self.suffixes = min_open, max_open, suffixes
        self.name = name or ("N" if suffixes else "INTEGER" if integer else "NUMBER")
        if integer and max is None:
            self.max = self.INT_MAX

    def _range(self, above: bool = False) -> str:
        fmt = "d" if self.integer else "g"
        lo = None if self.min is None else f"{'>' if self.min_open else '>='} {self.min:{fmt}}"
        hi = None if self.max is None or (self.max == self.INT_MAX and not above) else \
            f"{'<' if self.max_open else '<='} {self.max:{fmt}}"
        return " and ".join(x for x in (lo, hi) if x)

    def convert(self, value, param, ctx):
        what = "a whole number" if self.integer else "a number"
        if isinstance(value, bool):
            self.fail(f"{value!r} is not {what}", param, ctx)
        if isinstance(value, (int, float)):
            v = value
        else:
            text = str(value).strip().lower().replace("_", "")
            mult = 1
            if self.suffixes and text and text[-1] in self.MULT:
                text, mult = text[:-1], self.MULT[text[-1]]
            try:
                v = int(text) * mult if self.integer and mult == 1 and text.lstrip("+-").isdigit() else float(text) * mult
            except (ValueError, OverflowError):
                hint = " (e.g. 1000000, 1e6, 10M)" if self.suffixes else ""
                self.fail(f"{value!r} is not {what}{hint}", param, ctx)
        if isinstance(v, float) and not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.integer:
            if v != int(v):
                self.fail(f"{value!r} is not a whole number", param, ctx)
            v = int(v)
        low = self.min is not None and (v <= self.min if self.min_open else v < self.min)
        high = self.max is not None and (v >= self.max if self.max_open else v > self.max)
        if low or high:
            self.fail(f"{value!r} is out of range: it must be {self._range(above=high)}", param, ctx)
        return v


SECONDS = Number(min=0, min_open=True, name="SECONDS")  # a duration, interval or timeout
PERCENT = Number(min=0, max=100, name="PERCENT")
NON_NEGATIVE = Number(min=0)
AT_LEAST_1 = Number(integer=True, min=1)  # runs, repeats, clients, streams, instances, threads
INDEX = Number(integer=True, min=0)  # which instance; warm-up runs (0 = none)
SEED = Number(integer=True, min=0, name="SEED")
PID = Number(integer=True, min=1, max=2**31 - 1, name="PID")  # a pid_t
COUNT = Number(integer=True, min=1, suffixes=True)  # records, groups, operations: 1e6, 10M, 100K


def emit_json(obj) -> None:
    # one write: json.dump to a stream writes every token separately (slow for large documents)
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")


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


class Messages:
    """A use case's reporter: its lines on stderr (after `prefix`), none when quiet (--json)."""

    def __init__(self, quiet: bool = False, prefix: str = "") -> None:
        self.quiet, self.prefix = quiet, prefix
        self.err = console(stderr=True)

    def message(self, text: str) -> None:
        if not self.quiet:
            self.err.print(self.prefix + text, markup=False)


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


def parse_size(text: str, flag: str, *, minimum: int = 1) -> int:
    """A byte size in hwloc's units (64MB, 1GiB: KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024),
    at least minimum bytes."""
    from tilewise.errors import UsageError
    from tilewise.topology.synthetic import _parse_size

    try:
        n = _parse_size(text, flag)
    except UsageError:
        raise UsageError(f"{flag}: bad size {text!r}", "use e.g. 64MB, 1GiB (KB/MB/GB are powers of 1000)") from None
    if n < minimum:
        raise UsageError(f"{flag} {text}: at least {minimum} bytes" if minimum > 1 else f"{flag} {text}: must be more than 0 bytes",
                         "use e.g. 64MB, 1GiB")
    return n


class NonEmpty(click.ParamType):
    """Text that says something: not empty, not only blanks, no NUL byte (an empty --out would write
    into the current directory, an empty --queries would run all 22)."""

    name = "TEXT"

    def convert(self, value, param, ctx):
        text = str(value)
        if not text.strip():
            self.fail("is empty; give a value or leave the option out", param, ctx)
        if "\x00" in text:
            self.fail("contains a NUL byte", param, ctx)
        return value


NON_EMPTY = NonEmpty()


class Address(click.ParamType):
    """An address to bind to or reach: an IPv4 or IPv6 literal, or a host name (RFC 1123 labels).
    999.1.1.1 is neither (all digits and dots, so meant as IPv4, and out of range)."""

    name = "ADDR"
    _LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")

    def convert(self, value, param, ctx):
        import ipaddress

        text = str(value).strip()
        if re.fullmatch(r"[\d.]+", text) or ":" in text:
            try:
                return str(ipaddress.ip_address(text.strip("[]")))
            except ValueError:
                self.fail(f"{text!r} is not an IP address (IPv4: four numbers 0-255)", param, ctx)
        labels = text.rstrip(".").split(".")
        if not text or len(text) > 253 or not all(self._LABEL.fullmatch(x) for x in labels):
            self.fail(f"{text!r} is neither an IP address nor a host name", param, ctx)
        return text


ADDRESS = Address()


class OutputFile(click.ParamType):
    """A file tilewise writes (--save, --export, --plot, --log): refused at parse time, before anything
    runs, when it is a folder or a special file or its folder is missing; nothing is made."""

    name = "FILE"

    def convert(self, value, param, ctx):
        from tilewise import userfiles

        why = userfiles.output_problem(value)
        if why:
            self.fail(f"{value}: {why}", param, ctx)
        return str(value)


OUTPUT_FILE = OutputFile()


def harden(cmd: click.Command) -> click.Command:
    """Make every plain text option and argument of cmd (and of its subcommands, when it is a group
    that is not lazy) reject empty values. Called on every command the CLI loads, so options added
    later get it too; numeric options must use Number (tests/test_cli_inputs.py checks)."""
    for p in cmd.params:
        if p.type is click.STRING and not getattr(p, "is_flag", False) and p.nargs == 1:
            p.type = NON_EMPTY
    if isinstance(cmd, click.Group):
        for sub in getattr(cmd, "commands", {}).values():
            harden(sub)
    return cmd


def explicit(*names: str) -> list[str]:
    """The options among names (parameter names) that the user gave on the command line or in the
    environment, as their flags (--policy), in the order given; defaults do not count."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:  # called outside a command (a library use): nothing was given explicitly
        return []
    from click.core import ParameterSource

    out = []
    for p in ctx.command.params:
        if p.name in names and ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            out.append(p.opts[0] if p.opts else p.name)
    return out


def conflicts(anchor: str, names: tuple[str, ...] | list[str], why: str) -> None:
    """Usage error when an option in names was given explicitly alongside anchor (a flag as shown)."""
    from tilewise.errors import UsageError

    given = explicit(*names)
    if given:
        raise UsageError(f"{anchor} cannot be combined with {', '.join(given)}", why)
