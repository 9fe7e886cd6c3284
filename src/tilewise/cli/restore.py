"""`tilewise restore`: undo everything that runs which did not exit cleanly left behind."""

from __future__ import annotations

import click

from tilewise.cli.common import console, emit_json, json_option
from tilewise.errors import TilewiseError


def restore_report(as_json: bool) -> None:
    """Undo what dead owners' journals record; print a report; raise when something stays."""
    from tilewise import changes

    base = changes.state_dir()
    reports = changes.restore_all(base)
    if as_json:
        emit_json({"state_dir": str(base), "journals": [r.to_json() for r in reports],
                   "ok": all(r.state not in ("failed", "unreadable") for r in reports)})
    else:
        out = console()
        if not reports:
            out.print(f"nothing to restore (no journal in {base / 'journals'})", markup=False)
        for r in reports:
            for line in r.lines():
                out.print(line, markup=False)
    bad = [r for r in reports if r.state in ("failed", "unreadable")]
    if bad:
        raise TilewiseError(f"{len(bad)} journal(s) could not be fully undone: {bad[0].path}",
                            "fix the items named above by hand (as root?), then run `tilewise restore` again")


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
