"""The Petri-net controller as a pure function: every transition, thresholds, bounds."""

import math

import pytest

from tilewise.elastic import petri
from tilewise.errors import UsageError


def cfg(n_total=16, lo=10.0, hi=70.0):
    return petri.NetConfig(lo, hi, n_total)


@pytest.mark.parametrize("u,n,total,fired,action", [
    (99.0, 3, 16, ("t1", "t5"), +1),   # paper Fig. 9: overload, 3 of 16 -> allocate
    (99.0, 16, 16, ("t1", "t6"), 0),   # t6: nothing left to allocate
    (8.0, 5, 16, ("t0", "t4"), -1),    # paper Fig. 10: idle, 5 cores -> release
    (8.0, 1, 16, ("t0", "t7"), 0),     # t7: never below one core
    (40.0, 4, 16, ("t2", "t3"), 0),    # paper Fig. 11: stable
])
def test_each_transition_fires_when_it_should(u, n, total, fired, action):
    c = cfg(total)
    r = petri.step(c, petri.State(n_alloc=n), u)
    assert r.transitions == fired
    assert r.action == action
    assert r.state.n_alloc == n + action
    assert r.state.token == "Checks"
    assert r.firings[0].src == "Checks" and r.firings[-1].dst == "Checks"


def test_thresholds_follow_the_paper():
    c = cfg()
    s = petri.State(n_alloc=2)
    assert petri.step(c, s, 10.0).transitions[0] == "t0"       # u = th_min is idle (Fig. 10)
    assert petri.step(c, s, 10.0001).transitions[0] == "t2"    # stable is the open interval (eq. 1)
    assert petri.step(c, s, 69.9999).transitions[0] == "t2"
    assert petri.step(c, s, 70.0).transitions[0] == "t1"       # guard u >= th_max
    assert petri.step(c, s, 0.0).transitions[0] == "t0"
    assert petri.step(c, s, 100.0).transitions[0] == "t1"


def test_exactly_one_transition_enabled_everywhere():
    c = cfg(4)
    for n in range(1, 5):
        for u in [0, 5, 10, 10.5, 40, 69.9, 70, 85, 100]:
            s = petri.State(n_alloc=n)
            assert len(petri.enabled(c, s, u)) == 1
            mid = petri.fire(c, s, petri.enabled(c, s, u)[0], u)[0]
            assert len(petri.enabled(c, mid, u)) == 1


def test_bounds_hold_over_long_traces():
    c = cfg(3)
    s = petri.initial(c)
    assert s.n_alloc == 1
    fired = []
    for _ in range(10):  # permanent overload: grows to n_total and stays (t6)
        r = petri.step(c, s, 100.0)
        s = r.state
        fired += r.transitions
        assert 1 <= s.n_alloc <= 3
    assert s.n_alloc == 3 and fired.count("t5") == 2 and fired.count("t6") == 8
    fired = []
    for _ in range(10):  # permanent idle: shrinks to one and stays (t7)
        r = petri.step(c, s, 0.0)
        s = r.state
        fired += r.transitions
        assert 1 <= s.n_alloc <= 3
    assert s.n_alloc == 1 and fired.count("t4") == 2 and fired.count("t7") == 8


def test_hand_made_trace_q6_like():
    """Load up, stable, down: the "t1-Overload-t5" then "t0-Idle-t4" pattern of Fig. 7."""
    c = cfg(16)
    s = petri.initial(c)
    trace = [5, 99, 99, 68, 40, 8, 5, 9, 3]
    got = []
    for u in trace:
        r = petri.step(c, s, u)
        s = r.state
        got.append((r.transitions, s.n_alloc))
    assert got == [
        (("t0", "t7"), 1), (("t1", "t5"), 2), (("t1", "t5"), 3), (("t2", "t3"), 3), (("t2", "t3"), 3),
        (("t0", "t4"), 2), (("t0", "t4"), 1), (("t0", "t7"), 1), (("t0", "t7"), 1)]


def test_marking_and_no_measurement():
    c = cfg()
    s = petri.State(n_alloc=3)
    r = petri.step(c, s, math.nan)
    assert r.transitions == () and r.action == 0 and r.state.n_alloc == 3
    m = petri.step(c, s, 40).state.marking()
    assert m == {"Idle": 0, "Stable": 0, "Overload": 0, "Provision": 3, "Checks": 40.0}


def test_fire_refuses_disabled_transition_and_bad_config():
    c = cfg()
    with pytest.raises(ValueError):
        petri.fire(c, petri.State(n_alloc=1), "t4", 5)  # token is in Checks, t4 needs Idle
    with pytest.raises(ValueError):
        petri.fire(c, petri.State(n_alloc=1), "t1", 50)  # guard false
    with pytest.raises(UsageError):
        petri.NetConfig(70, 10, 4)
    with pytest.raises(UsageError):
        petri.NetConfig(10, 70, 0)


def test_incidence_matrix():
    inc = petri.incidence()
    assert len(inc["A_T"]) == 5 and all(len(r) == 8 for r in inc["A_T"])
    P, T = inc["places"], inc["transitions"]
    col = lambda t: {p: inc["A_T"][P.index(p)][T.index(t)] for p in P}  # noqa: E731
    assert col("t4") == {"Idle": -1, "Stable": 0, "Overload": 0, "Provision": -1, "Checks": 1}
    assert col("t5") == {"Idle": 0, "Stable": 0, "Overload": -1, "Provision": 1, "Checks": 1}
    assert col("t2") == {"Idle": 0, "Stable": 1, "Overload": 0, "Provision": 0, "Checks": -1}
