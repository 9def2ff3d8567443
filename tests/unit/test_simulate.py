"""The speculation simulator on a tiny grid, and its trunk-state check."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench import simulate
from bench._sim_record import Recorder
from bench._sim_workload import Point, Workload, draw

KEYS = {"point", "default", "strategy", "p50", "p95", "p99", "p50_vs_oracle", "p95_vs_oracle",
        "throughput", "builds_per_landed", "aborted_builds", "red_landings", "landed", "mean",
        "mean_vs_oracle", "good_evicted", "bad_landed"}
# may build less than once per change
BATCHING = {"batch-bisect", "bors", "mergify", "default+batch", "default+batch-aimd",
            "default+batch-lanes", "default+batch-skip-last"}


def test_tiny_grid_lands_the_good_changes_and_never_a_red_combination() -> None:
    points = [replace(simulate.DEFAULT, n=40),
              replace(simulate.DEFAULT, n=40, budget=4, p_conflict=0.5, seed=3)]
    rows, problems, _ = simulate.simulate(points, list(simulate.STRATEGIES), jobs=1)
    assert problems == []
    for point, point_rows in zip(points, rows, strict=True):
        good = len(draw(point).good)
        assert 0 < good < point.n  # some changes are bad, so isolation is exercised
        assert {r["strategy"] for r in point_rows} == set(simulate.STRATEGIES)
        for r in point_rows:
            assert r["red_landings"] == 0 and r["landed"] == good
            assert r["p50"] <= r["p95"] <= r["p99"]
            assert r["builds_per_landed"] >= 1.0 or r["strategy"] in BATCHING
            assert r["good_evicted"] == 0 and r["bad_landed"] == 0
        oracle = next(r for r in point_rows if r["strategy"] == "oracle")
        assert oracle["p50_vs_oracle"] == 1.0 and oracle["aborted_builds"] == 0
        serial = next(r for r in point_rows if r["strategy"] == "serial")
        assert serial["p95"] >= oracle["p95"]


def test_json_lines_have_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    rc = simulate.main(["--json", "--grid", "default", "--n", "30", "--jobs", "1",
                        "--strategies", "serial,best-first"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["strategy"] for r in lines] == ["oracle", "serial", "best-first"]
    for r in lines:
        assert set(r) == KEYS
        assert set(r["point"]) == {"load", "budget", "p_fail", "p_conflict", "seed", "p_flake",
                                   "batch"}
        assert r["default"] is True and r["point"]["p_fail"] == pytest.approx(0.1)
        assert r["point"]["p_flake"] == 0.0 and r["point"]["batch"] == 4


def test_the_workload_is_the_same_for_every_strategy() -> None:
    a, b = draw(Point(n=50, seed=7)), draw(Point(n=50, seed=7))
    assert (a.arrival, a.bad, a.conflicts) == (b.arrival, b.bad, b.conflicts)
    assert a.duration(3, 2) == b.duration(3, 2)
    assert draw(Point(n=50, seed=8)).arrival != a.arrival


def _two_conflicting() -> Workload:
    w = draw(Point(n=3, seed=1))
    w.bad = [False, False, False]
    w.conflicts = [frozenset(), frozenset({0}), frozenset()]
    return w


def test_the_trunk_check_flags_a_landing_whose_exact_trunk_was_never_built() -> None:
    w = _two_conflicting()
    rec = Recorder(w)
    b0 = rec.build(0, frozenset({0}), now=0)
    stale = rec.build(1, frozenset({1}), now=0)  # built without 0, which it conflicts with
    unrelated = rec.build(2, frozenset({2}), now=0)
    rec.land([0], b0, now=10)
    rec.land([2], unrelated, now=11)  # 2 does not conflict with 0: its build is still exact
    assert rec.red == 0
    rec.land([1], stale, now=12)
    assert rec.red == 1
    with pytest.raises(RuntimeError):
        rec.reject(1)  # a change reaches one terminal state only


def test_the_trunk_check_flags_a_failed_build_and_accepts_an_exact_one() -> None:
    w = _two_conflicting()
    w.bad[2] = True
    rec = Recorder(w)
    bad = rec.build(2, frozenset({2}), now=0)
    assert not bad.passed
    rec.land([2], bad, now=5)
    assert rec.red == 1
    exact = rec.build(1, frozenset({0, 1}), now=6)  # on top of 0, which lands first
    rec.land([0, 1], exact, now=9)  # one push (a bors batch): 0's tree has 1 in it too
    assert rec.red == 1


def test_a_strategy_that_lands_a_different_set_or_a_red_combination_is_reported() -> None:
    point = Point(n=20)
    good = sorted(draw(point).good)
    fine = {"landed_set": good, "landed": len(good), "red_landings": 0}
    assert simulate.check_point(point, {"a": fine}) == []
    short = {**fine, "landed_set": good[1:], "landed": len(good) - 1}
    red = {**fine, "red_landings": 2}
    problems = simulate.check_point(point, {"a": fine, "b": short, "c": red})
    assert len(problems) == 2
    assert problems[0].startswith("b: landed") and problems[1].startswith("c: 2 red")
    assert "(1 good evicted, 0 bad landed)" in problems[0]
    wider = Point(n=60)
    good = sorted(draw(wider).good)
    bad = next(i for i in range(wider.n) if i not in good)
    swapped = {**fine, "landed_set": sorted([*good[1:], bad]), "landed": len(good)}
    [problem] = simulate.check_point(wider, {"d": swapped})
    assert "(1 good evicted, 1 bad landed)" in problem


def test_vindication_keeps_flaky_changes_a_plain_queue_evicts_and_lands_nothing_red() -> None:
    """The same flaky workload (seed 1 of the flaky point): ``default`` evicts good
    changes whose own build flaked; ``default+vindicate`` keeps most of them, because a
    dependent's passed build that contained them cleared the failure and the rebuild
    passed; neither lands a bad change or a red combination."""
    point = replace(simulate.DEFAULT, p_flake=0.05)
    rows, problems, _ = simulate.simulate([point], ["default", "default+vindicate"], jobs=1)
    by = {r["strategy"]: r for r in rows[0]}
    plain, vindicated = by["default"], by["default+vindicate"]
    assert plain["good_evicted"] >= 5  # the flakes are there to be cleared
    assert vindicated["good_evicted"] * 3 <= plain["good_evicted"]
    for r in (plain, vindicated):
        assert r["red_landings"] == 0 and r["bad_landed"] == 0
    assert len(problems) == 2 and all("0 bad landed" in p for p in problems)  # evictions only
