"""The simulator's model and its pre-drawn workload (one per grid point and seed).

Time is in integer "ms" with the mean build time ``T_MS``; results are reported in
units of T. Every strategy replays the same :class:`Workload`: the same arrivals,
the same good/bad changes, the same pairwise conflicts and the same build durations
(the k-th build headed by change i always lasts ``duration(i, k)``).

Model:
- changes arrive as a Poisson process of rate ``load / T``; each change is one batch;
- a change is *risky* with probability ``risky_share`` and then bad with probability
  ``p_risky``, else bad with probability ``p_safe``; a bad change makes every build
  containing it fail, a good change never does (no flaky builds);
- every pair of changes conflicts with probability ``p_conflict``, drawn once per pair;
  a change depends on the earlier changes it conflicts with that are still in flight
  when it arrives (conflicts with landed ones are part of the trunk it builds on);
- build durations are uniform in ``[dur_lo, dur_hi] * T``;
- ``batch``: the most changes a batching strategy (the peers' ``bors``, ``mergify``,
  ``github-headgreen`` groups) puts in one batch or group; the others ignore it;
- a scorer may see a *risk flag*: the change's true class, wrong with probability
  ``flag_error`` (a noisy classifier, never the outcome itself).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

T_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class Point:
    load: float = 8.0
    budget: int = 12
    risky_share: float = 0.2
    p_safe: float = 0.025
    p_risky: float = 0.4
    p_conflict: float = 0.3
    n: int = 300
    seed: int = 1
    dur_lo: float = 0.8
    dur_hi: float = 1.2
    flag_error: float = 0.2
    p_flake: float = 0.0
    batch: int = 4

    @property
    def p_fail(self) -> float:
        """Mean per-change failure probability."""
        return self.risky_share * self.p_risky + (1 - self.risky_share) * self.p_safe

    def to_json(self) -> dict[str, Any]:
        return {"load": self.load, "budget": self.budget, "p_fail": round(self.p_fail, 4),
                "p_conflict": self.p_conflict, "seed": self.seed, "p_flake": self.p_flake,
                "batch": self.batch}


@dataclass(slots=True)
class Workload:
    point: Point
    arrival: list[int]
    bad: list[bool]
    risky: list[bool]
    flagged: list[bool]  # the noisy risk flag a scorer may use
    conflicts: list[frozenset[int]]  # conflicts[j]: earlier changes i < j that conflict with j
    _later: list[set[int]] = field(default_factory=list)
    _durations: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.arrival)

    def conflict(self, a: int, b: int) -> bool:
        lo, hi = (a, b) if a < b else (b, a)
        return lo in self.conflicts[hi]

    @property
    def good(self) -> frozenset[int]:
        return frozenset(i for i in range(self.n) if not self.bad[i])

    def duration(self, change: int, k: int) -> int:
        """Duration of the k-th build (0-based) headed by ``change``."""
        key = (change, k)
        d = self._durations.get(key)
        if d is None:
            rng = random.Random(f"{self.point.seed}/{change}/{k}")
            d = round(rng.uniform(self.point.dur_lo, self.point.dur_hi) * T_MS)
            self._durations[key] = d
        return d

    def flaky(self, members: frozenset[int], k: int) -> bool:
        """Whether the k-th build (0-based) of ``members`` on top of a trunk fails
        spuriously: drawn from (seed, the set, k) alone, so it is the same luck for every
        strategy."""
        p = self.point.p_flake
        if p <= 0.0:
            return False
        key = ",".join(map(str, sorted(members)))
        return random.Random(f"{self.point.seed}/flake/{key}/{k}").random() < p


def draw(point: Point) -> Workload:
    rng = random.Random(point.seed)
    t = 0.0
    arrival: list[int] = []
    bad: list[bool] = []
    risky: list[bool] = []
    flagged: list[bool] = []
    for _ in range(point.n):
        t += rng.expovariate(point.load / T_MS)
        arrival.append(round(t))
        r = rng.random() < point.risky_share
        risky.append(r)
        bad.append(rng.random() < (point.p_risky if r else point.p_safe))
        flagged.append(r != (rng.random() < point.flag_error))
    conflicts = [frozenset(i for i in range(j) if rng.random() < point.p_conflict)
                 for j in range(point.n)]
    return Workload(point, arrival, bad, risky, flagged, conflicts)


def flag_probability(point: Point, flagged: bool) -> float:
    """Calibrated P(good | risk flag): what a scorer trained on history would learn."""
    share, err = point.risky_share, point.flag_error
    p_flag_if_risky = 1 - err if flagged else err
    p_flag_if_safe = err if flagged else 1 - err
    w_risky = share * p_flag_if_risky
    w_safe = (1 - share) * p_flag_if_safe
    p_risky = w_risky / (w_risky + w_safe)
    return p_risky * (1 - point.p_risky) + (1 - p_risky) * (1 - point.p_safe)
