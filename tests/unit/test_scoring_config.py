"""Scorers built from queues.yaml, and how the history scorer learns from builds."""

from __future__ import annotations

import pytest

from app.domain.entities import ChangeDetails, ChangedFile
from app.domain.errors import ValidationError
from app.domain.queue_config import parse_queues
from app.speculation.scorers import CombinedScorer, HistoryScorer, SizeScorer
from app.speculation.scoring import ConstantScorer, build_scorer, learners, observe_build


def scorer_of(block: str) -> object:
    cfg = parse_queues(f"queues:\n  - name: q\n    scorer: {block}\n")["q"].scorer
    return build_scorer(cfg)


def change(author: str, *paths: str, lines: int = 1) -> ChangeDetails:
    return ChangeDetails(uri=f"u-{author}-{paths}", author_email=author,
                         changed_files=tuple(ChangedFile(p, lines, 0) for p in paths))


def test_each_scorer_type_is_built_from_its_block() -> None:
    assert isinstance(scorer_of("{type: constant, probability: 0.8}"), ConstantScorer)
    size = scorer_of("{type: size, buckets: [{min_lines: 0, max_lines: 9, p: 0.99}], "
                     "default: 0.5}")
    assert isinstance(size, SizeScorer)
    assert size.score("b", [change("a", "x/y.py", lines=3)]) == 0.99
    assert size.score("b", [change("a", "x/y.py", lines=30)]) == 0.5
    combined = scorer_of("{type: combined, children: [{type: history}, {type: size}], "
                         "weights: [3, 1]}")
    assert isinstance(combined, CombinedScorer)
    assert [type(c) for c in combined.children] == [HistoryScorer, SizeScorer]
    assert len(learners(combined)) == 1


@pytest.mark.parametrize("block, words", [
    ("{type: combined}", "needs children"),
    ("{type: size, children: [{type: constant}]}", "takes no children"),
    ("{type: combined, children: [{type: size}], weights: [1, 2]}", "one non-negative weight"),
    ("{type: size, buckets: [{min_lines: 9, max_lines: 1, p: 0.5}]}", "min_lines 9 > max_lines"),
    ("{type: history, prior: 1.5}", "prior"),
    ("{type: oracle}", "type"),
])
def test_bad_scorer_blocks_are_rejected_with_the_reason(block: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        scorer_of(block)
    assert words in str(err.value)


def test_history_learns_pass_and_fail_only_where_the_evidence_points() -> None:
    h = scorer_of("{type: history, prior: 0.9, prior_weight: 1, window: 10}")
    assert isinstance(h, HistoryScorer)
    risky, safe = [change("risky@x", "core/a.py")], [change("safe@x", "docs/b.md")]
    assert h.score("b", risky) == pytest.approx(0.9)
    observe_build(h, head=risky, base=[], passed=False)  # nothing underneath: its fault
    assert h.score("b", risky) == pytest.approx(0.45)
    # a failure with other changes underneath blames nobody
    observe_build(h, head=safe, base=risky, passed=False)
    assert h.score("b", safe) == pytest.approx(0.9)
    # a pass vouches for the head and for everything built underneath
    observe_build(h, head=safe, base=risky, passed=True)
    assert h.score("b", safe) == pytest.approx(0.95)
    assert h.score("b", risky) == pytest.approx((0 + 1 + 0.9) / 3)


def test_scorers_without_history_ignore_observations() -> None:
    fixed = scorer_of("{type: constant, probability: 0.7}")
    observe_build(fixed, head=[change("a", "x")], base=[], passed=False)
    assert isinstance(fixed, ConstantScorer) and fixed.score("b", []) == 0.7
