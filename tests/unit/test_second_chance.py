"""The second-chance rules (app/domain/second_chance.py)."""

from __future__ import annotations

from app.domain import second_chance as sc


def _not_exploring(n: int) -> list[str]:
    return [b for i in range(200) if not sc.explores(b := f"q/batch/{i}")][:n]


def test_the_gate_starts_open_and_shuts_after_five_failed_second_chances() -> None:
    assert sc.gate_open([])
    assert sc.gate_open([False] * 4)  # 1/6 > 0.15
    assert not sc.gate_open([False] * 5)  # 1/7 < 0.15


def test_a_passed_second_chance_keeps_the_gate_open() -> None:
    assert sc.gate_open([False] * 9 + [True])  # 2/12
    assert not sc.gate_open([False] * 12 + [True])  # 2/15 < 0.15


def test_only_the_last_window_counts() -> None:
    assert not sc.gate_open([True] * 10 + [False] * sc.WINDOW)
    assert sc.gate_open([False] * 100 + [True] * 10)  # 11/52 of the last 50


def test_one_batch_in_ten_explores_and_it_is_stable() -> None:
    ids = [f"q/batch/{i}" for i in range(1000)]
    share = sum(map(sc.explores, ids)) / len(ids)
    assert 0.06 < share < 0.14
    assert [sc.explores(b) for b in ids] == [sc.explores(b) for b in ids]


def test_deserved_follows_the_table() -> None:
    shut = [False] * 10
    b = _not_exploring(1)[0]
    assert sc.deserved(members=1, chance=0, build_failed=True, outcomes=[], batch_id=b)
    assert not sc.deserved(members=2, chance=0, build_failed=True, outcomes=[], batch_id=b)
    assert not sc.deserved(members=1, chance=1, build_failed=True, outcomes=[], batch_id=b)
    assert not sc.deserved(members=1, chance=0, build_failed=False, outcomes=[], batch_id=b)
    assert not sc.deserved(members=1, chance=0, build_failed=True, outcomes=shut, batch_id=b)
    explorer = next(f"q/batch/{i}" for i in range(200) if sc.explores(f"q/batch/{i}"))
    assert sc.deserved(members=1, chance=0, build_failed=True, outcomes=shut,
                       batch_id=explorer)
