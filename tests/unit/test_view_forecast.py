"""The status pages' forecast (pure): P(land) from build evidence, P(speculation holds),
and the ETA from the queue's recent durations."""

from __future__ import annotations

import math

import pytest

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.views.forecast import (
    MAX_EXACT,
    QueueSnapshot,
    expected_total,
    forecast_batches,
    forecast_unbatched,
    posterior_good,
    timing,
)

S, F = Assumption.SUCCEEDS, Assumption.FAILS


def batch(n: int, state: BatchState = BatchState.SPECULATING, deps: tuple[int, ...] = (),
          updated: int = 0) -> Batch:
    return Batch(queue="q", id=f"q/batch/{n}", contains=(f"q/{n}",),
                 dependencies=tuple(f"q/batch/{d}" for d in deps), state=state, version=1,
                 created_at_ms=n, updated_at_ms=updated)


def entry(head: int, deps: dict[int, Assumption], status: PathStatus) -> PathEntry:
    return PathEntry(path=SpeculationPath(
        head=f"q/batch/{head}",
        dependencies=tuple((f"q/batch/{d}", a) for d, a in deps.items())), status=status)


def test_posterior_is_the_prior_without_evidence_and_one_after_a_passed_build() -> None:
    assert posterior_good(0.8, {}, [], passed=False) == pytest.approx(0.8)
    assert posterior_good(0.8, {}, [frozenset({"d"})], passed=True) == 1.0
    assert posterior_good(2.0, {}, [], passed=False) == pytest.approx(0.95)  # invalid prior


def test_a_failed_build_of_the_head_alone_means_it_is_bad() -> None:
    assert posterior_good(0.9, {}, [frozenset()], passed=False) == 0.0


def test_a_failed_build_on_top_of_a_dependency_is_weighed_by_bayes() -> None:
    # q = P(dep bad) = 0.1: 0.9*0.1 / (0.9*0.1 + 0.1)
    got = posterior_good(0.9, {"d": 0.9}, [frozenset({"d"})], passed=False)
    assert got == pytest.approx(0.09 / 0.19)
    # a more doubtful dependency takes most of the blame
    assert posterior_good(0.9, {"d": 0.2}, [frozenset({"d"})], passed=False) > 0.85


def test_overlapping_failures_are_enumerated_exactly() -> None:
    # {a} failed and {a, b} failed: both hold iff a is bad, so q = P(a bad) = 0.3
    got = posterior_good(0.5, {"a": 0.7, "b": 0.6}, [frozenset({"a"}), frozenset({"a", "b"})],
                         passed=False)
    assert got == pytest.approx(0.5 * 0.3 / (0.5 * 0.3 + 0.5))


def test_many_dependencies_fall_back_to_independent_statements() -> None:
    deps = {f"d{i}": 0.9 for i in range(MAX_EXACT + 1)}
    base = frozenset(deps)
    q = 1 - 0.9 ** len(deps)
    got = posterior_good(0.9, deps, [base], passed=False)
    assert got == pytest.approx(0.9 * q / (0.9 * q + 0.1))


def test_expected_total_conditions_on_time_already_spent() -> None:
    samples = [100, 200, 300, 1000]
    assert expected_total(samples, 0) == 250
    assert expected_total(samples, 250) == 650
    assert expected_total(samples, 2000) is None
    t = timing([300, 100, -5, 200], [50])
    assert (t.build_ms, t.merge_ms, t.build_samples, t.builds) == (200, 50, 3, (100, 200, 300))


def snap(batches: list[Batch], entries: dict[str, list[PathEntry]] | None = None, *,
         started: dict[str, int] | None = None, probs: dict[str, float] | None = None,
         builds: list[int] = (1000,), merges: list[int] = (200,),  # type: ignore[assignment]
         now: int = 10_000, budget: int = 0) -> QueueSnapshot:
    return QueueSnapshot(batches={b.id: b for b in batches}, entries=entries or {},
                         build_started_ms=started or {}, probs=probs or {},
                         timing=timing(builds, merges), now_ms=now, build_budget=budget)


def test_a_head_alone_lands_after_one_build_and_one_merge() -> None:
    b1 = batch(1)
    out = forecast_batches(snap([b1], probs={b1.id: 0.8}), [b1.id])[b1.id]
    assert out.p_land == pytest.approx(0.8)
    assert out.p_speculation_holds == pytest.approx(1.0)  # no dependency to guess about
    assert out.eta_at_ms == 10_000 + 1000 + 200
    assert "best path" in out.basis


def test_a_running_build_counts_time_already_spent_and_dependencies_come_first() -> None:
    b1 = batch(1)
    b2 = batch(2, deps=(1,))
    e1 = entry(1, {}, PathStatus.BUILDING)
    e2 = entry(2, {1: S}, PathStatus.BUILDING)
    s = snap([b1, b2], {b1.id: [e1], b2.id: [e2]}, started={e1.id: 9_500, e2.id: 9_000},
             probs={b1.id: 0.75, b2.id: 0.9})
    out = forecast_batches(s, [b1.id, b2.id])
    assert out[b1.id].eta_at_ms == 9_500 + 1000 + 200
    # b2 holds iff b1 lands (0.75): its build ends at 10_000 but it must wait for b1
    # (10_700), and a quarter of the time it needs one more build
    assert out[b2.id].p_speculation_holds == pytest.approx(0.75)
    assert out[b2.id].eta_at_ms == round(10_700 + 0.25 * 1000 + 200)
    assert out[b2.id].remaining_ms(10_000) == out[b2.id].eta_at_ms - 10_000


def test_a_build_slower_than_every_recent_one_has_no_eta() -> None:
    b1 = batch(1)
    e1 = entry(1, {}, PathStatus.BUILDING)
    out = forecast_batches(snap([b1], {b1.id: [e1]}, started={e1.id: 1}), [b1.id])[b1.id]
    assert out.eta_at_ms is None and "longer than every recent build" in out.basis


def test_failed_paths_lower_p_land_and_two_funded_paths_add_up() -> None:
    b1 = batch(1)
    b2 = batch(2, deps=(1,))
    failed = entry(2, {1: S}, PathStatus.FAILED)
    other = entry(2, {1: F}, PathStatus.BUILDING)
    s = snap([b1, b2], {b2.id: [failed, other]}, probs={b1.id: 0.5, b2.id: 0.9})
    out = forecast_batches(s, [b2.id])[b2.id]
    assert out.p_land == pytest.approx(0.9 * 0.5 / (0.9 * 0.5 + 0.1))
    assert out.p_speculation_holds == pytest.approx(0.5)  # only the live one counts
    s2 = snap([b1, b2], {b2.id: [entry(2, {1: S}, PathStatus.BUILDING), other]},
              probs={b1.id: 0.5})
    assert forecast_batches(s2, [b2.id])[b2.id].p_speculation_holds == pytest.approx(1.0)


def test_settled_states_cancels_merges_and_missing_history() -> None:
    landed, failed = batch(1, BatchState.SUCCEEDED), batch(2, BatchState.FAILED)
    cancelling = batch(3, BatchState.CANCELLING)
    merging = batch(4, BatchState.MERGING, updated=9_900)
    out = forecast_batches(snap([landed, failed, cancelling, merging]),
                           [landed.id, failed.id, cancelling.id, merging.id])
    assert out[landed.id].p_land == 1.0 and out[failed.id].p_land == 0.0
    assert out[cancelling.id].p_land == 0.0
    assert out[merging.id].eta_at_ms == 9_900 + 200
    head = batch(5)
    none = forecast_batches(snap([head], builds=[], merges=[]), [head.id])[head.id]
    assert none.eta_at_ms is None and "no finished build" in none.basis
    assert none.p_land == pytest.approx(0.95)  # no scorer value: the generator's default


def test_a_dependency_on_a_landed_batch_is_settled_and_costs_nothing() -> None:
    dep = batch(1, BatchState.SUCCEEDED)
    head = batch(2, deps=(1,))
    out = forecast_batches(snap([dep, head], probs={head.id: 0.6}), [head.id])[head.id]
    assert out.p_speculation_holds == pytest.approx(1.0)
    assert out.eta_at_ms == 10_000 + 1000 + 200


def test_a_request_not_batched_yet_needs_a_build_and_a_merge() -> None:
    f = forecast_unbatched(0.7, timing([1000], [100]), 5)
    assert (f.p_land, f.eta_at_ms) == (pytest.approx(0.7), 1105)
    assert forecast_unbatched(math.nan, timing([], []), 5).eta_at_ms is None


def test_a_batch_waiting_for_a_build_slot_lands_after_a_slot_frees() -> None:
    """Two slots, both held by builds under way: the first unfunded batch builds when
    the earlier one ends, the second when the later one ends, the third a build after
    the first (queue order); none of them 'now + one build' as if a slot were free."""
    b1, b2 = batch(1), batch(2)
    waiting = [batch(n) for n in (3, 4, 5)]
    e1, e2 = entry(1, {}, PathStatus.BUILDING), entry(2, {}, PathStatus.BUILDING)
    s = snap([b1, b2, *waiting], {b1.id: [e1], b2.id: [e2]},
             started={e1.id: 9_800, e2.id: 9_400}, budget=2)
    out = forecast_batches(s, [b.id for b in waiting])
    first_free, second_free = 9_400 + 1000, 9_800 + 1000
    assert out["q/batch/3"].eta_at_ms == first_free + 1000 + 200
    assert out["q/batch/4"].eta_at_ms == second_free + 1000 + 200
    assert out["q/batch/5"].eta_at_ms == first_free + 1000 + 1000 + 200
    assert "waiting for a build slot" in out["q/batch/3"].basis
    # a free slot: the planner funds it now, the forecast is unchanged
    free = forecast_batches(snap([b1, *waiting], {b1.id: [e1]}, started={e1.id: 9_800},
                                 budget=2), ["q/batch/3"])["q/batch/3"]
    assert free.eta_at_ms == 10_000 + 1000 + 200


def test_a_batch_waiting_for_a_slot_held_by_an_overdue_build_has_no_eta() -> None:
    """The builds holding the slots have run longer than every recent build: the
    batches waiting behind them have no ETA, not 'in < 1 s'."""
    b1 = batch(1)
    e1 = entry(1, {}, PathStatus.BUILDING)
    s = snap([b1, batch(2)], {b1.id: [e1]}, started={e1.id: 1}, budget=1)
    out = forecast_batches(s, ["q/batch/2"])["q/batch/2"]
    assert out.eta_at_ms is None and "waits for a build slot" in out.basis
