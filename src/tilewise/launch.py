"""Launcher: starting bound processes, supervising them, running one in the foreground.

Every child runs in its own session (so its own process group), bound before it execs (see
tilewise.binding), carrying a token in ``TILEWISE_SPAWN`` that its descendants inherit, so they
can be found after they left the group or lost their parent. Each start is journaled first in the
change-and-undo layer (tilewise.changes), so what a tilewise killed hard leaves running,
`tilewise restore` stops. What a child got is read back by tilewise.verification; whole trees are
stopped by tilewise.procs.stop.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilewise import changes, signals
from tilewise.binding import Binding, apply_to_self, check_binding, child_env
from tilewise.errors import TilewiseError, UsageError
from tilewise.procs import GRACE_S, SPAWN_VAR, ProcId, StopReport, Tree, stop
from tilewise.verification import Verification, verify

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


class LaunchError(TilewiseError):
    pass


class CommandNotFound(LaunchError):
    exit_code = 127  # as shells


class NotExecutable(LaunchError):
    exit_code = 126  # as shells


# ---- starting ------------------------------------------------------------------------------------

def _preexec(b: Binding, die_with_parent: bool, err_fd: int,
             death_signal: int = signal.SIGKILL) -> Callable[[], None]:
    # runs after subprocess switched user (user=/group=): a later credential change would clear it
    def fn() -> None:
        if die_with_parent:
            _libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        try:
            apply_to_self(b)
        except OSError as e:  # tell the parent exactly what failed (subprocess only says "preexec_fn")
            os.write(err_fd, (e.strerror or str(e)).encode()[:500])
            raise
    return fn


class Child(subprocess.Popen):
    """A started process: a Popen, plus its identity and the token its descendants carry."""

    ident: ProcId
    token: str

    def tree(self) -> Tree:
        return Tree(self.ident, self.token, popen=self)


def journal_start(session: changes.Session, argv: Sequence[str]) -> str:
    """Journal a process about to be started (by the token it will carry), before it exists, so
    that if tilewise is killed hard, `tilewise restore` stops what it left running. Returns the
    token to pass to spawn."""
    token = uuid.uuid4().hex[:16]
    session.record(changes.StartedProcess(token=token, var=SPAWN_VAR, name=os.path.basename(argv[0]) if argv else ""),
                   "state", "stopped", "running", lock=False)
    return token


def spawn(argv: Sequence[str], b: Binding | None = None, *, env: dict | None = None, die_with_parent: bool = True,
          journal: changes.Session | None = None, token: str | None = None,
          death_signal: int = signal.SIGKILL, **popen_kwargs) -> Child:
    """Start argv bound by b (None: left as inherited), in a session (and process group) of its own,
    carrying a token (fresh, or the one journal_start returned). journal: record the start there
    first (see journal_start). die_with_parent: the child gets death_signal when tilewise dies
    (SIGKILL; a server that cleans up after itself on another signal, PostgreSQL's SIGINT, names
    that one)."""
    b = b or Binding(None)
    if not argv:
        raise UsageError("no command given", "put it after --, e.g. tilewise exec ... -- python3 -c 'print(1)'")
    check_binding(b)
    if journal is not None and token is None:
        token = journal_start(journal, argv)
    token = token or uuid.uuid4().hex[:16]
    try:
        return _spawn(argv, b, env, die_with_parent, token, death_signal, **popen_kwargs)
    except Exception:  # nothing was started (Popen reaps a child whose exec failed): no record of it stays
        if journal is not None:
            journal.drop(lambda c: getattr(c.target, "token", None) == token)
        raise


def _spawn(argv, b: Binding, env, die_with_parent: bool, token: str, death_signal: int, **popen_kwargs) -> Child:
    r, w = os.pipe()
    try:
        child = Child(list(argv), env=child_env(b, env, token), preexec_fn=_preexec(b, die_with_parent, w, death_signal),
                      start_new_session=True, **popen_kwargs)
    except subprocess.SubprocessError:  # preexec_fn failed in the child: it wrote why
        os.close(w)
        w = -1
        why = os.read(r, 600).decode(errors="replace") or "unknown error"
        raise LaunchError(f"could not bind {argv[0]} ({b.describe()}): {why}",
                          "check the CPUs and NUMA nodes exist and are allowed here (tilewise topo)") from None
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {argv[0]}", "check the name and PATH") from None
    except PermissionError:
        raise NotExecutable(f"permission denied running {argv[0]} (not executable?)") from None
    except OSError as e:
        if e.errno in (errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR):
            raise NotExecutable(f"cannot execute {argv[0]}: {e.strerror}") from None
        raise
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    child.token = token
    child.ident = ProcId.of(child.pid) or ProcId(child.pid, -1)
    return child


def _forget_if_stopped(session: changes.Session | None, rep: StopReport) -> None:
    """Everything journaled was stopped and checked: drop the journal. Otherwise it stays for
    `tilewise restore`."""
    if session is not None and rep.ok:
        session.commit()


# ---- supervising ---------------------------------------------------------------------------------

@dataclass
class Started:
    name: str
    proc: Child
    binding: Binding
    verification: Verification | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> Tree:
        return self.proc.tree()


class Supervisor:
    """Owns bound children; stops them all (whole trees) on exit, error or Ctrl-C, and says what it
    stopped only after checking (``report``). Each start is journaled first (journal=True), so
    what a tilewise killed hard leaves running, `tilewise restore` stops."""

    def __init__(self, journal: bool = True) -> None:
        self.children: list[Started] = []
        self.report = StopReport()
        self._journal = journal
        self.session: changes.Session | None = None

    def start(self, name: str, argv: Sequence[str], b: Binding | None = None, *, verify_binding: bool = True,
              die_with_parent: bool = True, **popen_kwargs) -> Started:
        b = b or Binding(None)
        if self._journal and self.session is None:
            self.session = changes.Session("processes started by this run")
        proc = spawn(argv, b, die_with_parent=die_with_parent, journal=self.session, **popen_kwargs)
        s = Started(name, proc, b, None)
        self.children.append(s)
        if verify_binding:
            s.verification = verify(proc.pid, b)
            if not s.verification.ok:
                raise LaunchError(f"{name}: binding not applied: " + "; ".join(s.verification.problems))
        return s

    def check(self) -> list[tuple[Started, int]]:
        """Children that exited, with their return codes (a crashed instance is reported, not hung on)."""
        return [(s, rc) for s in self.children if (rc := s.proc.poll()) is not None]

    def stop_all(self, timeout: float = GRACE_S) -> StopReport:
        rep = stop([s.tree() for s in reversed(self.children)], grace=timeout)
        self.report.extend(rep)
        _forget_if_stopped(self.session, rep)
        if rep.ok:
            self.session = None
        return rep

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        rep = self.stop_all()
        if not rep.ok:
            msg = f"processes left running: {rep.summary()}"
            if exc_type is None:
                raise LaunchError(msg, "kill them by pid")
            print(f"tilewise: {msg}", file=sys.stderr, flush=True)


# ---- running one command in the foreground (tilewise exec) ----------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass
class Run:
    verification: Verification
    returncode: int  # Popen's: negative for a signal
    forwarded: list[int]
    leftovers: StopReport  # what the command left running when it exited, stopped and checked

    @property
    def status(self) -> int:
        """The exit status a shell would give: 128+n for a signal."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


def run_forwarding(argv: Sequence[str], b: Binding, *, grace: float = GRACE_S,
                   on_started: Callable[[Verification], None] | None = None, **popen_kwargs) -> Run:
    """Start argv bound, verify, wait; forward SIGINT/SIGTERM/SIGHUP to its process group.

    After a forwarded SIGTERM or SIGHUP the command gets `grace` seconds, then everything of it
    is killed. When it exits, whatever it left running is stopped. Main thread only.
    """
    forwarded: list[int] = []
    holder: list[Child] = []

    def forward(signum: int) -> None:
        forwarded.append(signum)
        if holder and holder[0].returncode is None:
            try:
                os.killpg(holder[0].pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    journal = changes.Session(f"exec {os.path.basename(argv[0])}")
    with signals.forwarding(forward):
        child = spawn(argv, b, journal=journal, **popen_kwargs)
        holder.append(child)
        try:
            for s in forwarded:  # arrived while it was being started
                os.killpg(child.pid, s)
            v = verify(child.pid, b)
            if not v.ok:
                raise LaunchError("binding not applied: " + "; ".join(v.problems))
            if on_started:
                on_started(v)
            kill_at = None
            while True:
                try:
                    rc = child.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if kill_at is None and any(s in STOP_SIGNALS for s in forwarded):
                    kill_at = time.monotonic() + grace
                if kill_at is not None and time.monotonic() >= kill_at:
                    stop(child, grace=0)
        except BaseException:
            _forget_if_stopped(journal, stop(child, grace))
            raise
    leftovers = stop(child, grace)
    _forget_if_stopped(journal, leftovers)
    return Run(v, rc, forwarded, leftovers)


def run(argv: Sequence[str], b: Binding | None = None, *, timeout: float | None = None,
        **popen_kwargs) -> subprocess.CompletedProcess:
    """subprocess.run through the edge: bound, own group, whole tree stopped on timeout or error.
    Raises subprocess.TimeoutExpired (after stopping it) like subprocess.run."""
    journal = changes.Session(f"run {os.path.basename(argv[0])}")
    child = spawn(argv, b, journal=journal, **popen_kwargs)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        _forget_if_stopped(journal, stop(child))
    return subprocess.CompletedProcess(list(argv), child.returncode, out, err)
