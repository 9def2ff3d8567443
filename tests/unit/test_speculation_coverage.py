"""Merge on full coverage (bypass), its pays rule, coverage funding, and build evidence."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation.complements import complements
from app.speculation.core import Resolution
from app.speculation.coverage import CoveragePolicy, Progress, cover, remaining_ms
from app.speculation.evidence import EvidencePolicy, hedge_weights, refine
from app.speculation.generator import Generator
from app.speculation.planner import Decision, Plan, PlanInput, plan

S, F = Assumption.SUCCEEDS, Assumption.FAILS
MEAN = 1000.0
NOW = 10_000
PAYS = CoveragePolicy()


def qb(hid: str, deps: Sequence[str] = (), state: BatchState = BatchState.SPECULATING,
       t: int = 0) -> Batch:
    return Batch(queue="q", id=hid, contains=(hid,), dependencies=tuple(deps), state=state,
                 version=1, created_at_ms=t)


def pe(hid: str, deps: Sequence[str], assumptions: Sequence[Assumption], status: PathStatus,
       *, t: int = NOW) -> PathEntry:
    p = SpeculationPath(head=hid, dependencies=tuple(zip(deps, assumptions, strict=True)))
    return PathEntry(path=p, status=status, created_at_ms=t, updated_at_ms=t)


def run(batches: Sequence[Batch], entries: dict[str, list[PathEntry]],
        coverage: CoveragePolicy | None = PAYS, **kw: object) -> Plan:
    kw.setdefault("min_probability", 0.1)  # hedges only when likely enough: exact plans
    inp = PlanInput(batches={b.id: b for b in batches}, entries=entries, probs={}, budget=8,
                    coverage=coverage, now_ms=NOW, mean_build_ms=MEAN,
                    **kw)  # type: ignore[arg-type]
    return plan(inp)


def covered_head(*, d_started: int = NOW) -> tuple[list[Batch], dict[str, list[PathEntry]]]:
    """d is still building; h (depending on d) passed with d landing and with d failing."""
    d = qb("d")
    h = qb("h", ["d"], t=1)
    return [d, h], {"d": [pe("d", [], [], PathStatus.BUILDING, t=d_started)],
                    "h": [pe("h", ["d"], [S], PathStatus.PASSED),
                          pe("h", ["d"], [F], PathStatus.PASSED)]}


def test_merge_on_full_coverage_and_the_overtaken_batch_rebuilds_with_the_head() -> None:
    batches, entries = covered_head()
    old_d = entries["d"][0]
    p = run(batches, entries)
    on_s, on_f = (e.id for e in entries["h"])
    assert p.decisions == (Decision("h", "merge", path_id=on_f, bypass=True, overtaken=("d",),
                                    covering=(on_s, on_f)),)
    # d must count h as part of its trunk from now on
    assert p.dependencies == {"d": ("h",)}
    assert p.cancels == (old_d.id,) and p.rebuilds == 1
    # ...and its next build, in the same plan, includes h (merging: assumed to land)
    assert p.builds == (SpeculationPath("d", (("h", S),)),)
    assert [e.status for e in p.entries["d"]] == [PathStatus.CANCELLING, PathStatus.PENDING]
    # h keeps both passed paths
    assert "h" not in p.entries
    # without a coverage policy nothing merges before d settles
    assert run(batches, entries, coverage=None).decisions == ()


def test_bypass_only_when_it_pays() -> None:
    # d's build is 90% done: waiting for it is cheaper than rebuilding it with h
    batches, entries = covered_head(d_started=NOW - 900)
    assert run(batches, entries).decisions == ()
    naive = run(batches, entries, coverage=CoveragePolicy(min_remaining=0.0))
    assert naive.decisions[0].bypass
    # d needs a whole new build anyway (its only path was contradicted): bypass pays
    c = qb("c", state=BatchState.FAILED)
    d = qb("d", ["c"])
    h = qb("h", ["d"], t=1)
    entries = {"d": [pe("d", ["c"], [S], PathStatus.PASSED)], "h": entries["h"]}
    p = run([c, d, h], entries)
    assert p.decisions[0].bypass and p.rebuilds == 0  # d's broken passed path was no use
    assert p.dependencies == {"d": ("c", "h")}
    assert p.builds == (SpeculationPath("d", (("c", F), ("h", S))),)


def test_no_bypass_over_a_merging_dependency_or_too_many_unsettled_ones() -> None:
    batches, entries = covered_head()
    merging = [qb("d", state=BatchState.MERGING), batches[1]]
    assert run(merging, entries, coverage=CoveragePolicy(min_remaining=0.0)).decisions == ()
    deps = ["a", "b", "c"]
    bs = [qb(x) for x in deps] + [qb("h", deps, t=1)]
    es = {"h": [pe("h", deps, combo, PathStatus.PASSED)
                for combo in itertools.product((S, F), repeat=3)]}
    es.update({x: [pe(x, [], [], PathStatus.BUILDING)] for x in deps})
    assert run(bs, es, coverage=CoveragePolicy(min_remaining=0.0)).decisions == ()
    p = run(bs, es, coverage=CoveragePolicy(max_unsettled=3, min_remaining=0.0))
    (dec,) = p.decisions
    assert dec.bypass and dec.overtaken == tuple(deps) and len(dec.covering) == 8
    assert p.dependencies == dict.fromkeys(deps, ("h",)) and p.rebuilds == 3


def test_a_failed_combination_means_no_coverage() -> None:
    batches, entries = covered_head()
    entries["h"][1] = pe("h", ["d"], [F], PathStatus.FAILED)
    assert run(batches, entries, coverage=CoveragePolicy(min_remaining=0.0)).decisions == ()


def test_old_paths_of_an_overtaken_batch_never_merge() -> None:
    """After a bypass the store holds d's old passed path (without h). Even when all its
    assumptions come true it is not what the trunk will hold: it must not merge."""
    c = qb("c", state=BatchState.SUCCEEDED)
    h = qb("h", state=BatchState.SUCCEEDED)
    d = qb("d", ["c", "h"])  # h was appended by the bypass
    stale = pe("d", ["c"], [S], PathStatus.PASSED)
    p = run([c, h, d], {"d": [stale]})
    assert p.decisions == ()
    assert p.builds == (SpeculationPath("d", (("c", S), ("h", S))),)


def test_cover_and_remaining_time() -> None:
    res = {"x": Resolution.SUCCEEDED}
    es = [pe("h", ["x", "d"], [S, S], PathStatus.PASSED),
          pe("h", ["x", "d"], [S, F], PathStatus.BUILDING)]
    assert cover(es, ["d"], res) is None
    es[1] = pe("h", ["x", "d"], [S, F], PathStatus.PASSED)
    assert cover(es, ["d"], res) == {(S,): es[0].id, (F,): es[1].id}
    assert cover(es, ["d"], {"x": Resolution.FAILED}) is None  # both contradicted

    entries = {"a": [pe("a", [], [], PathStatus.BUILDING, t=NOW - 300)],
               "b": [pe("b", ["a"], [S], PathStatus.PASSED)],
               "c": []}
    deps = {"a": (), "b": ("a",), "c": ("b",)}
    progress = Progress(res={}, merging=frozenset(), deps=deps, entries=entries,
                        valid=lambda h, e: True, now_ms=NOW, mean_build_ms=MEAN)
    assert remaining_ms("a", progress) == pytest.approx(700)
    assert remaining_ms("b", progress) == pytest.approx(700)  # passed, waits for a
    assert remaining_ms("c", progress) == pytest.approx(1000)  # needs a whole build
    done = Progress(res={"a": Resolution.SUCCEEDED}, merging=frozenset({"c"}), deps=deps,
                    entries=entries, valid=lambda h, e: True, now_ms=NOW, mean_build_ms=MEAN)
    assert remaining_ms("b", done) == 0 and remaining_ms("c", done) == 0
    cyclic = Progress(res={}, merging=frozenset(), deps={"a": ("b",), "b": ("a",)},
                      entries={}, valid=lambda h, e: True, now_ms=NOW, mean_build_ms=MEAN)
    assert remaining_ms("a", cyclic) == pytest.approx(1000)
    with pytest.raises(ValueError):
        CoveragePolicy(max_unsettled=0)
    with pytest.raises(ValueError):
        CoveragePolicy(min_remaining=-1)


def test_coverage_funding_fills_the_missing_combinations_of_a_head_with_a_foothold() -> None:
    d, e = qb("d"), qb("e")
    h = qb("h", ["d", "e"], t=1)
    lone = qb("l", ["d"], t=2)
    res: dict[str, Resolution] = {}
    policy = CoveragePolicy(complements=True, complement_slots=5)
    entries = {"h": [pe("h", ["d", "e"], [S, S], PathStatus.PASSED)]}
    got = complements([d, e, h, lone], entries, res, set(), policy, free=10)
    assert {p.dependencies for p in got} == {
        (("d", S), ("e", F)), (("d", F), ("e", S)), (("d", F), ("e", F))}
    assert len(complements([d, e, h, lone], entries, res, set(), policy, free=2)) == 2
    # no foothold (l has nothing yet), a dependency merging, a combination failed: none
    assert complements([d, e, h], entries, res, {"d"}, policy, free=10) == []
    entries["h"].append(pe("h", ["d", "e"], [F, F], PathStatus.FAILED))
    assert complements([d, e, h, lone], entries, res, set(), policy, free=10) == []
    # through the planner, only from slots best-first left free
    batches = [d, e, h]
    live = {"d": [pe("d", [], [], PathStatus.BUILDING)],
            "e": [pe("e", [], [], PathStatus.BUILDING)],
            "h": [pe("h", ["d", "e"], [S, S], PathStatus.PASSED)]}
    plain = run(batches, live)
    funded = run(batches, live, coverage=CoveragePolicy(complements=True, complement_slots=2))
    assert len(funded.builds) == len(plain.builds) + 2


def test_evidence_from_finished_builds() -> None:
    res: dict[str, Resolution] = {}
    passed = {"x": [pe("x", ["a", "b"], [S, F], PathStatus.PASSED)]}
    got = refine({"x": 0.5, "a": 0.6, "b": 0.6}, passed, res)
    assert got == {"x": 0.99, "a": 0.99, "b": 0.6}  # b was not in that build
    alone = {"y": [pe("y", ["a"], [F], PathStatus.FAILED)]}
    assert refine({"y": 0.9}, alone, res)["y"] == 0.02  # the only suspect
    # two suspects: Bayes, given at least one is bad
    two = {"y": [pe("y", ["a"], [S], PathStatus.FAILED)]}
    got = refine({"y": 0.9, "a": 0.9}, two, res, EvidencePolicy(rounds=1))
    assert got["y"] == pytest.approx(0.9 * 0.1 / (1 - 0.81))
    # a suspect known to be bad explains the failure away
    known = {**two, "a": [pe("a", [], [], PathStatus.FAILED)]}
    got = refine({"y": 0.9, "a": 0.9}, known, res)
    assert got["a"] == 0.02 and got["y"] > 0.89
    # a landed batch is no suspect
    got = refine({"y": 0.9, "a": 0.9}, two, {"a": Resolution.SUCCEEDED})
    assert got["y"] == 0.02
    # a batch since rejected explains the failure away, even with no failed build of
    # its own in sight (its path set is gone from the snapshot): the head keeps its prior
    got = refine({"y": 0.9, "a": 0.9}, two, {"a": Resolution.FAILED})
    assert got["y"] == 0.9
    with pytest.raises(ValueError):
        EvidencePolicy(passed_p=0.5, failed_p=0.6)


def test_a_failed_build_being_retried_is_evidence_until_the_retry_passes() -> None:
    """``speculation.retries``: the path's entry is live again (attempt 2) but its first
    build failed; a dependent should hedge on the head failing rather than wait."""
    res: dict[str, Resolution] = {}
    retrying = replace(pe("y", ["a"], [S], PathStatus.BUILDING), retried=1)
    got = refine({"y": 0.9, "a": 0.99}, {"y": [retrying]}, res)
    assert got["y"] < 0.1 and got["a"] == pytest.approx(0.99, abs=0.02)
    fresh = pe("y", ["a"], [S], PathStatus.BUILDING)  # never failed: no evidence
    assert refine({"y": 0.9, "a": 0.99}, {"y": [fresh]}, res)["y"] == 0.9
    passed = replace(retrying, status=PathStatus.PASSED)  # the retry passed: vouched
    assert refine({"y": 0.9, "a": 0.5}, {"y": [passed]}, res) == {"y": 0.99, "a": 0.99}


def test_hedges_are_discounted_by_how_soon_the_dependency_reports() -> None:
    got = hedge_weights({"a": 0.8, "b": 0.3, "c": 0.8, "d": 0.995}, {"a": 0.5, "b": 0.5, "d": 0})
    assert got["a"] == pytest.approx(0.9) and got["b"] == pytest.approx(0.15)
    assert got["c"] == 0.8 and got["d"] == 0.995  # no live build / conclusive already


@settings(max_examples=100, deadline=None)
@given(ps=st.lists(st.floats(min_value=0.02, max_value=0.98), min_size=1, max_size=5),
       ws=st.lists(st.floats(min_value=-5.0, max_value=0.0), min_size=2, max_size=2))
def test_alternative_weights_keep_the_generator_best_first_and_exhaustive(
        ps: list[float], ws: list[float]) -> None:
    heads = [qb("h0", [f"d{i}" for i in range(len(ps))]), qb("h1", ["d0"])]
    probs = {f"d{i}": p for i, p in enumerate(ps)}
    g = Generator(heads, {}, probs, {"h0": ws[0], "h1": ws[1]})
    got = list(g)
    assert all(a.score >= b.score for a, b in itertools.pairwise(got))
    assert len({c.path.id for c in got}) == len(got) == 2 ** len(ps) + 2
    for c in got:
        w = ws[c.head_index] if c.flips else 0.0
        base = sum(math.log(probs[d] if a is S else 1 - probs[d]) for d, a in c.path.dependencies)
        assert c.score == pytest.approx(base + w, abs=1e-9)
        assert g.score(c.path) == pytest.approx(c.score, abs=1e-9)
    with pytest.raises(ValueError):
        Generator(heads, {}, probs, {"h0": 0.5})
