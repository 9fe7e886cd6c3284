"""Which options go with which mode of a command, declared as data, and the one check that refuses an
option given outside its mode.

A command declares its modes next to its options::

    @modes.declare(
        Mode("the tensor workloads T1-T3", lambda a: is_tensor(a["name"]), ("device", "variants_text", ...)),
        Mode("the allocator microbenchmark (alloc)", lambda a: a["name"].lower() == "alloc", ("ops", "slots")),
        current=lambda a: a["name"],
    )
    @click.command("workload")
    ...

An option named in one or more modes applies only when one of them holds for the command line's
values (the predicates see the parsed parameters by name). Given explicitly (on the command line or
in the environment; a default never counts) outside them, it is refused in one line naming the option,
the modes it belongs to and the one the command line is in ("--ops applies to the allocator
microbenchmark (alloc), not T1"), before the command's body runs, so before any side effect. The option's
help ends with its modes, so `--help` shows them. A mode that names a parameter the command does not
have is an error when the module loads (a misspelt name would silently check nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import click

from tilewise.errors import UsageError


@dataclass(frozen=True)
class Mode:
    label: str  # how help and errors name it, after "applies to": "the tensor workloads T1-T3", "--data"
    when: Callable[[dict], bool]  # over the command's parsed parameters, by name
    options: tuple[str, ...]  # parameter names (click's: instance_id for --instance)
    hint: str | None = None  # what to do instead, when "drop it" is not the whole answer


def declare(*modes: Mode, current: Callable[[dict], str] | None = None) -> Callable[[click.Command], click.Command]:
    """current: what the command line asks for instead, for the error ("..., not W1")."""
    def apply(cmd: click.Command) -> click.Command:
        params = {p.name: p for p in cmd.params}
        owners: dict[str, list[Mode]] = {}
        for m in modes:
            for name in m.options:
                if name not in params:
                    raise AssertionError(f"`{cmd.name}` declares a mode {m.label!r} for {name!r}, "
                                         f"which is none of its parameters")
                owners.setdefault(name, []).append(m)
        for name, ms in owners.items():
            p = params[name]
            tag = f"[only for {' or '.join(m.label for m in ms)}]"
            p.help = f"{p.help} {tag}" if p.help else tag
        body = cmd.callback

        @functools.wraps(body)
        def checked(*args, **kw):
            check(owners, kw, current)
            return body(*args, **kw)

        cmd.callback = checked
        cmd.modes = modes  # type: ignore[attr-defined]  # for tests and the fuzzer
        return cmd
    return apply


def check(owners: dict[str, list[Mode]], values: dict, current: Callable[[dict], str] | None = None) -> None:
    """UsageError for the first option given explicitly outside all of its modes."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    from click.core import ParameterSource

    given = {p.name: p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    for name, ms in owners.items():
        if name not in given:
            continue
        if any(_holds(m, values) for m in ms):
            continue
        flag = given[name].opts[0] if given[name].opts else name
        labels = " or ".join(m.label for m in ms)
        text = f"{flag} applies only to {labels}"
        if current is not None:
            try:
                text = f"{flag} applies to {labels}, not {current(values)}"
            except _UNDECIDED:
                pass
        raise UsageError(text, next((m.hint for m in ms if m.hint), "drop it"))


# what a predicate over values the command has not checked yet may raise: the command's own check says why
_UNDECIDED = (UsageError, ValueError, KeyError, TypeError, AttributeError)


def _holds(m: Mode, values: dict) -> bool:
    """A predicate that cannot decide (a value the command itself will refuse) lets the command say why."""
    try:
        return bool(m.when(values))
    except _UNDECIDED:
        return True
