"""Vindication (``app/speculation/vindication.py``): every row of its table, containment,
the depth bound, and the planner's wait while a containing build runs."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation import vindication
from app.speculation.core import Resolution
from app.speculation.planner import PlanInput, plan

S, F = Assumption.SUCCEEDS, Assumption.FAILS


def batch(hid: str, deps: Sequence[str], t: int) -> Batch:
    return Batch(queue="q", id=hid, contains=(hid,), dependencies=tuple(deps),
                 state=BatchState.SPECULATING, version=1, created_at_ms=t)


def path(hid: str, **assume: Assumption) -> SpeculationPath:
    return SpeculationPath(head=hid, dependencies=tuple(assume.items()))


def entry(p: SpeculationPath, status: PathStatus, vindicated: int = 0) -> PathEntry:
    return PathEntry(path=p, status=status, attempt=1, vindicated=vindicated)


# a <- b <- c : b and c depend on a, c on b too; d is independent
BATCHES = {"a": batch("a", [], 1), "b": batch("b", ["a"], 2), "c": batch("c", ["a", "b"], 3),
           "d": batch("d", [], 4)}
ORDER = ["a", "b", "c", "d"]
DEPS = {k: b.dependencies for k, b in BATCHES.items()}
A = path("a")


def run(entries: dict[str, list[PathEntry]], depth: int = 2,
        res: dict[str, Resolution] | None = None) -> dict[str, list[PathEntry]]:
    return vindication.vindicate(ORDER, DEPS, entries, res or {}, depth, now=7)


def test_dependents_are_the_first_n_behind_that_name_the_head() -> None:
    assert vindication.dependents("a", ORDER, DEPS, 2) == ["b", "c"]
    assert vindication.dependents("a", ORDER, DEPS, 1) == ["b"]
    assert vindication.dependents("b", ORDER, DEPS, 5) == ["c"]
    assert vindication.dependents("d", ORDER, DEPS, 5) == []
    assert vindication.dependents("a", ORDER, DEPS, 0) == []


def test_a_path_contains_another_when_it_holds_the_head_and_agrees_on_what_both_name() -> None:
    b_on_a = path("b", a=S)
    assert vindication.contains(b_on_a, A)
    assert not vindication.contains(path("b", a=F), A)  # built without a
    c_on_both = path("c", a=S, b=S)
    assert vindication.contains(c_on_both, path("b", a=S))
    assert not vindication.contains(c_on_both, path("b", a=F))  # b's tree lacks a; c's has it
    assert not vindication.contains(path("c", a=F, b=S), path("b", a=S))
    assert vindication.contains(path("c", b=S), path("b", a=S))  # c does not conflict with a


def test_a_passed_containing_path_opens_the_failure_for_one_more_attempt() -> None:
    entries = {"a": [entry(A, PathStatus.FAILED)],
               "b": [entry(path("b", a=S), PathStatus.PASSED)]}
    out = run(entries)
    assert list(out) == ["a"]
    [e] = out["a"]
    assert (e.status, e.attempt, e.vindicated, e.updated_at_ms) == (PathStatus.PENDING, 2, 1, 7)
    assert entries["a"][0].status is PathStatus.FAILED  # the input is not changed


def test_only_a_containing_path_of_the_first_n_dependents_counts() -> None:
    entries = {"a": [entry(A, PathStatus.FAILED)],
               "b": [entry(path("b", a=F), PathStatus.PASSED)],  # without a: no evidence
               "c": [entry(path("c", a=S, b=F), PathStatus.PASSED)]}
    assert run(entries, depth=1) == {}  # c is the second dependent
    assert run(entries, depth=2)["a"][0].status is PathStatus.PENDING


def test_a_failure_is_vindicated_once_per_path() -> None:
    entries = {"a": [entry(A, PathStatus.FAILED, vindicated=1)],
               "b": [entry(path("b", a=S), PathStatus.PASSED)]}
    assert run(entries) == {}
    assert not vindication.pending("a", ORDER, DEPS, entries, {}, 2)


def test_without_evidence_or_with_depth_0_nothing_changes() -> None:
    failed_behind = {"a": [entry(A, PathStatus.FAILED)],
                     "b": [entry(path("b", a=S), PathStatus.FAILED)]}
    assert run(failed_behind) == {}
    assert not vindication.pending("a", ORDER, DEPS, failed_behind, {}, 2)
    passed_behind = {"a": [entry(A, PathStatus.FAILED)],
                     "b": [entry(path("b", a=S), PathStatus.PASSED)]}
    assert run(passed_behind, depth=0) == {}


def test_a_contradicted_failed_path_is_not_opened_again() -> None:
    b_on_a = path("b", a=S)
    entries = {"b": [entry(b_on_a, PathStatus.FAILED)],
               "c": [entry(path("c", a=S, b=S), PathStatus.PASSED)]}
    assert run(entries, res={})["b"][0].status is PathStatus.PENDING
    assert run(entries, res={"a": Resolution.FAILED}) == {}  # b's path assumed a lands


def test_a_live_containing_path_keeps_the_failure_pending() -> None:
    for live in (PathStatus.PENDING, PathStatus.BUILDING):
        entries = {"a": [entry(A, PathStatus.FAILED)],
                   "b": [entry(path("b", a=S), live)]}
        assert vindication.pending("a", ORDER, DEPS, entries, {}, 2)
        assert run(entries) == {}
        assert not vindication.pending("a", ORDER, DEPS, entries, {}, 0)


def plan_input(entries: dict[str, list[PathEntry]], depth: int) -> PlanInput:
    return PlanInput(batches={"a": BATCHES["a"], "b": BATCHES["b"]}, entries=entries,
                     probs={"a": 0.9, "b": 0.9}, budget=2, vindication_depth=depth)


def test_the_planner_waits_for_a_running_containing_build_before_it_fails_a_head() -> None:
    running = {"a": [entry(A, PathStatus.FAILED)],
               "b": [entry(path("b", a=S), PathStatus.BUILDING)]}
    assert [d.kind for d in plan(plan_input(running, 0)).decisions] == ["fail"]
    waited = plan(plan_input(running, 1))
    assert waited.decisions == () and waited.cancels == ()
    ended = {"a": running["a"], "b": [entry(path("b", a=S), PathStatus.FAILED)]}
    assert [(d.head, d.kind) for d in plan(plan_input(ended, 1)).decisions] == [("a", "fail")]
