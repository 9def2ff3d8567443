"""The batch size rule and the bisection split (app/domain/batching.py), and the
simulator's batching strategy that applies them (bench/_sim_speculate.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from app.domain import batching
from bench import simulate
from bench._sim_speculate import SpecConfig, _Sim
from bench._sim_workload import draw


def test_a_fixed_window_ignores_the_outcomes() -> None:
    assert batching.window(4, adaptive=False, recent=[False] * 5) == 4


def test_the_adaptive_window_halves_per_failure_and_grows_by_one_per_landing() -> None:
    assert batching.window(8, adaptive=True, recent=[]) == 8
    assert batching.window(8, adaptive=True, recent=[False]) == 4
    assert batching.window(8, adaptive=True, recent=[False, False, False, False]) == 1
    assert batching.window(8, adaptive=True, recent=[False, False, True, True]) == 4
    assert batching.window(8, adaptive=True, recent=[True] * 3) == 8  # capped


@given(st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=12))
def test_split_keeps_every_member_in_order_in_at_least_two_parts(n: int, ways: int) -> None:
    members = [f"q/{i}" for i in range(n)]
    parts = batching.split(members, ways=ways)
    assert [m for p in parts for m in p] == members
    assert all(parts) and len(parts) == min(max(2, ways), n)
    sizes = [len(p) for p in parts]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    if n > 1:  # every split halves a part at least: bisection ends
        assert max(sizes) <= (n + 1) // 2


def test_a_part_names_the_batch_it_was_split_from() -> None:
    cause = batching.split_cause("q/batch/17")
    assert batching.parent_of("q", cause) == "q/batch/17"
    assert batching.parent_of("q", "validated@v2") is None


def test_the_simulated_queue_batches_and_bisects_and_lands_only_good_changes() -> None:
    point = replace(simulate.DEFAULT, n=80, load=16.0, budget=4)
    w = draw(point)
    sim = _Sim(w, SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                             batching=True))
    m = sim.run().metrics()
    sizes = [len(ms) for ms in sim.members.values()]
    assert max(sizes) == point.batch  # batches fill up under this load
    failed = [h for h, b in sim.batches.items()
              if b.state.value == "failed" and len(sim.members[h]) > 1]
    assert failed  # some batch of several failed and was bisected into parts after it
    for h in failed:
        parts = [p for p, ms in sim.members.items()
                 if p > h and len(ms) < len(sim.members[h]) and set(ms) <= set(sim.members[h])]
        first_split = parts[:2]  # budget 4: two ways; later parts are splits of those
        assert sorted(c for p in first_split for c in sim.members[p]) == sorted(
            sim.members[h])
    assert m["red_landings"] == 0 and m["landed"] == len(w.good)
    assert m["bad_landed"] == 0 and m["good_evicted"] == 0
