"""How tilewise reacts to SIGINT, SIGTERM and SIGHUP.

- Normally each one becomes an exception (KeyboardInterrupt for SIGINT, ``Terminated`` for
  SIGTERM and SIGHUP: a closed terminal is handled like a stop request), so every ``finally``
  (stop what was started, undo what was changed) runs.
- While something is being undone (``deferred()``), they are held and raised when the block
  ends: a second SIGTERM during a restore cannot abort it half way.
- Once one has been raised, the command is stopping: the ones after it (a burst of Ctrl-C) are
  ignored, so they cannot cut short the clean-up it runs on its way out (SIGKILL still ends it).
- While `tilewise exec` supervises a command (``forwarding(fn)``), they are handed to ``fn``,
  which forwards them to the command's process group.

Python runs signal handlers in the main thread only, so one handler decides for every thread.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, turned into an exception so every cleanup runs."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = signum
        super().__init__(name(signum))


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_depth = 0  # > 0 while a deferred() block runs (in any thread)
_stopping = False  # a stop signal was raised: the command is on its way out
_pending: list[int] = []
_forward: Callable[[int], None] | None = None
_lock = threading.Lock()


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def handler(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    global _stopping
    if _depth:
        _pending.append(signum)
        return
    if _forward is not None:
        _forward(signum)
        return
    if _stopping:
        return  # already stopping: it runs its clean-up to the end
    _stopping = True
    _raise(signum)


def install() -> None:
    """Make SIGINT/SIGTERM/SIGHUP raise (the CLI does this at start; main thread only)."""
    global _previous_unraisable, _stopping
    _stopping = False
    for s in HANDLED:
        signal.signal(s, handler)
    if sys.unraisablehook is not _unraisable:
        _previous_unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable


_previous_unraisable = sys.unraisablehook


def _unraisable(u) -> None:
    """A signal's exception raised where Python cannot raise one (a weakref callback or __del__
    run by the garbage collector: Python prints "Exception ignored" and goes on) would be lost, and
    a Ctrl-C with it. Deliver the signal again, a moment later, from outside that place."""
    exc = u.exc_value
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        timer = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    _previous_unraisable(u)


def ignore() -> None:
    """From now on SIGINT/SIGTERM/SIGHUP do nothing (the CLI is printing its last line)."""
    if threading.current_thread() is threading.main_thread():
        for s in HANDLED:
            signal.signal(s, signal.SIG_IGN)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, then act on the first one held.

    Where the handlers are not ours (a library caller) and this is the main thread, ours are put
    in place for the block, and a held signal is then re-raised with the caller's disposition.
    """
    global _depth, _stopping
    previous = {}
    if _main_thread():
        for s in HANDLED:
            if signal.getsignal(s) is not handler:
                previous[s] = signal.signal(s, handler)
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            outer = _depth > 0
            held = [] if outer else list(_pending)
            if not outer:
                _pending.clear()
        for s, h in previous.items():
            signal.signal(s, h)
        if held:
            first = held[0]
            if first in previous:
                signal.raise_signal(first)  # the caller's own handler (or default action) decides
            elif _forward is not None:
                for s in held:
                    _forward(s)
            elif not _stopping:  # held during a clean-up the command was not already stopping for
                _stopping = True
                _raise(first)


@contextmanager
def forwarding(fn: Callable[[int], None]) -> Iterator[None]:
    """Hand SIGINT/SIGTERM/SIGHUP to fn for the block (main thread only)."""
    global _forward
    previous = {s: signal.signal(s, handler) for s in HANDLED}
    old, _forward = _forward, fn
    try:
        yield
    finally:
        _forward = old
        for s, h in previous.items():
            signal.signal(s, h)
