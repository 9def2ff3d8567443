"""The pure rules of speculation: refutation, settlement, verdicts, folding, funding."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, Build, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, BuildStatus, PathStatus
from app.speculation import core
from app.speculation.core import Resolution

S, F = Assumption.SUCCEEDS, Assumption.FAILS
R_OK, R_FAIL, R_OPEN = Resolution.SUCCEEDED, Resolution.FAILED, Resolution.UNRESOLVED


def head(deps: tuple[str, ...] = ("d1", "d2"), hid: str = "q/batch/9") -> Batch:
    return Batch(queue="q", id=hid, contains=("q/9",), dependencies=deps,
                 state=BatchState.SPECULATING, version=2)


def path(*assumptions: Assumption, deps: tuple[str, ...] = ("d1", "d2")) -> SpeculationPath:
    return SpeculationPath(head="q/batch/9", dependencies=tuple(zip(deps, assumptions,
                                                                    strict=True)))


def entry(p: SpeculationPath, status: PathStatus) -> PathEntry:
    return PathEntry(path=p, status=status)


def test_path_id_is_stable_and_depends_on_every_assumption() -> None:
    assert path(S, S).id == path(S, S).id
    assert len({path(S, S).id, path(S, F).id, path(F, S).id, path(F, F).id}) == 4
    assert path(S, F).base == ("d1",)


def test_resolution_of_batch_states() -> None:
    assert core.resolution(BatchState.SUCCEEDED) is R_OK
    assert core.resolution(BatchState.FAILED) is R_FAIL
    assert core.resolution(BatchState.CANCELLED) is R_FAIL
    for state in (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING,
                  BatchState.CANCELLING):
        assert core.resolution(state) is R_OPEN


def test_broken_and_settled() -> None:
    res = {"d1": R_OK, "d2": R_OPEN}
    assert not core.broken(path(S, S), res)
    assert core.broken(path(F, S), res)
    assert not core.settled(path(S, S), res)  # d2 still open
    res["d2"] = R_FAIL
    assert core.broken(path(S, S), res)
    assert core.settled(path(S, F), res)


def test_merge_only_on_a_passed_path_whose_assumptions_all_came_true() -> None:
    passed = entry(path(S, S), PathStatus.PASSED)
    assert core.decide(head(), [passed], {"d1": R_OK, "d2": R_OPEN}).kind == "wait"
    verdict = core.decide(head(), [passed], {"d1": R_OK, "d2": R_OK})
    assert (verdict.kind, verdict.path_id) == ("merge", passed.id)
    # A passed path that bet wrong is not a merge.
    assert core.decide(head(), [passed], {"d1": R_OK, "d2": R_FAIL}).kind == "wait"


def test_fail_only_when_every_dependency_settled_and_every_unbroken_path_failed() -> None:
    failed = entry(path(S, F), PathStatus.FAILED)
    res = {"d1": R_OK, "d2": R_FAIL}
    verdict = core.decide(head(), [failed], res)
    assert verdict.kind == "fail" and verdict.reason == core.NO_PATH_PASSED
    assert core.decide(head(), [failed], {"d1": R_OK, "d2": R_OPEN}).kind == "wait"
    assert core.decide(head(), [], res).kind == "wait"  # nothing funded is not a failure
    building = entry(path(S, F), PathStatus.BUILDING)
    assert core.decide(head(), [building], res).kind == "wait"


def test_a_head_without_dependencies() -> None:
    alone = head(deps=())
    p = SpeculationPath(head=alone.id, dependencies=())
    assert core.decide(alone, [entry(p, PathStatus.PASSED)], {}).kind == "merge"
    assert core.decide(alone, [entry(p, PathStatus.FAILED)], {}).kind == "fail"


def build(status: BuildStatus) -> Build:
    return Build(queue="q", id="b1", batch_id="q/batch/9", path_id="x", attempt=1,
                 status=status, version=1)


def test_fold_build_results_into_entries() -> None:
    p = path(S, S)
    pending = entry(p, PathStatus.PENDING)
    assert core.fold(pending, None, False, 1).status is PathStatus.PENDING
    assert core.fold(pending, build(BuildStatus.RUNNING), True, 1).status is PathStatus.BUILDING
    assert core.fold(pending, build(BuildStatus.SUCCEEDED), True, 1).status is PathStatus.PASSED
    building = entry(p, PathStatus.BUILDING)
    assert core.fold(building, build(BuildStatus.FAILED), True, 1).status is PathStatus.FAILED
    cancelling = entry(p, PathStatus.CANCELLING)
    assert core.fold(cancelling, None, False, 1).status is PathStatus.CANCELLED
    assert core.fold(cancelling, build(BuildStatus.RUNNING), True, 1).status \
        is PathStatus.CANCELLING
    assert core.fold(cancelling, build(BuildStatus.SUCCEEDED), True, 1).status \
        is PathStatus.CANCELLED
    passed = entry(p, PathStatus.PASSED)
    assert core.fold(passed, build(BuildStatus.FAILED), True, 1) is passed


def test_an_errored_build_gives_its_path_a_new_attempt_then_counts_as_failed() -> None:
    p = path(S, S)
    building = entry(p, PathStatus.BUILDING)
    retried = core.fold(building, build(BuildStatus.ERRORED), True, 7)
    assert (retried.status, retried.attempt, retried.updated_at_ms) == (PathStatus.PENDING, 2, 7)
    assert retried.id == building.id  # same path, new attempt: never a red verdict
    last = PathEntry(path=p, status=PathStatus.BUILDING, attempt=core.MAX_BUILD_ATTEMPTS)
    assert core.fold(last, build(BuildStatus.ERRORED), True, 8).status is PathStatus.FAILED
    cancelling = entry(p, PathStatus.CANCELLING)
    assert core.fold(cancelling, build(BuildStatus.ERRORED), True, 9).status \
        is PathStatus.CANCELLED


def test_a_failed_build_is_retried_up_to_retries_and_spends_no_errored_attempt() -> None:
    p = path(S, S)
    building = entry(p, PathStatus.BUILDING)
    assert core.fold(building, build(BuildStatus.FAILED), True, 1).status is PathStatus.FAILED
    again = core.fold(building, build(BuildStatus.FAILED), True, 2, retries=2)
    assert (again.status, again.attempt, again.retried) == (PathStatus.PENDING, 2, 1)
    third = core.fold(replace(again, status=PathStatus.BUILDING), build(BuildStatus.FAILED),
                      True, 3, retries=2)
    assert (third.status, third.attempt, third.retried) == (PathStatus.PENDING, 3, 2)
    done = core.fold(replace(third, status=PathStatus.BUILDING), build(BuildStatus.FAILED),
                     True, 4, retries=2)
    assert (done.status, done.attempt) == (PathStatus.FAILED, 3)
    # retried attempts are not errored ones: the errored budget is intact
    late = replace(third, status=PathStatus.BUILDING,
                   attempt=core.MAX_BUILD_ATTEMPTS + third.retried - 1)
    assert core.fold(late, build(BuildStatus.ERRORED), True, 5, retries=2).status \
        is PathStatus.PENDING
    assert core.fold(replace(late, attempt=late.attempt + 1), build(BuildStatus.ERRORED),
                     True, 6, retries=2).status is PathStatus.FAILED


def test_cancel_stops_live_paths_only() -> None:
    p = path(S, S)
    assert core.cancel(entry(p, PathStatus.BUILDING), linked=True, now=1).status \
        is PathStatus.CANCELLING
    assert core.cancel(entry(p, PathStatus.PENDING), linked=False, now=1).status \
        is PathStatus.CANCELLED
    passed = entry(p, PathStatus.PASSED)
    assert core.cancel(passed, linked=True, now=1) is passed


def test_likely_path_takes_settled_outcomes_and_assumes_the_rest_land() -> None:
    p = core.likely_path(head(), {"d1": R_FAIL, "d2": R_OPEN})
    assert p.dependencies == (("d1", F), ("d2", S))
    assert core.likely_path(head(), {"d1": R_OK}).dependencies == (("d1", S), ("d2", S))


def test_sticky_funding_fills_free_slots_oldest_first_and_never_refunds() -> None:
    heads = [head(deps=(), hid=f"q/batch/{i}") for i in range(5)]
    funded = core.sticky_fund(heads, {}, {}, budget=3)
    assert [p.head for p in funded] == ["q/batch/0", "q/batch/1", "q/batch/2"]
    entries = {p.head: [PathEntry(path=p, status=PathStatus.BUILDING)] for p in funded}
    more = core.sticky_fund(heads, entries, {}, budget=4)
    assert [p.head for p in more] == ["q/batch/3"]
    done = {h: [PathEntry(path=es[0].path, status=PathStatus.PASSED)]
            for h, es in entries.items()}
    again = core.sticky_fund(heads, done, {}, budget=4)
    assert [p.head for p in again] == ["q/batch/3", "q/batch/4"]


_RES = st.sampled_from(list(core.Resolution))


@settings(max_examples=300, deadline=None)
@given(deps=st.lists(st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(list(Assumption))),
                     unique_by=lambda x: x[0], max_size=8),
       res=st.dictionaries(st.sampled_from("abcdefghij"), _RES),
       later=st.lists(st.tuples(st.sampled_from("abcdefghij"), _RES), max_size=4))
def test_facts_answer_broken_and_settled_as_a_plain_mapping_does(
        deps: list[tuple[str, Assumption]], res: dict[str, core.Resolution],
        later: list[tuple[str, core.Resolution]]) -> None:
    """``core.Facts`` (sets of the settled outcomes, kept up to date by assignment) is a
    faster route to the same answers as the plain per-dependency walk."""
    path = SpeculationPath(head="h", dependencies=tuple(deps))
    facts = core.Facts(res)
    plain = dict(res)
    for key, value in [("", core.Resolution.UNRESOLVED), *later]:
        facts[key] = value
        plain[key] = value
        assert core.broken(path, facts) == core.broken(path, plain)
        assert core.settled(path, facts) == core.settled(path, plain)
