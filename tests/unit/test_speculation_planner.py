"""The pure planner: best-first generator, allocators, scorers."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, ChangeDetails, ChangedFile, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation import core, doom
from app.speculation.allocator import Proposal, allocate, preempting, sticky
from app.speculation.core import NO_PATH_PASSED, Resolution
from app.speculation.generator import DEFAULT_PROBABILITY, Generator, probabilities, sanitize
from app.speculation.invariants import check
from app.speculation.planner import (
    CoveragePolicy,
    Decision,
    Plan,
    PlanInput,
    PlanInvariantError,
    plan,
)
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
                # a stored path is never re-proposed, except a cancelled one (as its next
                # attempt: it may be the very path that must land)
                assert e is None or e.status is PathStatus.CANCELLED
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


# --- plan(): finalize, fund, invariants ------------------------------------------------

MEAN = 1000.0


def qb(hid: str, deps: Sequence[str] = (), state: BatchState = BatchState.SPECULATING,
       t: int = 0) -> Batch:
    return Batch(queue="q", id=hid, contains=(hid,), dependencies=tuple(deps), state=state,
                 version=1, created_at_ms=t)


def pe(hid: str, deps: Sequence[str], assumptions: Sequence[Assumption], status: PathStatus,
       *, t: int = 0, attempt: int = 1) -> PathEntry:
    return PathEntry(path=path(hid, deps, assumptions), status=status, attempt=attempt,
                     created_at_ms=t, updated_at_ms=t)


def run(batches: Sequence[Batch], entries: dict[str, list[PathEntry]] | None = None, *,
        budget: int = 8, now: int = 0, **kw: object) -> Plan:
    kw.setdefault("min_probability", 0.1)  # hedges only when likely enough: exact plans
    inp = PlanInput(batches={b.id: b for b in batches}, entries=entries or {}, probs={},
                    budget=budget, now_ms=now, mean_build_ms=MEAN, **kw)  # type: ignore[arg-type]
    return plan(inp)


def status_of(p: Plan, head: str, pid: str) -> PathStatus:
    return next(e.status for e in p.entries[head] if e.id == pid)


def test_plan_is_deterministic_and_funds_paths_by_their_stable_ids() -> None:
    batches = [qb("a"), qb("b", ["a"], t=1)]
    one, two = run(batches, now=7), run(batches, now=7)
    assert one == two
    assert [p.id for p in one.builds] == [
        SpeculationPath("a", ()).id, path("b", ["a"], [S]).id]
    for p in one.builds:
        (e,) = one.entries[p.head]
        assert (e.id, e.status, e.attempt, e.created_at_ms) == (p.id, PathStatus.PENDING, 1, 7)
    assert one.decisions == () and one.cancels == () and one.rebuilds == 0


def test_refutation_after_success_and_after_failure() -> None:
    ok, bad = qb("ok", state=BatchState.SUCCEEDED), qb("bad", state=BatchState.FAILED)
    h = qb("h", ["ok", "bad"], t=2)
    wrong_ok = pe("h", ["ok", "bad"], [F, F], PathStatus.BUILDING)
    wrong_bad = pe("h", ["ok", "bad"], [S, S], PathStatus.PENDING)
    right = pe("h", ["ok", "bad"], [S, F], PathStatus.BUILDING)
    p = run([ok, bad, h], {"h": [wrong_ok, wrong_bad, right]})
    assert set(p.cancels) == {wrong_ok.id, wrong_bad.id}
    assert status_of(p, "h", wrong_ok.id) is PathStatus.CANCELLING  # its build must stop
    assert status_of(p, "h", wrong_bad.id) is PathStatus.CANCELLED  # never dispatched
    assert status_of(p, "h", right.id) is PathStatus.BUILDING
    assert p.builds == () and p.decisions == ()


def test_merge_on_a_settled_passed_path_frees_the_siblings_slots() -> None:
    d = qb("d", state=BatchState.SUCCEEDED)
    h = qb("h", ["d"], t=1)
    other = qb("o", t=2)
    good = pe("h", ["d"], [S], PathStatus.PASSED)
    hedge = pe("h", ["d"], [F], PathStatus.BUILDING)
    p = run([d, h, other], {"h": [good, hedge]}, budget=1)
    assert p.decisions == (Decision("h", "merge", path_id=good.id),)
    assert status_of(p, "h", good.id) is PathStatus.PASSED  # the merged path stays passed
    assert p.cancels == (hedge.id,)
    # the hedge is still cancelling (its build holds the slot): nothing funded yet
    assert p.builds == ()
    stopped = [good, replace(hedge, status=PathStatus.CANCELLED)]
    p = run([d, h, other], {"h": stopped}, budget=1)
    assert [b.head for b in p.builds] == ["o"]


@pytest.mark.parametrize("coverage", [None, CoveragePolicy(min_remaining=0.0)])
def test_no_merge_on_one_passed_path_that_bet_on_a_live_dependency(
        coverage: CoveragePolicy | None) -> None:
    d = qb("d")
    h = qb("h", ["d"], t=1)
    live = pe("d", [], [], PathStatus.BUILDING)
    for bet in (F, S):
        passed = pe("h", ["d"], [bet], PathStatus.PASSED)
        p = run([d, h], {"d": [live], "h": [passed]}, coverage=coverage)
        assert p.decisions == ()
        assert passed.id not in p.cancels and "h" not in p.dependencies


def test_a_passed_path_of_a_waiting_head_is_never_cancelled() -> None:
    d = qb("d")
    h = qb("h", ["d"], t=1)
    passed = pe("h", ["d"], [S], PathStatus.PASSED)
    p = run([d, h], {"d": [pe("d", [], [], PathStatus.BUILDING)], "h": [passed]},
            allocator="preempting", budget=1)
    assert passed.id not in p.cancels and "h" not in p.entries


def test_fail_when_every_path_failed_and_feed_it_back_in_the_same_plan() -> None:
    a = qb("a")
    h = qb("h", ["a"], t=1)
    p = run([a, h], {"a": [pe("a", [], [], PathStatus.FAILED)],
                     "h": [pe("h", ["a"], [F], PathStatus.PASSED)]})
    # a fails; h's passed path assumed exactly that, so h merges in the same plan
    assert [(d.head, d.kind) for d in p.decisions] == [("a", "fail"), ("h", "merge")]
    assert p.decisions[0].reason == NO_PATH_PASSED
    # nothing funded is not a failure; a live path is not a failure either
    assert run([a]).decisions == ()
    assert run([a], {"a": [pe("a", [], [], PathStatus.BUILDING)]}).decisions == ()
    # a merging dependency resolves nothing
    m = qb("m", state=BatchState.MERGING)
    hm = qb("hm", ["m"], t=1)
    p = run([m, hm], {"hm": [pe("hm", ["m"], [F], PathStatus.FAILED)]})
    assert p.decisions == ()


def test_sticky_keeps_funded_paths_and_preempting_reclaims_them() -> None:
    d = qb("d")
    h = qb("h", ["d"], t=1)
    new = qb("n", t=2)
    # h hedged on d failing; d's own build has since passed, so the hedge is unlikely
    hedge = pe("h", ["d"], [F], PathStatus.BUILDING)
    entries = {"d": [pe("d", [], [], PathStatus.PASSED)],
               "h": [pe("h", ["d"], [S], PathStatus.BUILDING), hedge]}
    sticky_plan = run([d, h, new], entries, budget=2)
    assert sticky_plan.cancels == () and sticky_plan.builds == ()
    pre = run([d, h, new], entries, budget=2, allocator="preempting")
    assert pre.cancels == (hedge.id,)
    freed = {**entries, "h": [entries["h"][0], replace(hedge, status=PathStatus.CANCELLED)]}
    assert [b.head for b in run([d, h, new], freed, budget=2, allocator="preempting").builds] \
        == ["n"]


def test_a_path_with_a_verdict_is_never_rebuilt_and_a_cancelled_one_gets_a_new_attempt(
        ) -> None:
    d = qb("d")
    h = qb("h", ["d"], t=1)
    dl = pe("d", [], [], PathStatus.BUILDING)
    both_failed = [pe("h", ["d"], [S], PathStatus.FAILED), pe("h", ["d"], [F], PathStatus.FAILED)]
    p = run([d, h], {"d": [dl], "h": both_failed}, budget=10, min_probability=0.0)
    assert p.builds == () and "h" not in p.entries
    stopped = pe("h", ["d"], [S], PathStatus.CANCELLED, attempt=2)
    p = run([d, h], {"d": [dl], "h": [stopped]}, budget=2, now=9)
    assert [b.id for b in p.builds] == [stopped.id]
    (again,) = p.entries["h"]
    assert (again.status, again.attempt, again.updated_at_ms) == (PathStatus.PENDING, 3, 9)


def test_min_probability_limits_hedges_but_every_head_gets_its_likely_path() -> None:
    deps = [f"d{i}" for i in range(6)]
    batches = [qb(d) for d in deps] + [qb("h", deps, t=1)]
    building = {d: [pe(d, [], [], PathStatus.BUILDING)] for d in deps}
    inp = PlanInput(batches={b.id: b for b in batches}, entries=building,
                    probs=dict.fromkeys(deps, 0.6), budget=20, mean_build_ms=MEAN,
                    min_probability=0.1, hedge_by_time=False)
    out = plan(inp)
    # 0.6**6 < 0.1, yet h's most likely path is funded - and nothing else of h's
    assert [b.head for b in out.builds] == ["h"]
    assert out.builds[0].dependencies == tuple((d, S) for d in deps)
    full = plan(replace(inp, min_probability=0.0))
    assert len(full.builds) == 20 - len(deps)


def test_invariant_checker_rejects_broken_plans() -> None:
    d, h = qb("d"), qb("h", ["d"], t=1)
    failed = pe("h", ["d"], [S], PathStatus.FAILED)
    passed = pe("h", ["d"], [F], PathStatus.PASSED)
    inp = PlanInput(batches={"d": d, "h": h}, entries={"h": [failed, passed]}, probs={},
                    budget=1)
    ok = plan(inp)
    check(inp, ok, preempted=set())
    rebuilt = replace(ok, builds=(failed.path,),
                      entries={"h": (replace(failed, status=PathStatus.PENDING), passed)})
    cancelled_passed = replace(ok, cancels=(passed.id,),
                               entries={"h": (failed, replace(passed,
                                                              status=PathStatus.CANCELLED))})
    over = PlanInput(batches={"d": d, "h": h},
                     entries={"d": [pe("d", [], [], PathStatus.BUILDING)]}, probs={}, budget=1)
    new = path("h", ["d"], [S])
    over_budget = Plan(decisions=(), entries={"h": (PathEntry(new, PathStatus.PENDING),)},
                       dependencies={}, builds=(new,), cancels=(), rebuilds=0)
    not_a_head = Plan(decisions=(), entries={"d": (PathEntry(SpeculationPath("d", ()),
                                                             PathStatus.PENDING),)},
                      dependencies={}, builds=(SpeculationPath("d", ()),), cancels=(),
                      rebuilds=0)
    merging = {"d": replace(d, state=BatchState.MERGING), "h": h}
    for bad_inp, bad in ((inp, rebuilt), (inp, cancelled_passed), (over, over_budget),
                         (replace(over, batches=merging, entries={}), not_a_head)):
        with pytest.raises(PlanInvariantError):
            check(bad_inp, bad, preempted=set())
    with pytest.raises(PlanInvariantError):
        check(inp, ok, preempted={"x"})  # sticky never preempts


# Random snapshots: any queue, any stored statuses, any budget.
snapshot_st = st.fixed_dictionaries({
    "states": st.lists(st.sampled_from([BatchState.SPECULATING] * 4 + [
        BatchState.MERGING, BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLING]),
        min_size=1, max_size=6),
    "edges": st.lists(st.booleans(), min_size=15, max_size=15),
    "statuses": st.lists(st.sampled_from(list(PathStatus)), max_size=24),
    "choices": st.lists(st.integers(min_value=0, max_value=63), max_size=24),
    "probs": st.lists(st.floats(min_value=0.05, max_value=0.95), min_size=6, max_size=6),
    "budget": st.integers(min_value=0, max_value=8),
    "allocator": st.sampled_from(["sticky", "preempting"]),
    "coverage": st.sampled_from([None, CoveragePolicy(min_remaining=0.0),
                                 CoveragePolicy(complements=True)]),
    "min_probability": st.sampled_from([0.0, 0.1]),
    "cover": st.booleans(),  # give the last batch a passed path for every combination
})


def _snapshot(d: dict) -> PlanInput:  # type: ignore[type-arg]
    ids = [f"b{i}" for i in range(len(d["states"]))]
    pairs = [(i, j) for j in range(len(ids)) for i in range(j)]
    batches = {}
    for j, (bid, state) in enumerate(zip(ids, d["states"], strict=True)):
        deps = [ids[i] for (i, jj), on in zip(pairs, d["edges"], strict=False)
                if jj == j and on]
        batches[bid] = qb(bid, deps, state, t=j)
    entries: dict[str, list[PathEntry]] = {}
    seen: set[str] = set()
    for k, (status, choice) in enumerate(zip(d["statuses"], d["choices"], strict=False)):
        b = batches[ids[k % len(ids)]]
        bits = [Assumption.SUCCEEDS if choice >> n & 1 else Assumption.FAILS
                for n in range(len(b.dependencies))]
        e = pe(b.id, b.dependencies, bits, status, t=k)
        if e.id not in seen:
            seen.add(e.id)
            entries.setdefault(b.id, []).append(e)
    last = batches[ids[-1]]
    if d["cover"] and len(last.dependencies) <= 2:
        entries[last.id] = [
            pe(last.id, last.dependencies, combo, PathStatus.PASSED)
            for combo in itertools.product((S, F), repeat=len(last.dependencies))]
    return PlanInput(batches=batches, entries=entries,
                     probs=dict(zip(ids, d["probs"], strict=False)), budget=d["budget"],
                     allocator=d["allocator"], coverage=d["coverage"], now_ms=30,
                     mean_build_ms=10.0, min_probability=d["min_probability"])


@settings(max_examples=300, deadline=None)
@given(d=snapshot_st)
def test_random_snapshots_keep_every_invariant(d: dict) -> None:  # type: ignore[type-arg]
    inp = _snapshot(d)
    out = plan(inp)  # plan() checks its invariants itself and raises on a violation
    before = {e.id: e for es in inp.entries.values() for e in es}
    after = {**{h: tuple(es) for h, es in inp.entries.items()}, **out.entries}
    live_before = sum(1 for e in before.values() if e.status.live)
    live_after = sum(1 for es in after.values() for e in es if e.status.live)
    if out.builds:
        assert live_after <= inp.budget
    assert live_after <= max(inp.budget, live_before)
    for es in after.values():
        for e in es:
            old = before.get(e.id)
            if old is not None and old.status in (PathStatus.PASSED, PathStatus.FAILED):
                assert e == old  # verdicts never change, passed paths are never cancelled
    heads = {b.id for b in inp.batches.values() if b.state is BatchState.SPECULATING}
    assert {p.head for p in out.builds} <= heads - {x.head for x in out.decisions}
    if inp.allocator == "sticky":
        for pid in out.cancels:
            head = before[pid].path.head
            b = inp.batches[head]
            deps = out.dependencies.get(head, b.dependencies)
            res = {k: core.resolution(v.state) for k, v in inp.batches.items()}
            res.update({x.head: Resolution.FAILED for x in out.decisions if x.kind == "fail"})
            valid = tuple(dep for dep, _ in before[pid].path.dependencies) == deps
            deps_now = {k: out.dependencies.get(k, v.dependencies)
                        for k, v in inp.batches.items()}
            assert head in {x.head for x in out.decisions} or not valid or \
                core.broken(before[pid].path, res) or \
                doom.doomed(before[pid].path, doom.failed_paths(inp.entries), res, deps_now)
    for x in out.decisions:
        if x.bypass:  # every overtaken batch now depends on the head and rebuilds with it
            assert x.path_id in x.covering and len(x.covering) == 2 ** len(x.overtaken)
            for o in x.overtaken:
                assert out.dependencies[o][-1] == x.head
                new = [e for e in out.entries.get(o, ()) if e.id not in before]
                assert all(e.path.dependencies[-1][0] == x.head for e in new)
                assert not new or new[0].path.dependencies[-1] == (x.head, S)
    assert plan(inp) == out  # deterministic
