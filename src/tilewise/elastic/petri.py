"""The Petri-net predicate/transition (PrT) controller of paper 002, section III, as a pure function.

Places P = {Idle, Stable, Overload, Provision, Checks}; transitions T = {t0..t7}:

    t0  Checks   -> Idle       guard u <= th_min          (low load)
    t1  Checks   -> Overload   guard u >= th_max          (high load)
    t2  Checks   -> Stable     guard th_min < u < th_max  (the local optimum number of cores, eq. 1)
    t3  Stable   -> Checks     always                      (keep monitoring)
    t4  Idle     -> Checks     guard n_alloc > 1          releases one core (Provision -= 1)
    t5  Overload -> Checks     guard n_alloc < n_total    allocates one core (Provision += 1)
    t6  Overload -> Checks     guard n_alloc == n_total   (bound: nothing left to allocate)
    t7  Idle     -> Checks     guard n_alloc == 1         (bound: never below one core)

Thresholds follow the paper: eq. (1) makes Stable the open interval th_min < u < th_max, the
paper's example guard "u >= 70" fires t1 at th_max, and its Fig. 10 fires t0 at u = th_min = 10 %.

The marking: Checks carries the measurement token u (0..100) when the net is waiting for a
decision, Idle/Stable/Overload carry it while it travels, Provision always holds n_alloc tokens
(the allocated cores). ``step(state, u)`` puts the measurement into Checks, fires until the token
is back in Checks (always two firings), and returns the new state, the action (+1, -1 or 0) and
the firing log. No I/O, no clock: the daemon supplies both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from tilewise.errors import UsageError

PLACES = ("Idle", "Stable", "Overload", "Provision", "Checks")
TRANSITIONS = ("t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7")

# (input place, output place, change of the Provision marking, guard description)
ARCS: dict[str, tuple[str, str, int, str]] = {
    "t0": ("Checks", "Idle", 0, "u <= th_min"),
    "t1": ("Checks", "Overload", 0, "u >= th_max"),
    "t2": ("Checks", "Stable", 0, "th_min < u < th_max"),
    "t3": ("Stable", "Checks", 0, "true"),
    "t4": ("Idle", "Checks", -1, "n_alloc > 1"),
    "t5": ("Overload", "Checks", +1, "n_alloc < n_total"),
    "t6": ("Overload", "Checks", 0, "n_alloc >= n_total"),
    "t7": ("Idle", "Checks", 0, "n_alloc <= 1"),
}


@dataclass(frozen=True)
class NetConfig:
    th_min: float = 10.0
    th_max: float = 70.0
    n_total: int = 1  # cores the target may ever get (the allowed set)

    def __post_init__(self) -> None:
        if not self.th_min < self.th_max:
            raise UsageError(f"th_min ({self.th_min}) must be below th_max ({self.th_max})")
        if self.n_total < 1:
            raise UsageError("the allowed set has no core", "check --pid's affinity and --topology")


@dataclass(frozen=True)
class State:
    """A marking of the net. ``token`` is where the measurement token is (normally Checks)."""

    n_alloc: int = 1
    token: str = "Checks"
    u: float | None = None  # the last measurement carried by the token

    def marking(self) -> dict[str, float | int]:
        """Tokens per place, as the paper draws them (u in the place holding the token)."""
        m: dict[str, float | int] = {p: 0 for p in PLACES}
        m["Provision"] = self.n_alloc
        m[self.token] = self.u if self.u is not None else 0
        return m


@dataclass(frozen=True)
class Firing:
    transition: str
    src: str
    dst: str
    u: float
    n_alloc: int  # after the firing

    def to_json(self) -> dict:
        return {"transition": self.transition, "from": self.src, "to": self.dst, "u": self.u, "n_alloc": self.n_alloc}


@dataclass(frozen=True)
class StepResult:
    state: State
    action: int  # +1 allocate one core, -1 release one core, 0 nothing
    firings: tuple[Firing, ...] = field(default=())

    @property
    def transitions(self) -> tuple[str, ...]:
        return tuple(f.transition for f in self.firings)


def initial(cfg: NetConfig, n_alloc: int = 1) -> State:
    """m0: Checks holds the (not yet measured) load, Provision holds r = 1 core by default."""
    return State(n_alloc=max(1, min(n_alloc, cfg.n_total)))


def enabled(cfg: NetConfig, s: State, u: float) -> tuple[str, ...]:
    """Transitions enabled in marking s with measurement u (exactly one, by construction)."""
    out = []
    for t, (src, _dst, _d, _g) in ARCS.items():
        if src == s.token and guard(cfg, t, u, s.n_alloc):
            out.append(t)
    return tuple(out)


def guard(cfg: NetConfig, t: str, u: float, n_alloc: int) -> bool:
    if t == "t0":
        return u <= cfg.th_min
    if t == "t1":
        return u >= cfg.th_max
    if t == "t2":
        return cfg.th_min < u < cfg.th_max
    if t == "t3":
        return True
    if t == "t4":
        return n_alloc > 1
    if t == "t5":
        return n_alloc < cfg.n_total
    if t == "t6":
        return n_alloc >= cfg.n_total
    if t == "t7":
        return n_alloc <= 1
    raise KeyError(t)


def fire(cfg: NetConfig, s: State, t: str, u: float) -> tuple[State, Firing]:
    src, dst, delta, _ = ARCS[t]
    if s.token != src or not guard(cfg, t, u, s.n_alloc):
        raise ValueError(f"{t} is not enabled in marking {s.marking()} with u={u}")
    n = s.n_alloc + delta
    ns = State(n_alloc=n, token=dst, u=u)
    return ns, Firing(t, src, dst, u, n)


def step(cfg: NetConfig, s: State, u: float) -> StepResult:
    """One controller tick: measurement u (percent) in, new marking and action out."""
    if s.token != "Checks":
        raise ValueError(f"a tick starts with the token in Checks, not {s.token}")
    if u != u:  # NaN: no measurement; the token stays in Checks
        return StepResult(replace(s, u=None), 0, ())
    u = float(u)
    # the allowed set may have shrunk under us (n_total is per config): clamp first
    if s.n_alloc > cfg.n_total:
        s = replace(s, n_alloc=cfg.n_total)
    firings = []
    state = replace(s, u=u)
    while True:
        ts = enabled(cfg, state, u)
        assert len(ts) == 1, (state, ts)
        state, f = fire(cfg, state, ts[0], u)
        firings.append(f)
        if state.token == "Checks":
            break
    action = state.n_alloc - s.n_alloc
    return StepResult(state, action, tuple(firings))


def incidence() -> dict:
    """The net structure as Pre/Post/A^T = Post - Pre matrices (places x transitions, 5 x 8).

    Provision's column entries are the token flow in cores (t4 takes one, t5 adds one).
    """
    pre = [[0] * len(TRANSITIONS) for _ in PLACES]
    post = [[0] * len(TRANSITIONS) for _ in PLACES]
    for j, t in enumerate(TRANSITIONS):
        src, dst, delta, _ = ARCS[t]
        pre[PLACES.index(src)][j] = 1
        post[PLACES.index(dst)][j] = 1
        if delta < 0:
            pre[PLACES.index("Provision")][j] = -delta
        elif delta > 0:
            post[PLACES.index("Provision")][j] = delta
    at = [[post[i][j] - pre[i][j] for j in range(len(TRANSITIONS))] for i in range(len(PLACES))]
    return {"places": list(PLACES), "transitions": list(TRANSITIONS), "pre": pre, "post": post, "A_T": at,
            "guards": {t: ARCS[t][3] for t in TRANSITIONS}}
