"""The generator builds a path only when it is asked for: allocators tell candidates
apart by key, so a deep queue's plan costs the paths it funds, not every head's path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation import generator as gen_mod
from app.speculation.allocator import allocate
from app.speculation.core import Resolution
from app.speculation.generator import Generator
from app.speculation.planner import PlanInput, plan

S, F = Assumption.SUCCEEDS, Assumption.FAILS
RES = st.sampled_from([Resolution.SUCCEEDED, Resolution.FAILED, Resolution.UNRESOLVED])


def chain(n: int, merging: int = 2) -> dict[str, Batch]:
    """``n`` batches over one folder: each depends on every batch ahead of it."""
    ids = [f"q/batch/{i}" for i in range(n)]
    return {b: Batch(queue="q", id=b, contains=(f"q/{i}",), dependencies=tuple(ids[:i]),
                     state=BatchState.MERGING if i < merging else BatchState.SPECULATING,
                     version=1, created_at_ms=i) for i, b in enumerate(ids)}


def likely(b: Batch) -> SpeculationPath:
    return SpeculationPath(head=b.id, dependencies=tuple((d, S) for d in b.dependencies))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(0, 6), twice=st.booleans())
def test_a_candidates_key_is_the_key_of_its_path_and_keys_tell_paths_apart(
        data: st.DataObject, n: int, twice: bool) -> None:
    deps = [f"d{i}" for i in range(n)] + (["d0"] if twice and n else [])
    res = {d: data.draw(RES) for d in deps}
    probs = {d: data.draw(st.sampled_from([0.05, 0.3, 0.5, 0.7, 0.95])) for d in deps}
    g = Generator([Batch(queue="q", id="h", contains=("h",), dependencies=tuple(deps),
                         state=BatchState.SPECULATING, version=1)], res, probs)
    cands = list(g)
    assert all(g.key_of(c.path) == c.key for c in cands)
    assert len({c.key for c in cands}) == len({c.path.id for c in cands}) == len(cands)
    other = SpeculationPath(head="h", dependencies=tuple((d, S) for d in deps[:-1]))
    assert g.key_of(other) is None or not deps  # another dependency list: no candidate


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Heads whose paths the generator built."""
    heads: list[str] = []
    original = gen_mod._HeadPlan.path

    def counting(self: gen_mod._HeadPlan, flips: tuple[int, ...]) -> SpeculationPath:
        heads.append(self.head.id)
        return original(self, flips)

    monkeypatch.setattr(gen_mod._HeadPlan, "path", counting)
    yield heads


@pytest.mark.parametrize("allocator", ["sticky", "preempting"])
def test_a_deep_queue_plan_builds_the_paths_it_funds_not_every_heads(
        built: list[str], allocator: str) -> None:
    """300 speculating batches over one folder, the first 100 with a passed path that
    waits, 3 building, one slot free: the plan funds one path and builds a handful, not
    the 300 paths (each as long as the queue) it built before."""
    batches = chain(302)
    heads = [b for b in batches.values() if b.state is BatchState.SPECULATING]
    entries = {b.id: [PathEntry(path=likely(b), status=PathStatus.PASSED)] for b in heads[:100]}
    entries |= {b.id: [PathEntry(path=likely(b), status=PathStatus.BUILDING)]
                for b in heads[100:103]}
    inp = PlanInput(batches=batches, entries=entries, probs=dict.fromkeys(batches, 0.95),
                    budget=4, allocator=allocator,  # type: ignore[arg-type]
                    min_probability=0.1, now_ms=1)
    out = plan(inp)
    assert [p.head for p in out.builds] == [heads[103].id]
    assert len(built) <= 5, f"built {len(built)} paths"


def test_the_allocators_fund_the_same_paths_by_key_as_by_id() -> None:
    """A stored path of an older dependency list is no candidate's: its head's current
    most likely path is funded again, as a new path."""
    batches = chain(6)
    b = batches["q/batch/4"]
    old = SpeculationPath(head=b.id, dependencies=tuple((d, S) for d in b.dependencies[:-1]))
    entries = {b.id: [PathEntry(path=old, status=PathStatus.PASSED)]}
    g = Generator([b], {}, {})
    for kind in ("sticky", "preempting"):
        got = allocate(kind, g, entries, budget=1)  # type: ignore[arg-type]
        assert [p.path.id for p in got] == [likely(b).id]
