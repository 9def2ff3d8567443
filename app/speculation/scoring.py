"""Build a queue's scorer from its configuration (pure; see ``ScorerConfig``).

The history scorer learns: ``observe_build`` feeds it a finished build's outcome.
A build's verdict is charged to the changes it is evidence about: a pass vouches
for the head and for every dependency built underneath it; a failure is charged to
the head only when nothing else was built underneath it (otherwise the culprit is
unknown and nothing is recorded).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.entities import ChangeDetails
from app.domain.queue_config import ScorerConfig
from app.speculation.scorers import CombinedScorer, HistoryScorer, Scorer, SizeScorer


class ConstantScorer:
    """Every batch gets the same probability."""

    def __init__(self, probability: float) -> None:
        if not 0 < probability < 1:
            raise ValueError(f"probability must be strictly between 0 and 1, got {probability}")
        self.probability = probability

    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        return self.probability


def build_scorer(cfg: ScorerConfig) -> Scorer:
    match cfg.type:
        case "constant":
            return ConstantScorer(cfg.probability)
        case "size":
            return SizeScorer([(b.min_lines, b.max_lines, b.p) for b in cfg.buckets],
                              default=cfg.default)
        case "history":
            return HistoryScorer(prior_p=cfg.prior, prior_weight=cfg.prior_weight,
                                 window=cfg.window)
        case "combined":
            return CombinedScorer([build_scorer(c) for c in cfg.children], cfg.weights)
    raise ValueError(f"unknown scorer type {cfg.type!r}")


def learners(scorer: object) -> list[HistoryScorer]:
    """Every history scorer inside ``scorer`` (itself, or children of a combination)."""
    if isinstance(scorer, HistoryScorer):
        return [scorer]
    if isinstance(scorer, CombinedScorer):
        return [h for c in scorer.children for h in learners(c)]
    return []


def observe_build(scorer: object, *, head: Sequence[ChangeDetails],
                  base: Sequence[ChangeDetails], passed: bool) -> None:
    """Teach every history scorer inside ``scorer`` one finished build's verdict."""
    for h in learners(scorer):
        if passed:
            h.record_changes([*head, *base], True)
        elif not base:
            h.record_changes(head, False)
