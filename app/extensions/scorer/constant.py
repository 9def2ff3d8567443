"""A scorer that gives every batch the same probability of landing."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.entities import ChangeDetails


class ConstantScorer:
    def __init__(self, probability: float) -> None:
        if not 0 < probability < 1:
            raise ValueError(f"probability must be strictly between 0 and 1, got {probability}")
        self.probability = probability

    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        return self.probability
