"""Doomed paths: a path relying on a dependency's failed path is cancelled and not refunded."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation import doom
from app.speculation.core import Resolution
from app.speculation.planner import PlanInput, plan

S, F = Assumption.SUCCEEDS, Assumption.FAILS
OPEN = Resolution.UNRESOLVED


def batch(bid: str, deps: Sequence[str], at: int,
          state: BatchState = BatchState.SPECULATING) -> Batch:
    return Batch(queue="q", id=bid, contains=(bid,), dependencies=tuple(deps), state=state,
                 version=1, created_at_ms=at)


def path(head: str, *assumed: tuple[str, Assumption]) -> SpeculationPath:
    return SpeculationPath(head=head, dependencies=tuple(assumed))


def entry(p: SpeculationPath, status: PathStatus) -> PathEntry:
    return PathEntry(path=p, status=status, attempt=1, created_at_ms=1, updated_at_ms=1)


# b0 <- b1 <- b2: one lane; b1's build on top of b0 failed
LANE = {"b0": (), "b1": ("b0",), "b2": ("b0", "b1")}
B1_FAILED = path("b1", ("b0", S))


def _doomed(p: SpeculationPath, res: dict[str, Resolution] | None = None,
            deps: dict[str, tuple[str, ...]] | None = None) -> bool:
    failed = doom.failed_paths({"b1": [entry(B1_FAILED, PathStatus.FAILED)]})
    return doom.doomed(p, failed, res or {}, deps or LANE)


def test_a_path_that_agrees_with_a_failed_path_of_a_dependency_it_needs_is_doomed() -> None:
    assert _doomed(path("b2", ("b0", S), ("b1", S)))


def test_a_path_without_that_dependency_or_disagreeing_with_the_failure_is_not() -> None:
    assert not _doomed(path("b2", ("b0", S), ("b1", F)))  # built without b1
    # if b0 fails, b1 may still land through its other path (built without b0)
    assert not _doomed(path("b2", ("b0", F), ("b1", S)))


def test_a_fact_stands_in_for_the_agreement() -> None:
    # b0 landed: b1's failed path is b1's settled one, whatever b2 assumes about b0
    landed = {"b0": Resolution.SUCCEEDED, "b1": OPEN}
    deps = {**LANE, "b2": ("b1",)}
    assert _doomed(path("b2", ("b1", S)), landed, deps)
    # b0 still open and not among b2's dependencies: b1 may land without it
    assert not _doomed(path("b2", ("b1", S)), {}, deps)


def test_an_outdated_failure_or_a_settled_dependency_dooms_nothing() -> None:
    grown = {**LANE, "b1": ("b0", "bx")}  # b1's dependency list changed: new paths
    assert not _doomed(path("b2", ("b0", S), ("b1", S)), {}, grown)
    failed_b1 = {"b1": Resolution.FAILED}  # then the path is broken, not doomed
    assert not _doomed(path("b2", ("b0", S), ("b1", S)), failed_b1)


def _lane_snapshot(vindication_depth: int = 0) -> PlanInput:
    batches = {b: batch(b, deps, at=i) for i, (b, deps) in enumerate(LANE.items())}
    doomed_path = path("b2", ("b0", S), ("b1", S))
    entries = {
        "b0": [entry(path("b0"), PathStatus.BUILDING)],
        "b1": [entry(B1_FAILED, PathStatus.FAILED)],
        "b2": [entry(doomed_path, PathStatus.BUILDING)],
    }
    return PlanInput(batches=batches, entries=entries, probs={"b0": 0.9, "b1": 0.9, "b2": 0.9},
                     budget=5, allocator="sticky", now_ms=5, mean_build_ms=10.0,
                     min_probability=0.0,
                     vindication_depth=vindication_depth)


def test_the_sticky_planner_frees_a_doomed_build_and_funds_what_can_still_land() -> None:
    inp = _lane_snapshot()
    out = plan(inp)
    doomed_id = inp.entries["b2"][0].id
    assert out.cancels == (doomed_id,)
    funded = {p.id: p for p in out.builds}
    assert doomed_id not in funded  # never funded again while it is doomed
    assert path("b2", ("b0", S), ("b1", F)).id in funded  # b2 built without b1
    assert not out.decisions  # b1 waits for b0: its failure is not yet its verdict


def test_with_vindication_the_builds_containing_a_failure_keep_running() -> None:
    out = plan(_lane_snapshot(vindication_depth=1))
    assert out.cancels == ()
