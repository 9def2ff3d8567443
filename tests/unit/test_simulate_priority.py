"""Priorities through the simulator's driver of the real planner (``bench/_sim_speculate``):
changes arrive with random priorities, dependency analysis places each one
(``priority.place``) and every plan applies the overtakes (``priority.overtaking``).
The simulator's trunk check then proves the ordering safe: no landing whose tree lacks a
conflicting change that landed before it (or holds one that did not), every good change
lands and no bad one does, with the sticky, preempting and coverage planners. Nothing
of the bench is changed: its strategies still see only normal requests."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from app.domain.entities import Batch
from app.domain.states import BatchState, Priority
from app.speculation.coverage import CoveragePolicy
from app.speculation.priority import place
from bench import simulate
from bench._sim_speculate import SpecConfig, _Sim, bid
from bench._sim_workload import T_MS, draw, flag_probability


class _PrioritySim(_Sim):
    """The simulator with a share of ``high`` and ``hotfix`` arrivals."""

    def __init__(self, *args: object, rnd: random.Random,
                 weights: tuple[int, int, int] = (70, 15, 15), **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.rnd = rnd
        self.weights = weights  # normal, high, hotfix
        self.overtook = 0
        self.first_landed: list[int] = []

    def arrive(self, i: int, t: int) -> None:
        prio = self.rnd.choices([Priority.NORMAL, Priority.HIGH, Priority.HOTFIX],
                                weights=self.weights)[0]
        new = Batch(queue="q", id=bid(i), contains=(bid(i),), dependencies=(),
                    state=BatchState.SPECULATING, version=1, created_at_ms=t, priority=prio)
        conflicting = [self.batches[bid(j)] for j in sorted(self.w.conflicts[i])
                       if bid(j) in self.active]
        deps, overtakes = place(new, conflicting,
                                {h: self.batches[h].dependencies for h in self.active})
        self.overtook += len(overtakes)
        self.batches[new.id] = replace(new, dependencies=deps, overtakes=overtakes)
        self.active[new.id] = None
        self.members[new.id] = (i,)  # one change per batch (the simulator's batching off)
        self.minted += 1
        self.probs[new.id] = self.cfg.fixed_p if self.cfg.scorer == "fixed" else \
            flag_probability(self.w.point, self.w.flagged[i])


CONFIGS = {
    "sticky": SpecConfig(),
    "preempting": SpecConfig(allocator="preempting"),
    "coverage": SpecConfig(coverage=CoveragePolicy(min_remaining=0.0)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_priorities_never_land_an_untested_combination(name: str, seed: int) -> None:
    point = replace(simulate.DEFAULT, n=80, seed=seed, p_conflict=0.5, budget=6)
    w = draw(point)
    sim = _PrioritySim(w, CONFIGS[name], rnd=random.Random(seed))
    m = sim.run().metrics()
    assert sim.overtook > 0  # the ordering was exercised
    assert m["red_landings"] == 0
    assert m["landed_set"] == sorted(w.good)


def measure(weights: tuple[int, int, int], seed: int, *, ordered: bool) -> dict[str, object]:
    """Mean and P95 turnaround (in mean build times T) per priority at the default point
    (n=300), with the priorities ordering the queue (``ordered``) or in arrival order
    (the same arrivals, every batch placed as ``normal``)."""
    w = draw(replace(simulate.DEFAULT, seed=seed))
    sim = _PrioritySim(w, CONFIGS["sticky"], rnd=random.Random(seed), weights=weights)
    prio: dict[int, Priority] = {}
    arrive = sim.arrive

    def arrive_and_note(i: int, t: int) -> None:
        arrive(i, t)
        b = sim.batches[bid(i)]
        prio[i] = b.priority
        if not ordered:
            sim.batches[b.id] = replace(b, priority=Priority.NORMAL, overtakes=(),
                                        dependencies=tuple(sorted((*b.dependencies,
                                                                   *b.overtakes))))

    sim.arrive = arrive_and_note  # type: ignore[method-assign]
    rec = sim.run()
    out: dict[str, object] = {"red": rec.red, "builds_per_landed":
                              round(rec.started / len(rec.landed_at), 2)}
    for p in Priority:
        xs = sorted((rec.landed_at[x] - w.arrival[x]) / T_MS for x in rec.landed_at
                    if prio[x] is p)
        if xs:
            out[p.value] = (round(sum(xs) / len(xs), 2), round(xs[int(0.95 * (len(xs) - 1))], 2))
    return out


if __name__ == "__main__":  # python -m tests.unit.test_simulate_priority 96,2,2
    import sys

    mix = tuple(int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "96,2,2").split(","))
    for s in (1, 2, 3):
        for ordered in (False, True):
            print(f"seed {s} {'priority' if ordered else 'arrival'}:",
                  measure(mix, s, ordered=ordered))  # type: ignore[arg-type]
