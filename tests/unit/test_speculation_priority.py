"""Priority ordering (pure): where a new batch goes among conflicting batches in flight
(``place``), how the planner turns overtakes into dependency edges (``overtaking``), and
the allocator's preference for higher priority heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus, Priority
from app.speculation.planner import PlanInput, plan
from app.speculation.priority import overtaking, place, reaches

N, H, X = Priority.NORMAL, Priority.HIGH, Priority.HOTFIX
SPEC, MERGING = BatchState.SPECULATING, BatchState.MERGING


def b(bid: str, deps: Sequence[str] = (), *, prio: Priority = N,
      state: BatchState = SPEC, overtakes: Sequence[str] = (), t: int = 0) -> Batch:
    return Batch(queue="q", id=bid, contains=(bid,), dependencies=tuple(deps), state=state,
                 version=1, priority=prio, overtakes=tuple(overtakes),
                 created_at_ms=t or int(bid.lstrip("b") or 0))


def cyclic(deps: Mapping[str, Sequence[str]]) -> bool:
    return any(reaches(ds, bid, deps) for bid, ds in deps.items())


# --- place: dependency analysis ---------------------------------------------------------

def test_a_normal_batch_depends_on_every_conflicting_batch_as_before() -> None:
    ahead = [b("b1"), b("b2", prio=X), b("b3", state=MERGING)]
    assert place(b("b4"), ahead) == (("b1", "b2", "b3"), ())


def test_a_hotfix_jumps_conflicting_not_merging_batches_and_stays_behind_merging_ones() -> None:
    ahead = [b("b1"), b("b2", state=MERGING), b("b3", prio=H), b("b4", prio=X)]
    deps, overtakes = place(b("b5", prio=X), ahead)
    assert deps == ("b2", "b4")  # the merging one and the other hotfix stay ahead
    assert overtakes == ("b1", "b3")


def test_high_jumps_normal_but_not_high_or_hotfix() -> None:
    ahead = [b("b1"), b("b2", prio=H), b("b3", prio=X)]
    assert place(b("b4", prio=H), ahead) == (("b2", "b3"), ("b1",))


def test_a_lower_batch_that_a_batch_ahead_depends_on_stays_ahead() -> None:
    # b2 (merging) depends on b1; overtaking b1 would close b5 -> b2 -> b1 -> b5
    ahead = [b("b1"), b("b2", ["b1"], state=MERGING)]
    assert place(b("b5", prio=X), ahead) == (("b1", "b2"), ())
    # also through a batch in flight that does not conflict with the new one
    graph = {"b1": (), "b2": ("b1",), "b3": ("b2",)}
    assert place(b("b5", prio=X), [b("b1"), b("b3", ["b2"], prio=X)], graph) == \
        (("b1", "b3"), ())


def test_independent_lanes_are_untouched() -> None:
    # only conflicting batches are passed: nothing else is ever named
    assert place(b("b9", prio=X), []) == ((), ())


# --- overtaking: the planner -------------------------------------------------------------

def deps_of(batches: Mapping[str, Batch]) -> dict[str, tuple[str, ...]]:
    return {bid: x.dependencies for bid, x in batches.items()}


def test_an_overtaken_batch_gains_the_hotfix_once() -> None:
    bs = {x.id: x for x in [b("b1"), b("b2", ["b1"]), b("b3", prio=X, overtakes=["b1"])]}
    grown = overtaking(bs, deps_of(bs))
    assert grown == {"b1": ("b3",)}
    applied = {k: replace(v, dependencies=grown.get(k, v.dependencies)) for k, v in bs.items()}
    assert overtaking(applied, deps_of(applied)) == {}  # replay-safe: applied once


def test_an_overtaken_batch_that_is_merging_meanwhile_stays_ahead() -> None:
    for state in (MERGING, BatchState.SUCCEEDED):
        bs = {x.id: x for x in [b("b1", state=state), b("b3", prio=X, overtakes=["b1"])]}
        assert overtaking(bs, deps_of(bs)) == {"b3": ("b1",)}


def test_an_overtaken_batch_that_will_not_land_changes_nothing() -> None:
    for state in (BatchState.FAILED, BatchState.CANCELLED, BatchState.CANCELLING):
        bs = {x.id: x for x in [b("b1", state=state), b("b3", prio=X, overtakes=["b1"])]}
        assert overtaking(bs, deps_of(bs)) == {}


def test_a_decided_hotfix_applies_nothing_more() -> None:
    bs = {x.id: x for x in [b("b1"), b("b3", prio=X, overtakes=["b1"], state=MERGING)]}
    assert overtaking(bs, deps_of(bs)) == {}


def test_no_edge_closes_a_cycle() -> None:
    # b1 and b2 name each other (b2 merged on coverage over b1, which gained it);
    # b3 depends on b2 and overtook b1: b1 -> b3 would close b1 -> b3 -> b2 -> b1, and
    # b3 -> b1 adds nothing new (b3 reaches b1 already): the pair is left alone
    bs = {x.id: x for x in [b("b1", ["b2"]), b("b2", ["b1"], state=MERGING),
                            b("b3", ["b2"], prio=X, overtakes=["b1"])]}
    assert overtaking(bs, deps_of(bs)) == {"b3": ("b2", "b1")} or \
        overtaking(bs, deps_of(bs)) == {}


ranks = st.sampled_from([N, H, X])
states = st.sampled_from([BatchState.CREATED, SPEC, MERGING])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ranks, states, st.sets(st.integers(0, 30))), min_size=1,
                max_size=9), st.randoms(use_true_random=False))
def test_arrivals_with_priorities_never_make_a_cycle_and_keep_every_conflict_ordered(
    arrivals: list[tuple[Priority, BatchState, set[int]]], rnd: object,
) -> None:
    """Batches arrive one by one (dependency analysis: ``place``); between arrivals a
    speculate run applies the overtakes (``overtaking``) and some batches start merging.
    The graph stays acyclic, and every conflicting pair ends up ordered by a direct
    edge."""
    batches: dict[str, Batch] = {}
    conflicts: dict[str, set[int]] = {}
    for i, (prio, state, seeds) in enumerate(arrivals, start=1):
        bid = f"b{i}"
        mine = {s % 7 for s in seeds} or {0}
        conflicting = [x for x in batches.values() if conflicts[x.id] & mine]
        deps, overtakes = place(b(bid, prio=prio), conflicting, deps_of(batches))
        assert set(deps) | set(overtakes) == {x.id for x in conflicting}
        batches[bid] = b(bid, deps, prio=prio, overtakes=overtakes, t=i)
        conflicts[bid] = mine
        grown = overtaking(batches, deps_of(batches))
        batches = {k: replace(v, dependencies=grown.get(k, v.dependencies))
                   for k, v in batches.items()}
        assert not cyclic(deps_of(batches))
        assert overtaking(batches, deps_of(batches)) == {}
        # the arrival's state is what it moves to before the next one arrives
        batches[bid] = replace(batches[bid], state=state)
    for x in batches.values():
        for y in batches.values():
            if x.id < y.id and conflicts[x.id] & conflicts[y.id]:
                assert y.id in x.dependencies or x.id in y.dependencies, (x, y)


# --- the planner: rebuilds on top of the hotfix, budget preference -----------------------

def entry(head: str, deps: Sequence[tuple[str, Assumption]], status: PathStatus) -> PathEntry:
    return PathEntry(path=SpeculationPath(head=head, dependencies=tuple(deps)), status=status,
                     attempt=1)


def test_the_planner_rebuilds_an_overtaken_batch_on_top_of_the_hotfix() -> None:
    normal = b("b1")
    hotfix = b("b2", prio=X, overtakes=["b1"])
    passed = entry("b1", [], PathStatus.PASSED)  # built on trunk alone: no hotfix in it
    out = plan(PlanInput(batches={"b1": normal, "b2": hotfix},
                         entries={"b1": [passed]}, probs={}, budget=4))
    assert out.dependencies == {"b1": ("b2",)}
    assert not out.decisions  # the passed path without the hotfix lands nothing
    built = [(p.head, p.dependencies) for p in out.builds]
    assert built[0] == ("b2", ())  # the hotfix, on trunk
    # the normal one, first on top of the hotfix (its only valid paths name it)
    assert built[1] == ("b1", (("b2", Assumption.SUCCEEDS),))
    assert all(p.names == ("b2",) for p in out.builds if p.head == "b1")


def test_a_short_budget_funds_the_hotfix_first() -> None:
    normals = [b(f"b{i}") for i in range(1, 4)]
    hotfix = b("b4", prio=X)
    batches = {x.id: x for x in [*normals, hotfix]}
    out = plan(PlanInput(batches=batches, entries={}, probs={}, budget=1))
    assert [p.head for p in out.builds] == ["b4"]
    # all normal: the oldest, as before
    out = plan(PlanInput(batches={**batches, "b4": replace(hotfix, priority=N)}, entries={},
                         probs={}, budget=1))
    assert [p.head for p in out.builds] == ["b1"]


def test_the_preempting_allocator_makes_room_for_a_hotfix() -> None:
    normals = {"b1": b("b1"), "b2": b("b2", ["b1"])}
    running = {"b1": [entry("b1", [], PathStatus.BUILDING)],
               "b2": [entry("b2", [("b1", Assumption.SUCCEEDS)], PathStatus.BUILDING)]}
    given = PlanInput(batches=normals, entries=running, probs={"b1": 0.9}, budget=2,
                      allocator="preempting")
    assert plan(given).cancels == ()  # both funded paths keep their slots
    hotfix = b("b3", prio=X)
    out = plan(replace(given, batches={**normals, "b3": hotfix}))
    # the weaker normal path is stopped; the hotfix is funded when its slot frees
    assert out.cancels == (running["b2"][0].id,)
