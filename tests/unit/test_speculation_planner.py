"""The pure planner: best-first generator, allocators, scorers."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, ChangeDetails, ChangedFile, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation.allocator import Proposal, allocate, preempting, sticky
from app.speculation.core import Resolution
from app.speculation.generator import DEFAULT_PROBABILITY, Generator, probabilities, sanitize
from app.speculation.scorers import (
    CombinedScorer,
    HistoryScorer,
    SizeScorer,
    lines_changed,
    top_level,
)

S, F = Assumption.SUCCEEDS, Assumption.FAILS
R_OK, R_FAIL, R_OPEN = Resolution.SUCCEEDED, Resolution.FAILED, Resolution.UNRESOLVED


def batch(hid: str, deps: Sequence[str]) -> Batch:
    return Batch(queue="q", id=hid, contains=(hid,), dependencies=tuple(deps),
                 state=BatchState.SPECULATING, version=1)


def path(hid: str, deps: Sequence[str], assumptions: Sequence[Assumption]) -> SpeculationPath:
    return SpeculationPath(head=hid, dependencies=tuple(zip(deps, assumptions, strict=True)))


def exact_score(p: SpeculationPath, probs: dict[str, float]) -> float:
    return math.fsum(math.log(probs[d] if a is S else 1 - probs[d]) for d, a in p.dependencies
                     if d in probs)


# --- generator -------------------------------------------------------------------------

probs_st = st.lists(st.floats(min_value=0.01, max_value=0.99), min_size=0, max_size=6)
# few distinct values: many exact ties, which exercise the tie-breaks
tied_st = st.lists(st.sampled_from([0.5, 0.9, 0.1, 0.7]), min_size=0, max_size=5)


@settings(max_examples=150, deadline=None)
@given(heads_probs=st.lists(probs_st | tied_st, min_size=1, max_size=3))
def test_generator_is_best_first_and_exhaustive_against_brute_force(
        heads_probs: list[list[float]]) -> None:
    heads: list[Batch] = []
    probs: dict[str, float] = {}
    for k, ps in enumerate(heads_probs):
        deps = [f"d{k}_{i}" for i in range(len(ps))]
        probs.update(zip(deps, ps, strict=True))
        heads.append(batch(f"h{k}", deps))
    got = list(Generator(heads, {}, probs))
    # non-increasing score, no repeats
    scores = [c.score for c in got]
    assert all(a >= b for a, b in itertools.pairwise(scores))
    assert len({c.path.id for c in got}) == len(got)
    # the full order: score, then fewer flips, then head order, then flip indexes
    keys = [(-c.score, len(c.flips), c.head_index, c.flips) for c in got]
    assert all(a < b for a, b in itertools.pairwise(keys))
    # exhaustive: exactly every assumption combination of every head
    brute: dict[str, float] = {}
    for h in heads:
        for combo in itertools.product((S, F), repeat=len(h.dependencies)):
            p = path(h.id, h.dependencies, combo)
            brute[p.id] = exact_score(p, probs)
    assert {c.path.id for c in got} == set(brute)
    for c in got:
        assert math.isclose(c.score, brute[c.path.id], abs_tol=1e-9)
        assert math.isclose(c.probability, math.exp(brute[c.path.id]), rel_tol=1e-9)


def test_first_path_prefers_the_more_likely_side_and_ties_go_to_succeeds() -> None:
    h = batch("h", ["a", "b", "c"])
    first = next(iter(Generator([h], {}, {"a": 0.9, "b": 0.2, "c": 0.5})))
    assert first.path.dependencies == (("a", S), ("b", F), ("c", S))
    assert first.flips == ()


def test_ties_fewer_flips_then_head_order_then_flip_indexes() -> None:
    h1, h2 = batch("h1", ["a", "b"]), batch("h2", ["c"])
    got = list(Generator([h1, h2], {}, {"a": 0.5, "b": 0.5, "c": 0.5}))
    # all flips cost 0, so every h1 path scores ln(.25) and every h2 path ln(.5)
    assert [(c.path.head, c.flips) for c in got] == [
        ("h2", ()), ("h2", (0,)),
        ("h1", ()), ("h1", (0,)), ("h1", (1,)), ("h1", (0, 1)),
    ]
    # Equal scores across heads: fewer flips first, then head order.
    h3 = batch("h3", ["e"])
    got = list(Generator([h2, h3], {}, {"c": 0.5, "e": 0.5}))
    assert [(c.path.head, c.flips) for c in got] == [
        ("h2", ()), ("h3", ()), ("h2", (0,)), ("h3", (0,))]


def test_resolved_dependencies_are_fixed() -> None:
    h = batch("h", ["ok", "bad", "open"])
    res = {"ok": R_OK, "bad": R_FAIL, "open": R_OPEN}
    got = list(Generator([h], res, {"ok": 0.01, "bad": 0.99, "open": 0.7}))
    assert len(got) == 2
    for c in got:
        assert c.path.dependencies[:2] == (("ok", S), ("bad", F))
    assert [c.path.dependencies[2][1] for c in got] == [S, F]
    assert math.isclose(got[0].score, math.log(0.7))


def test_head_with_no_unresolved_dependency_yields_one_path() -> None:
    got = list(Generator([batch("h", [])], {}, {}))
    assert [c.path for c in got] == [SpeculationPath("h", ())]
    assert got[0].score == 0.0


@pytest.mark.parametrize("bad", [float("nan"), 0.0, 1.0, -0.3, 1.5, float("inf"), True, "x"])
def test_invalid_probability_becomes_default(bad: object) -> None:
    assert sanitize(bad) == DEFAULT_PROBABILITY
    h = batch("h", ["a"])
    first = next(iter(Generator([h], {}, {"a": bad})))  # type: ignore[dict-item]
    assert math.isclose(first.score, math.log(DEFAULT_PROBABILITY))
    missing = next(iter(Generator([h], {}, {})))
    assert math.isclose(missing.score, math.log(DEFAULT_PROBABILITY))


def test_probabilities_helper_scores_once_and_survives_errors() -> None:
    calls: list[str] = []

    def score(dep: str) -> float:
        calls.append(dep)
        if dep == "boom":
            raise RuntimeError("scorer down")
        return 0.3

    assert probabilities(["a", "boom", "a"], score) == {"a": 0.3, "boom": DEFAULT_PROBABILITY}
    assert calls == ["a", "boom"]


def test_generator_is_lazy() -> None:
    deps = [f"d{i}" for i in range(25)]
    probs = {d: 0.6 + 0.01 * i for i, d in enumerate(deps)}
    start = time.perf_counter()
    it = iter(Generator([batch("h", deps)], {}, probs))
    first = [next(it) for _ in range(5)]
    assert time.perf_counter() - start < 0.5
    assert [c.flips for c in first] == [(), (0,), (1,), (2,), (3,)]
    # 1000 paths of a 2^25 space are still quick
    start = time.perf_counter()
    more = list(itertools.islice(it, 1000))
    assert time.perf_counter() - start < 1.0
    assert all(a.score >= b.score for a, b in itertools.pairwise(first + more))


def test_generator_is_deterministic() -> None:
    heads = [batch("h1", ["a", "b", "c"]), batch("h2", ["a", "c"])]
    probs = {"a": 0.8, "b": 0.5, "c": 0.5}
    g = Generator(heads, {}, probs)
    one = [(c.path.id, c.score) for c in g]
    two = [(c.path.id, c.score) for c in Generator(heads, {}, dict(reversed(probs.items())))]
    assert one == two == [(c.path.id, c.score) for c in g]


def test_score_of_a_stored_path() -> None:
    h = batch("h", ["a", "b"])
    g = Generator([h], {"a": R_OK}, {"b": 0.25})
    assert math.isclose(g.score(path("h", ["a", "b"], [S, F])), math.log(0.75))
    assert g.score(path("h", ["a", "b"], [F, F])) == -math.inf  # contradicted
    assert g.score(path("h", ["b"], [F])) == -math.inf  # malformed
    assert g.score(path("x", ["a"], [S])) == -math.inf  # unknown head


# --- allocators ------------------------------------------------------------------------


def entry(p: SpeculationPath, status: PathStatus) -> PathEntry:
    return PathEntry(path=p, status=status)


def builds(props: list[Proposal]) -> list[SpeculationPath]:
    return [p.path for p in props if p.action == "build"]


def cancels(props: list[Proposal]) -> list[SpeculationPath]:
    return [p.path for p in props if p.action == "cancel"]


def test_sticky_fills_free_slots_best_first_and_skips_stored_paths() -> None:
    h = batch("h", ["a", "b"])
    g = Generator([h], {}, {"a": 0.9, "b": 0.8})
    ss, sf, fs = path("h", "ab", [S, S]), path("h", "ab", [S, F]), path("h", "ab", [F, S])
    assert builds(sticky(g, {}, 2)) == [ss, sf]
    # a failed (terminal) path is never rebuilt, a live one keeps its slot
    props = sticky(g, {"h": [entry(ss, PathStatus.FAILED), entry(sf, PathStatus.BUILDING)]}, 2)
    assert props == [Proposal("build", fs)]


def test_sticky_respects_budget_counting_every_live_status_and_never_preempts() -> None:
    h = batch("h", ["a", "b"])
    other = batch("o", ["z"])
    g = Generator([h], {}, {"a": 0.9, "b": 0.9})
    weak = path("h", "ab", [F, F])
    zp = path("o", ["z"], [S])
    stored = {"h": [entry(weak, PathStatus.PENDING)],
              "o": [entry(zp, PathStatus.CANCELLING)]}
    assert sticky(g, stored, 2) == []
    props = sticky(g, stored, 3)
    assert props == [Proposal("build", path("h", "ab", [S, S]))]
    assert all(p.action == "build" for p in sticky(g, stored, 10))
    assert len(sticky(g, stored, 10)) == 3  # the 4th path is stored
    assert sticky(g, {"o": [entry(zp, PathStatus.BUILDING)]}, 0) == []
    del other


@settings(max_examples=100, deadline=None)
@given(ps=st.lists(st.floats(min_value=0.05, max_value=0.95), min_size=1, max_size=4),
       budget=st.integers(min_value=0, max_value=6),
       statuses=st.lists(st.sampled_from(list(PathStatus)), max_size=16))
def test_allocators_never_exceed_the_budget(ps: list[float], budget: int,
                                            statuses: list[PathStatus]) -> None:
    deps = [f"d{i}" for i in range(len(ps))]
    g = Generator([batch("h", deps)], {}, dict(zip(deps, ps, strict=True)))
    all_paths = [c.path for c in g]
    stored = {"h": [entry(p, s) for p, s in zip(all_paths, statuses, strict=False)]}
    live = sum(1 for e in stored["h"] if e.status.live)
    for props in (sticky(g, stored, budget), preempting(g, stored, budget)):
        n_builds = len(builds(props))
        assert live + n_builds <= max(budget, live)
        assert len({p.path.id for p in props}) == len(props)
        by_id = {e.id: e for e in stored["h"]}
        for prop in props:
            e = by_id.get(prop.path.id)
            if prop.action == "build":
                assert e is None  # a stored path (terminal or live) is never re-proposed
            else:
                assert e is not None and e.status in (PathStatus.PENDING, PathStatus.BUILDING)


def test_preempting_cancels_a_worse_live_path_when_a_better_one_appears() -> None:
    h1, h2 = batch("h1", ["a"]), batch("h2", ["b"])
    # h1's likely path was funded when it looked like the best use of the one slot
    weak = path("h1", ["a"], [S])
    stored = {"h1": [entry(weak, PathStatus.BUILDING)]}
    g = Generator([h1, h2], {}, {"a": 0.55, "b": 0.99})
    props = preempting(g, stored, 1)
    # cancel now; the better path is built once the slot is actually free
    assert props == [Proposal("cancel", weak)]
    stored = {"h1": [entry(weak, PathStatus.CANCELLING)]}
    assert preempting(g, stored, 1) == []
    stored = {"h1": [entry(weak, PathStatus.CANCELLED)]}
    assert preempting(g, stored, 1) == [Proposal("build", path("h2", ["b"], [S]))]
    # sticky would have kept the weak path
    assert sticky(g, {"h1": [entry(weak, PathStatus.BUILDING)]}, 1) == []
    live = {"h1": [entry(weak, PathStatus.BUILDING)]}
    assert allocate("sticky", g, live, 1) == []
    assert allocate("preempting", g, live, 1) == [Proposal("cancel", weak)]
    with pytest.raises(ValueError):
        allocate("greedy", g, live, 1)  # type: ignore[arg-type]


def test_preempting_keeps_funded_paths_and_never_cancels_a_passed_one() -> None:
    h1, h2 = batch("h1", ["a"]), batch("h2", ["b"])
    g = Generator([h1, h2], {}, {"a": 0.55, "b": 0.99})
    passed = path("h1", ["a"], [F])  # the weakest path of all, already passed
    good = path("h2", ["b"], [S])
    stored = {"h1": [entry(passed, PathStatus.PASSED)], "h2": [entry(good, PathStatus.BUILDING)]}
    props = preempting(g, stored, 2)
    assert cancels(props) == []
    assert builds(props) == [path("h1", ["a"], [S])]
    # a path tied with the weakest funded one keeps its slot (no churn)
    h3 = batch("h3", ["c"])
    g = Generator([h2, h3], {}, {"b": 0.9, "c": 0.9})
    kept = path("h3", ["c"], [S])
    assert preempting(g, {"h3": [entry(kept, PathStatus.PENDING)]}, 1) == []


def test_preempting_leaves_other_heads_and_cancels_unreachable_paths() -> None:
    h = batch("h", ["a"])
    g = Generator([h], {"a": R_OK}, {})
    merging = path("m", ["x"], [S])  # a head the planner does not plan (e.g. merging)
    broken = path("h", ["a"], [F])
    stored = {"m": [entry(merging, PathStatus.BUILDING)],
              "h": [entry(broken, PathStatus.BUILDING)]}
    props = preempting(g, stored, 3)
    assert cancels(props) == [broken]
    assert builds(props) == [path("h", ["a"], [S])]


# --- scorers ---------------------------------------------------------------------------


def change(author: str, *files: tuple[str, int, int]) -> ChangeDetails:
    return ChangeDetails(uri=f"u/{author}", author_email=author,
                         changed_files=tuple(ChangedFile(p, a, d) for p, a, d in files))


def test_size_scorer_buckets_over_total_lines_changed() -> None:
    s = SizeScorer([(0, 10, 0.99), (11, 100, 0.9), (101, 10_000, 0.6)])
    small = [change("x", ("a/b.py", 3, 2)), change("y", ("c.py", 4, 1))]
    assert lines_changed(small) == 10
    assert s.score("b", small) == 0.99
    assert s.score("b", [change("x", ("a", 50, 61))]) == 0.6
    with pytest.raises(ValueError):
        s.score("b", [change("x", ("a", 20_000, 0))])
    assert SizeScorer([], default=0.5).score("b", []) == 0.5
    with pytest.raises(ValueError):
        SizeScorer([(0, 1, 1.0)])
    with pytest.raises(ValueError):
        SizeScorer([(5, 1, 0.5)])


def test_history_scorer_smoothed_pass_rate_over_author_and_directories() -> None:
    h = HistoryScorer(prior_p=0.8, prior_weight=2.0)
    assert h.score("b", []) == 0.8
    assert h.score("b", [change("ann", ("src/x.py", 1, 0))]) == pytest.approx(0.8)
    for passed in (True, True, False):
        h.record("ann", ["src"], passed)
    h.record("bob", ["docs/guide"], False)
    ann = (2 + 1.6) / (3 + 2)
    src = ann
    readme_root = 0.8  # "." never recorded
    assert h.score("b", [change("ann", ("src/x.py", 1, 0))]) == pytest.approx((ann + src) / 2)
    got = h.score("b", [change("bob", ("docs/a.md", 1, 0), ("README", 1, 0))])
    bob = docs = 1.6 / 3
    assert got == pytest.approx((bob + docs + readme_root) / 3)
    assert top_level("README") == "." and top_level("a/b/c") == "a"


def test_history_scorer_forgets_beyond_its_window_and_learns_from_changes() -> None:
    h = HistoryScorer(prior_p=0.5, prior_weight=1.0, window=2)
    for passed in (False, False, True, True):
        h.record("ann", [], passed)
    assert h.rate("author:ann") == pytest.approx((2 + 0.5) / 3)
    h.record_changes([change("cat", ("lib/x", 1, 1))], passed=False)
    assert h.rate("dir:lib") == pytest.approx(0.5 / 2)
    assert h.rate("author:cat") == pytest.approx(0.5 / 2)


def test_combined_scorer_is_a_weighted_average() -> None:
    a = SizeScorer([], default=0.9)
    b = SizeScorer([], default=0.5)
    assert CombinedScorer([a, b]).score("x", []) == pytest.approx(0.7)
    assert CombinedScorer([a, b], [3, 1]).score("x", []) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        CombinedScorer([a, b], [1])
    with pytest.raises(ValueError):
        CombinedScorer([])
    with pytest.raises(ValueError):
        CombinedScorer([a], [0])
