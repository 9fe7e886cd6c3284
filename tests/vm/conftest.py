"""VM suite: print how long each guest took (boot, total) at the end of the run."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    g = getattr(config, "_tilewise_vm_guests", None)
    if g is None or not g.times:
        return
    tr = terminalreporter
    tr.section("QEMU guests")
    for name, r in sorted(g.times.items()):
        tr.write_line(f"{name:16} {r.accel}: boot {r.boot_s:5.1f} s, total {r.total_s:6.1f} s (exit {r.returncode})")
        checks = g.seconds.get(name)
        if checks:
            tr.write_line(" " * 17 + "checks: " + ", ".join(f"{c} {s:.1f} s" for c, s in checks.items()))
