"""Lock files go with what they guard (fsutil.locked_file): held exclusively, removed after the
block, and a waiter that got the lock on a removed file takes the path again, so two holders never
overlap and no lock file is left in a user's folder."""

from __future__ import annotations

import threading
import time

from tilewise import fsutil
from tilewise.data import store


def test_two_holders_never_overlap_and_no_file_is_left(tmp_path):
    path = tmp_path / ".x.lock"
    spans: list[tuple[float, float]] = []

    def hold():
        with fsutil.locked_file(path, cannot=RuntimeError):
            t0 = time.monotonic()
            time.sleep(0.2)
            spans.append((t0, time.monotonic()))

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    spans.sort()
    assert len(spans) == 4 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    assert not path.exists()


def test_a_lock_kept_by_the_guarded_state_stays(tmp_path):
    path = tmp_path / ".y.lock"
    with fsutil.locked_file(path, cannot=RuntimeError, remove_after=lambda: False):
        pass
    assert path.exists()


def test_a_busy_lock_raises_after_its_timeout(tmp_path):
    path = tmp_path / ".z.lock"
    with fsutil.locked_file(path, cannot=RuntimeError):
        t0 = time.monotonic()
        try:
            with fsutil.locked_file(path, cannot=RuntimeError, timeout_s=0.2, busy=TimeoutError("busy")):
                raise AssertionError("a second holder got the lock")
        except TimeoutError:
            pass
        assert 0.2 <= time.monotonic() - t0 < 2


def test_two_builders_of_one_data_set_build_it_once_and_leave_no_lock(tmp_path):
    target = tmp_path / "set"
    built = []

    def build(tmp):
        built.append(tmp)
        time.sleep(0.2)
        (tmp / "ok").write_text("1")

    def valid(d):
        return (d / "ok").is_file()

    threads = [threading.Thread(target=store.ensure_dir, args=(target, valid, build), kwargs={"what": "x"})
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(built) == 1 and valid(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no lock file, no temporary
