"""What every simulated strategy reports: builds, landings, and the trunk-state check.

**The trunk check.** A build records the trunk it started on (how many changes had
landed) and the changes it added on top (the head and the dependencies assumed to
land). When a group of changes lands (one change, or a whole bors batch in one push),
for every change X of the group the changes *that conflict with X* on the trunk right
after the landing (everything landed before, plus the rest of the group) must be
exactly those in the build's tree, and that build must have passed. Changes that do
not conflict with X commute with it in this model (that is what the conflict analysis
asserts), so they may differ. A landing that fails the check, or any landing of a bad
change, counts as a *red landing* (a landed combination containing a truly bad change
is always one: every build containing it failed).

**Flaky builds.** A build of good changes fails spuriously as the workload pre-drew it
(:meth:`Workload.flaky`, keyed by the build's ``members`` and how many builds of that
exact set this strategy started before). A good change a strategy rejects is *evicted*
(``good_evicted``): only a flaky failure can have caused it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench._sim_workload import T_MS, Workload


@dataclass(slots=True)
class SimBuild:
    head: int
    members: frozenset[int]  # changes added on top of the trunk (head included)
    trunk_len: int  # how many changes had landed when it started
    start: int
    end: int
    passed: bool
    aborted: bool = False


@dataclass(slots=True)
class Recorder:
    w: Workload
    trunk: list[int] = field(default_factory=list)
    landed_at: dict[int, int] = field(default_factory=dict)
    rejected: set[int] = field(default_factory=set)
    started: int = 0
    aborted: int = 0
    red: int = 0
    _counts: dict[int, int] = field(default_factory=dict)
    _attempts: dict[frozenset[int], int] = field(default_factory=dict)

    def build(self, head: int, members: frozenset[int], now: int, *,
              flaky: bool = True) -> SimBuild:
        """Start a build of ``members`` (head included) on today's trunk. ``flaky=False``
        (the oracle, which knows every outcome) never sees a spurious failure."""
        k = self._counts.get(head, 0)
        self._counts[head] = k + 1
        self.started += 1
        ok = not any(self.w.bad[m] for m in members)
        if ok and flaky and self.w.point.p_flake > 0.0:
            attempt = self._attempts.get(members, 0)
            self._attempts[members] = attempt + 1
            ok = not self.w.flaky(members, attempt)
        return SimBuild(head, members, len(self.trunk), now, now + self.w.duration(head, k), ok)

    def abort(self, b: SimBuild) -> None:
        if not b.aborted:
            b.aborted = True
            self.aborted += 1

    def land(self, group: list[int], build: SimBuild, now: int) -> None:
        landed_before = set(self.trunk)
        tree = set(self.trunk[:build.trunk_len]) | build.members
        after = landed_before | set(group)
        for x in group:
            if x in self.landed_at or x in self.rejected:
                raise RuntimeError(f"change {x} reached a second terminal state")
            want = {c for c in after if c != x and self.w.conflict(c, x)}
            got = {c for c in tree if c != x and self.w.conflict(c, x)}
            if self.w.bad[x] or not build.passed or x not in tree or want != got:
                self.red += 1
        for x in group:
            self.trunk.append(x)
            self.landed_at[x] = now

    def reject(self, x: int) -> None:
        if x in self.landed_at or x in self.rejected:
            raise RuntimeError(f"change {x} reached a second terminal state")
        self.rejected.add(x)

    def done(self) -> bool:
        return len(self.landed_at) + len(self.rejected) == self.w.n

    def metrics(self) -> dict[str, Any]:
        turn = sorted((t - self.w.arrival[x]) / T_MS for x, t in self.landed_at.items())
        span = (max(self.landed_at.values(), default=0) - self.w.arrival[0]) / T_MS
        n = len(turn)
        return {
            "p50": _pct(turn, 0.50), "p95": _pct(turn, 0.95), "p99": _pct(turn, 0.99),
            "throughput": n / span if span > 0 else 0.0,
            "builds_per_landed": self.started / n if n else float("nan"),
            "aborted_builds": self.aborted, "red_landings": self.red, "landed": n,
            "landed_set": sorted(self.landed_at),
            "mean": sum(turn) / n if n else float("nan"),
            "good_evicted": sum(1 for x in self.rejected if not self.w.bad[x]),
            "bad_landed": sum(1 for x in self.landed_at if self.w.bad[x]),
        }


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return float("nan")
    rank = max(1, -(-q * len(values) // 1))
    return values[int(rank) - 1]
