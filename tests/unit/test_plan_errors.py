"""Plan errors are decided and attributed: ``PlanRejected`` (the controller's check) and
``PlanInvariantError`` (the planner's own) are not retryable and name the batches they
are about, as ``subjects`` the durable queue stores with the dead letter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.controllers.plan_check import PlanRejected, check_plan
from app.domain.entities import Batch, PathEntry, PathSet, SpeculationPath
from app.domain.errors import PlanError
from app.domain.states import Assumption, BatchState, PathStatus
from app.queue import classify
from app.speculation.invariants import check
from app.speculation.planner import Decision, Plan, PlanInput, PlanInvariantError

B1, B2 = "q/batch/1", "q/batch/2"


def batch(bid: str, state: BatchState = BatchState.SPECULATING) -> Batch:
    return Batch(queue="q", id=bid, contains=(bid,), dependencies=(), state=state, version=1)


def entry(head: str, status: PathStatus, *deps: str) -> PathEntry:
    return PathEntry(SpeculationPath(head, tuple((d, Assumption.SUCCEEDS) for d in deps)),
                     status)


def empty_plan(**kw: object) -> Plan:
    base = Plan(decisions=(), entries={}, dependencies={}, builds=(), cancels=(), rebuilds=0)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_a_budget_overrun_names_only_the_head_that_grew() -> None:
    batches = {B1: batch(B1), B2: batch(B2)}
    current = {B1: [entry(B1, PathStatus.BUILDING)], B2: [entry(B2, PathStatus.BUILDING)]}
    stored = {h: PathSet(queue="q", head=h, entries=tuple(es), version=1)
              for h, es in current.items()}
    extra = entry(B2, PathStatus.PENDING, B1)
    bad = empty_plan(entries={B2: (*current[B2], extra)})
    with pytest.raises(PlanRejected) as info:
        check_plan(batches, stored, current, bad, budget=2, queue="q")
    err = info.value
    assert err.batches == (B2,)
    assert err.subjects == [
        {"type": "batch", "id": B2, "reason": "speculation plan rejected: 3 live paths would "
         "exceed the build budget 2 (q/batch/2 gains 1)"},
        {"type": "queue", "id": "q"},
    ]
    assert classify(err) is False and err.retryable is False  # decided, not retried


def test_each_problem_is_attributed_to_its_own_batch() -> None:
    batches = {B1: batch(B1), B2: batch(B2, BatchState.MERGING)}
    passed = entry(B1, PathStatus.PASSED)
    current = {B1: [passed], B2: []}
    stored = {B1: PathSet(queue="q", head=B1, entries=(passed,), version=1)}
    bad = empty_plan(decisions=(Decision(head=B2, kind="merge"),),
                     entries={B1: (replace(passed, status=PathStatus.CANCELLED),)})
    with pytest.raises(PlanRejected) as info:
        check_plan(batches, stored, current, bad, budget=4, queue="q")
    assert info.value.problems == {
        B2: (f"decision on {B2}, which is not speculating",),
        B1: (f"passed path {passed.id[:12]} of {B1} would be cancelled",),
    }


def test_the_planners_invariant_error_names_its_head_and_is_not_retryable() -> None:
    inp = PlanInput(batches={B1: batch(B1, BatchState.MERGING), B2: batch(B2)},
                    entries={}, probs={}, budget=4)
    p = SpeculationPath(B1, ())
    bad = empty_plan(entries={B1: (PathEntry(p, PathStatus.PENDING),)}, builds=(p,))
    with pytest.raises(PlanInvariantError) as info:
        check(inp, bad, preempted=set())
    err = info.value
    assert isinstance(err, PlanError) and isinstance(err, AssertionError)
    assert err.batches == (B1,)
    assert err.subjects[0]["reason"] == (
        f"speculation plan breaks an invariant: build for {B1}, which is not a speculating "
        "head")
    assert classify(err) is False
