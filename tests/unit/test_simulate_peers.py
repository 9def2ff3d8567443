"""The simulator's peers grid (issue 16): flaky builds, the peers' policies, the checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import simulate
from bench._sim_linear import github_allgreen, github_headgreen, trunk, zuul
from bench._sim_mergify import _cut, mergify
from bench._sim_peers import PEERS
from bench._sim_record import Recorder
from bench._sim_workload import Point, Workload, draw

PEER_NAMES = {"zuul", "bors", "mergify", "github-allgreen", "github-headgreen", "trunk"}


def test_the_peers_grid_never_lands_red_and_lands_exactly_the_good_changes_unless_flaky() -> None:
    points = [replace(p, n=60) for p in simulate.GRID["peers"]]
    assert [p.p_flake for p in points] == [0.0, 0.0, 0.05, 0.0]
    assert (points[1].load, points[1].budget, points[3].p_conflict) == (16.0, 4, 1.0)
    rows, problems, _ = simulate.simulate(points, list(simulate.STRATEGIES), jobs=1)
    assert PEER_NAMES | {"oracle", "serial", "default"} <= set(simulate.STRATEGIES)
    flaky_problems = []
    for point, point_rows in zip(points, rows, strict=True):
        good = len(draw(point).good)
        for r in point_rows:
            assert r["red_landings"] == 0 and r["bad_landed"] == 0, r
            assert r["landed"] + r["good_evicted"] == good, r
            if point.p_flake == 0.0:
                assert r["good_evicted"] == 0, r
            assert r["point"]["p_flake"] == point.p_flake and r["point"]["batch"] == 4
        if point.p_flake:
            by_name = {r["strategy"]: r for r in point_rows}
            assert by_name["oracle"]["good_evicted"] == 0  # it knows the flakes
            # flakes happened and cost someone a good change: the check has teeth
            assert by_name["serial"]["good_evicted"] > 0
            flaky_problems = [f"{n}: landed {r['landed']} changes, not the {good} good ones "
                              f"({r['good_evicted']} good evicted, 0 bad landed)"
                              for n, r in by_name.items() if r["good_evicted"]]
    # every problem is an eviction at the flaky point, and every eviction is a problem
    assert [p.split(", at ")[0] for p in problems] == flaky_problems


def test_a_flake_is_drawn_from_the_seed_the_change_set_and_the_attempt_only() -> None:
    w = draw(Point(n=20, p_flake=0.5, seed=4))
    same = draw(Point(n=20, p_flake=0.5, seed=4))
    sets = [frozenset({i, i + 1}) for i in range(10)]
    luck = [[w.flaky(s, k) for k in range(6)] for s in sets]
    assert luck == [[same.flaky(s, k) for k in range(6)] for s in sets]
    assert any(any(row) for row in luck) and not all(all(row) for row in luck)
    assert any(len(set(row)) == 2 for row in luck)  # a rebuild may pass
    assert not any(draw(Point(n=20, seed=4)).flaky(s, 0) for s in sets)  # p_flake 0


def test_the_recorder_counts_attempts_per_change_set_and_spares_the_oracle() -> None:
    w = draw(Point(n=20, p_flake=0.5, seed=4))
    good = frozenset(i for i in range(w.n) if not w.bad[i])
    members = frozenset(sorted(good)[:2])
    rec = Recorder(w)
    outcomes = [rec.build(min(members), members, now=0).passed for _ in range(8)]
    assert outcomes == [not w.flaky(members, k) for k in range(8)]
    assert all(rec.build(min(members), members, now=0, flaky=False).passed for _ in range(8))


class _Scripted(Workload):
    """A workload whose flakes are named: ``(members, attempt)`` pairs that fail."""

    flakes: set[tuple[frozenset[int], int]]

    def flaky(self, members: frozenset[int], k: int) -> bool:
        return (members, k) in self.flakes


def _line(n: int, flakes: set[tuple[frozenset[int], int]], budget: int = 4) -> Workload:
    w0 = draw(Point(n=n, budget=budget, p_flake=0.5, batch=4))
    w = _Scripted(w0.point, [i * 1000 for i in range(n)], [False] * n, [False] * n,
                  [False] * n, [frozenset()] * n)
    w.flakes = flakes
    return w


@pytest.mark.parametrize(("policy", "evicted"), [
    (zuul, 1), (github_allgreen, 1), (github_headgreen, 0), (trunk, 0)])
def test_a_later_passed_build_vouches_for_a_flaked_head_only_where_the_peer_allows(
        policy: object, evicted: int) -> None:
    # change 0's own build flakes; change 1's build (0 and 1) passes
    w = _line(3, {(frozenset({0}), 0)})
    rec = policy(w)  # type: ignore[operator]
    m = rec.metrics()
    assert m["red_landings"] == 0 and m["good_evicted"] == evicted
    assert (0 in rec.landed_at) == (evicted == 0)


def test_zuul_retests_a_change_whose_failure_came_from_a_bad_change_ahead() -> None:
    w = _line(3, set())
    w.bad[0] = True
    rec = zuul(w)
    assert rec.rejected == {0} and set(rec.landed_at) == {1, 2} and rec.red == 0


def test_mergify_splits_a_failed_batch_and_never_retests_its_last_part() -> None:
    assert _cut([1, 2, 3, 4, 5, 6], 4) == [[1, 2], [3, 4], [5], [6]]
    w = _line(4, set(), budget=3)
    w.arrival = [0, 0, 0, 0]
    w.bad[3] = True  # the last of one batch of 4
    rec = mergify(w)
    assert rec.rejected == {3} and set(rec.landed_at) == {0, 1, 2} and rec.red == 0
    # the batch, its rerun, then prefixes [0], [0, 1], [0, 1, 2]: 3 was never built alone
    assert rec.started == 5


def test_every_peer_is_registered_and_deterministic() -> None:
    assert set(PEERS) == PEER_NAMES
    point = Point(n=40, p_flake=0.1, seed=2)
    for name, run in PEERS.items():
        a, b = run(draw(point)).metrics(), run(draw(point)).metrics()
        assert a == b, name
        assert a["red_landings"] == 0 and a["bad_landed"] == 0, name


def test_several_seeds_print_one_summary_per_grid_point(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = simulate.main(["--grid", "default", "--n", "30", "--jobs", "1", "--seeds", "1-3",
                        "--strategies", "serial,default,trunk", "--p-flake", "0.2"])
    out, err = capsys.readouterr()
    table, footer = out.strip().split("\n\n")
    head, cols, *lines = table.splitlines()
    assert footer.startswith("3 grid points x 4 strategies")
    assert "p_flake 0.2" in head and "seeds 1-3" in head
    assert cols.split()[:2] == ["strategy", "P95/or"]
    by = {line.split()[0]: line.split() for line in lines}
    assert set(by) == {"oracle", "serial", "default", "trunk"}
    assert by["oracle"][1:4] == ["1.00x", "1.00x", "1.00x"]
    evicted = {name: int(row[6]) for name, row in by.items()}
    assert evicted["oracle"] == 0 and evicted["serial"] > 0  # p_flake 0.2 evicts someone
    assert rc == 1 and "PROBLEM: serial: landed" in err and "good evicted" in err
    assert "PROBLEM: oracle" not in err
    assert simulate._seeds("1-3,7") == [1, 2, 3, 7]
