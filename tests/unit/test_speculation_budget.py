"""The build budget across plans: snapshots that already hold more live paths than the
budget (cancelling paths keep their slot, a lowered budget, errored builds retried,
cancelled paths funded again, merging and cancelling batches), and snapshots reached the
way the speculate controller reaches them (fold, plan, write, builds that end or are
lost, batches cancelled and merged, the budget changed in the configuration)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.controllers.plan_check import check_plan
from app.domain.entities import Batch, Build, PathEntry, PathSet, SpeculationPath
from app.domain.states import Assumption, BatchState, BuildStatus, PathStatus
from app.speculation import core
from app.speculation.allocator import AllocatorName
from app.speculation.planner import CoveragePolicy, Plan, PlanInput, plan

S, F = Assumption.SUCCEEDS, Assumption.FAILS
ALLOCATORS: tuple[AllocatorName, ...] = ("sticky", "preempting")
COVERAGES = (None, CoveragePolicy(min_remaining=0.0),
             CoveragePolicy(min_remaining=0.0, complements=True))


def qb(bid: str, deps: Sequence[str] = (), state: BatchState = BatchState.SPECULATING,
       t: int = 0) -> Batch:
    return Batch(queue="q", id=bid, contains=(bid,), dependencies=tuple(deps), state=state,
                 version=1, created_at_ms=t)


def pe(bid: str, deps: Sequence[str], assumptions: Sequence[Assumption], status: PathStatus,
       attempt: int = 1) -> PathEntry:
    return PathEntry(SpeculationPath(bid, tuple(zip(deps, assumptions, strict=True))), status,
                     attempt=attempt)


def live(entries: Mapping[str, Sequence[PathEntry]]) -> int:
    return sum(1 for es in entries.values() for e in es if e.status.live)


def after(inp: PlanInput, out: Plan) -> dict[str, Sequence[PathEntry]]:
    return {**inp.entries, **out.entries}


def test_allocators_count_slots_entry_by_entry_like_the_invariant() -> None:
    """Regression: the allocators counted live slots per distinct path id, the invariant
    (and the controller's check) every stored entry. On a snapshot holding one path id
    twice the planner funded one path too many and raised its own ``PlanInvariantError``
    (budget exceeded: 4 live paths, budget 3). The controller never writes such a path
    set; the counts must agree whatever the snapshot holds."""
    twice = pe("a", [], [], PathStatus.BUILDING)
    batches = {"a": qb("a"), "h": qb("h", ["a"], t=1), "c": qb("c", t=2)}
    for allocator in ALLOCATORS:
        inp = PlanInput(batches=batches, entries={"a": [twice, twice]}, probs={}, budget=3,
                        allocator=allocator)
        out = plan(inp)
        assert len(out.builds) == 1
        assert live(after(inp, out)) == 3


def over_budget_snapshot() -> tuple[dict[str, Batch], dict[str, list[PathEntry]]]:
    """Five live paths: a merging batch's sibling path still cancelling, a cancelling
    batch's build, a lost build's retry (``pending``, attempt 2), two funded paths of a
    speculating head; a cancelled path another head could fund again, and a head with
    nothing funded yet."""
    batches = {"k": qb("k", state=BatchState.SUCCEEDED),
               "m": qb("m", ["k"], state=BatchState.MERGING, t=1),
               "x": qb("x", state=BatchState.CANCELLING, t=2), "r": qb("r", t=3),
               "h": qb("h", ["r"], t=4), "g": qb("g", ["r"], t=5), "n": qb("n", t=6)}
    entries = {
        "m": [pe("m", ["k"], [S], PathStatus.PASSED), pe("m", ["k"], [F], PathStatus.CANCELLING)],
        "x": [pe("x", [], [], PathStatus.CANCELLING)],
        "r": [pe("r", [], [], PathStatus.PENDING, attempt=2)],
        "h": [pe("h", ["r"], [S], PathStatus.BUILDING), pe("h", ["r"], [F], PathStatus.BUILDING)],
        "g": [pe("g", ["r"], [S], PathStatus.CANCELLED)],
    }
    return batches, entries


@pytest.mark.parametrize("coverage", COVERAGES)
@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("budget", [1, 2, 4, 5])
def test_a_snapshot_at_or_over_its_budget_funds_nothing_and_plans_without_error(
        budget: int, allocator: AllocatorName, coverage: CoveragePolicy | None) -> None:
    """A lowered budget, or slots held by cancelling builds: the plan adds nothing."""
    batches, entries = over_budget_snapshot()
    assert live(entries) == 5
    inp = PlanInput(batches=batches, entries=entries, probs={}, budget=budget,
                    allocator=allocator, coverage=coverage)
    out = plan(inp)
    assert out.builds == ()
    assert live(after(inp, out)) <= live(entries)
    if allocator == "sticky":
        assert out.cancels == ()


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_slots_freed_by_refutation_are_refilled_up_to_the_budget_only(
        allocator: AllocatorName) -> None:
    """Over budget until the plan refutes unstarted paths: then it funds the freed slots,
    and not one more."""
    batches, entries = over_budget_snapshot()
    batches["r"] = replace(batches["r"], state=BatchState.FAILED)
    del entries["r"]  # r failed: h's and g's paths that bet on it landing are refuted
    refuted = [pe("h", ["r"], [S], PathStatus.PENDING), pe("g", ["r"], [S], PathStatus.PENDING)]
    entries["h"] = [refuted[0], pe("h", ["r"], [F], PathStatus.PENDING)]
    entries["g"] = [refuted[1]]
    inp = PlanInput(batches=batches, entries=entries, probs={}, budget=4,
                    allocator=allocator)
    assert live(entries) == 5
    out = plan(inp)
    assert set(out.cancels) == {e.id for e in refuted}  # never started: slots free at once
    assert len(out.builds) == 1
    assert live(after(inp, out)) == 4


def test_a_lost_build_at_full_budget_gets_its_retry_and_nothing_more() -> None:
    path = pe("a", [], [], PathStatus.BUILDING)
    lost = Build(queue="q", id="b1", batch_id="a", path_id=path.id, attempt=1,
                 status=BuildStatus.ERRORED, version=2)
    retry = core.fold(path, lost, True, 5)
    assert (retry.status, retry.attempt) == (PathStatus.PENDING, 2)
    batches = {"a": qb("a"), "h": qb("h", ["a"], t=1), "n": qb("n", t=2)}
    entries = {"a": [retry], "h": [pe("h", ["a"], [S], PathStatus.BUILDING)]}
    for allocator in ALLOCATORS:
        inp = PlanInput(batches=batches, entries=entries, probs={}, budget=2,
                        allocator=allocator)
        out = plan(inp)
        assert out.builds == () and "a" not in out.entries  # the retry keeps its slot


def test_a_cancelled_path_funded_again_takes_exactly_one_slot() -> None:
    """A preempted path that must still land comes back as its next attempt, in one free
    slot; the next head in line (as likely) waits for another."""
    batches = {"d": qb("d"), "h": qb("h", ["d"], t=1), "g": qb("g", ["d"], t=2)}
    stopped = pe("h", ["d"], [S], PathStatus.CANCELLED)
    entries = {"d": [pe("d", [], [], PathStatus.BUILDING)], "h": [stopped]}
    inp = PlanInput(batches=batches, entries=entries, probs={}, budget=2, min_probability=0.5)
    out = plan(inp)
    assert [p.id for p in out.builds] == [stopped.id]
    assert [(e.status, e.attempt) for e in out.entries["h"]] == [(PathStatus.PENDING, 2)]
    assert live(after(inp, out)) == 2


# --- snapshots reached the way the controller reaches them ------------------------------

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)
ENDINGS = (BuildStatus.ERRORED, BuildStatus.SUCCEEDED, BuildStatus.FAILED, BuildStatus.CANCELLED)


class Queue:
    """One queue's stored state, driven like the controllers drive it: ``build`` links a
    pending path to a build, builds end (``errored`` = lost to a kill), ``cancel`` asks to
    stop a batch, a merge lands or fails, the budget changes on a restart; each
    ``speculate`` run loads the active batches, folds, plans, checks and writes."""

    def __init__(self, rng: random.Random, budget: int) -> None:
        self.rng, self.budget = rng, budget
        self.batches: dict[str, Batch] = {}
        self.sets: dict[str, tuple[PathEntry, ...]] = {}
        self.links: dict[tuple[str, int], str] = {}
        self.builds: dict[str, BuildStatus] = {}

    def events(self, t: int) -> None:
        rng = self.rng
        if rng.random() < 0.6:
            ahead = [b.id for b in self.batches.values() if b.state.dependency_eligible]
            bid = f"b{len(self.batches)}"
            self.batches[bid] = qb(bid, [d for d in ahead if rng.random() < 0.5],
                                   BatchState.CREATED, t)
        for b in list(self.batches.values()):
            if b.state.cancellable and b.state is not BatchState.CANCELLING \
                    and rng.random() < 0.03:
                self.batches[b.id] = replace(b, state=BatchState.CANCELLING)
            elif b.state is BatchState.MERGING and rng.random() < 0.3:
                self.batches[b.id] = replace(b, state=rng.choice(
                    [BatchState.SUCCEEDED] * 4 + [BatchState.FAILED]))
        for head, es in self.sets.items():
            for e in es:
                key = (e.id, e.attempt)
                if e.status is PathStatus.PENDING and key not in self.links \
                        and not self.batches[head].state.halted and rng.random() < 0.7:
                    self.links[key] = f"B{len(self.builds)}"
                    self.builds[self.links[key]] = BuildStatus.RUNNING
        for build, status in self.builds.items():
            if not status.terminal and rng.random() < 0.4:
                self.builds[build] = rng.choice(ENDINGS)
        if rng.random() < 0.05:
            self.budget = rng.randint(1, 5)

    def linked(self, e: PathEntry) -> bool:
        return (e.id, e.attempt) in self.links

    def fold(self, head: str, e: PathEntry, t: int) -> PathEntry:
        build = self.links.get((e.id, e.attempt))
        found = None if build is None else Build(
            queue="q", id=build, batch_id=head, path_id=e.id, attempt=e.attempt,
            status=self.builds[build], version=1)
        return core.fold(e, found, self.linked(e), t)

    def speculate(self, t: int, *, allocator: AllocatorName, coverage: CoveragePolicy | None,
                  min_probability: float, hedge_by_time: bool) -> None:
        active = {b.id: b for b in self.batches.values() if b.state in ACTIVE}
        snap = dict(active)
        snap.update({d: self.batches[d] for b in active.values() for d in b.dependencies})
        stored = {h: PathSet(queue="q", head=h, entries=self.sets.get(h, ())) for h in active}
        entries = {h: [self.fold(h, e, t) for e in self.sets.get(h, ())] for h in active}
        for b in active.values():
            if b.state is BatchState.CREATED:
                snap[b.id] = self.batches[b.id] = replace(b, state=BatchState.SPECULATING)
            elif b.state is BatchState.CANCELLING:
                entries[b.id] = [core.cancel(e, linked=self.linked(e), now=t)
                                 for e in entries[b.id]]
                if not core.live(entries[b.id]):
                    snap[b.id] = self.batches[b.id] = replace(b, state=BatchState.CANCELLED)
        inp = PlanInput(batches=snap, entries=entries,
                        probs={b: self.rng.uniform(0.3, 0.99) for b in snap},
                        budget=self.budget, allocator=allocator, coverage=coverage, now_ms=t,
                        mean_build_ms=3.0, min_probability=min_probability,
                        hedge_by_time=hedge_by_time)
        out = plan(inp, linked=self.linked)  # raises PlanInvariantError on a violation
        check_plan(snap, stored, entries, out, budget=self.budget)
        before, now = live(entries), live(after(inp, out))
        assert now <= max(self.budget, before)
        assert not out.builds or now <= self.budget
        self.sets.update({h: tuple(es) for h, es in entries.items()})
        self.sets.update(out.entries)
        for d in out.decisions:
            state = BatchState.MERGING if d.kind == "merge" else BatchState.FAILED
            self.batches[d.head] = replace(self.batches[d.head], state=state)
        for bid, deps in out.dependencies.items():
            self.batches[bid] = replace(self.batches[bid], dependencies=deps)


@settings(max_examples=60, deadline=None)
@given(rng=st.randoms(use_true_random=False), budget=st.integers(min_value=1, max_value=5),
       allocator=st.sampled_from(ALLOCATORS), coverage=st.sampled_from(COVERAGES),
       min_probability=st.sampled_from([0.0, 0.1]), hedge_by_time=st.booleans())
def test_reachable_snapshots_never_break_an_invariant_nor_the_budget(
        rng: random.Random, budget: int, allocator: AllocatorName, coverage: CoveragePolicy | None,
        min_probability: float, hedge_by_time: bool) -> None:
    queue = Queue(rng, budget)
    for t in range(1, 40):
        queue.events(t)
        queue.speculate(t, allocator=allocator, coverage=coverage,
                        min_probability=min_probability, hedge_by_time=hedge_by_time)
