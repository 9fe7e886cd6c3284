"""`tilewise restore`: undo everything that runs which did not exit cleanly left behind."""

from __future__ import annotations

import os

import click

from tilewise import dirs

from tilewise.cli.common import console, emit_json, json_option
from tilewise.errors import TilewiseError


def restore_report(as_json: bool) -> None:
    """Undo what dead owners' journals record; print a report; raise when something stays."""
    from tilewise import changes

    base = changes.state_dir()
    reports = changes.restore_all(base)
    others = _roots_journals(base)
    if as_json:
        emit_json({"state_dir": str(base), "journals": [r.to_json() for r in reports],
                   "ok": all(r.state not in ("failed", "unreadable", "refused") for r in reports),
                   **({"not_yours": others} if others else {})})
    else:
        out = console()
        if not reports:
            out.print(f"nothing to restore (no journal in {base / 'journals'})", markup=False)
        for r in reports:
            for line in r.lines():
                out.print(line, markup=False)
        if others:
            out.print(f"note: {others}", markup=False)
    refused = [r for r in reports if r.state == "refused"]
    if refused:
        raise TilewiseError(f"{len(refused)} journal(s) left alone, not ours to undo: {refused[0].detail}")
    bad = [r for r in reports if r.state in ("failed", "unreadable")]
    if bad:
        raise TilewiseError(f"{len(bad)} journal(s) could not be fully undone: {bad[0].path}",
                            "fix the items named above by hand (as root?), then run `tilewise restore` again")


def _roots_journals(base) -> str | None:
    """Not root: root's runs journal in /run/tilewise, which is not ours to undo (said, not tried)."""
    root_dir = dirs.state_dir(euid=0)
    if os.geteuid() == 0 or base == root_dir:
        return None
    try:
        n = sum(1 for p in (root_dir / "journals").iterdir() if p.suffix == ".json")
    except OSError:
        return None
    return (f"{n} journal(s) of root's runs are in {root_dir / 'journals'}: root undoes them (sudo tilewise restore)"
            if n else None)


@click.command("restore")
@json_option
def restore_cmd(as_json):
    """Undo what runs killed hard (kill -9, a crash) left changed: CPU affinity and cgroups of
    `elastic`, OS switches of `tune`/`workload --apply-os`, and processes that `exec`, `bench`,
    `tune` or `probe` started and that outlived them (found by the token they inherit).

    Reads the undo journals in the state directory ($TILEWISE_STATE_DIR, /run/tilewise for root);
    journals of runs still alive are left alone, journals from before the last reboot are
    discarded. Undo runs newest change first and keeps what could not be undone.
    """
    restore_report(as_json)
