"""Pure scorers: P(batch ultimately lands) from what the change provider reported.

Each implements ``score(batch_id, changes) -> float`` (the queue's Scorer protocol).
The constant scorer and the factory from configuration live in ``scoring.py``. No I/O here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from app.domain.entities import ChangeDetails

ROOT = "."


class Scorer(Protocol):
    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float: ...


def _check_probability(p: float, what: str) -> None:
    if math.isnan(p) or not 0.0 < p < 1.0:
        raise ValueError(f"{what} must be strictly between 0 and 1, got {p}")


def lines_changed(changes: Sequence[ChangeDetails]) -> int:
    return sum(f.lines_added + f.lines_deleted for c in changes for f in c.changed_files)


def top_level(path: str) -> str:
    """Top-level directory of a file path; files at the root map to ``"."``."""
    parts = [p for p in path.strip("/").split("/") if p not in ("", ".")]
    return parts[0] if len(parts) > 1 else ROOT


def authors(changes: Sequence[ChangeDetails]) -> list[str]:
    out: list[str] = []
    for c in changes:
        who = c.author_email or c.author_name
        if who and who not in out:
            out.append(who)
    return out


def directories(changes: Sequence[ChangeDetails]) -> list[str]:
    out: list[str] = []
    for c in changes:
        for f in c.changed_files:
            d = top_level(f.path)
            if d not in out:
                out.append(d)
    return out


class SizeScorer:
    """Buckets ``(min_lines, max_lines, p)`` (inclusive) over total lines changed;
    first match wins. No match -> ``default``, or ``ValueError`` when it is None."""

    def __init__(self, buckets: Sequence[tuple[int, int, float]],
                 default: float | None = None) -> None:
        for lo, hi, p in buckets:
            if lo > hi:
                raise ValueError(f"bucket [{lo}, {hi}] is empty")
            _check_probability(p, "bucket probability")
        if default is not None:
            _check_probability(default, "default")
        self.buckets = tuple(buckets)
        self.default = default

    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        n = lines_changed(changes)
        for lo, hi, p in self.buckets:
            if lo <= n <= hi:
                return p
        if self.default is None:
            raise ValueError(f"no bucket for {n} lines changed in {batch_id}")
        return self.default


class HistoryScorer:
    """Smoothed recent pass rate, averaged over the batch's authors and top-level
    directories: per key, ``(passes + prior_p * prior_weight) / (n + prior_weight)``
    over its last ``window`` recorded builds. A batch with no key scores ``prior_p``."""

    def __init__(self, prior_p: float = 0.9, prior_weight: float = 2.0,
                 window: int = 50) -> None:
        _check_probability(prior_p, "prior_p")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.prior_p = prior_p
        self.prior_weight = prior_weight
        self.window = window
        self._history: dict[str, deque[bool]] = {}

    def _add(self, key: str, passed: bool) -> None:
        self._history.setdefault(key, deque(maxlen=self.window)).append(passed)

    def record(self, author: str, directories: Iterable[str], passed: bool) -> None:
        """A finished build of a change by ``author`` touching ``directories``
        (top-level names; a path is reduced to its first component)."""
        if author:
            self._add("author:" + author, passed)
        for d in dict.fromkeys(_first(d) for d in directories):
            self._add("dir:" + d, passed)

    def record_changes(self, changes: Sequence[ChangeDetails], passed: bool) -> None:
        for a in authors(changes):
            self._add("author:" + a, passed)
        for d in directories(changes):
            self._add("dir:" + d, passed)

    def rate(self, key: str) -> float:
        h = self._history.get(key, ())
        w = self.prior_weight
        return (sum(h) + self.prior_p * w) / (len(h) + w)

    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        keys = ["author:" + a for a in authors(changes)]
        keys += ["dir:" + d for d in directories(changes)]
        if not keys:
            return self.prior_p
        return math.fsum(self.rate(k) for k in keys) / len(keys)


def _first(directory: str) -> str:
    parts = [p for p in directory.strip("/").split("/") if p not in ("", ".")]
    return parts[0] if parts else ROOT


class CombinedScorer:
    """Weighted average of children's scores (equal weights by default)."""

    def __init__(self, children: Sequence[Scorer],
                 weights: Sequence[float] | None = None) -> None:
        if not children:
            raise ValueError("CombinedScorer needs at least one child")
        ws = [1.0] * len(children) if weights is None else [float(w) for w in weights]
        if len(ws) != len(children):
            raise ValueError("one weight per child")
        if any(math.isnan(w) or w < 0 for w in ws) or not sum(ws) > 0:
            raise ValueError("weights must be non-negative with a positive sum")
        self.children = tuple(children)
        self.weights = tuple(ws)

    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        total = math.fsum(self.weights)
        return math.fsum(w * c.score(batch_id, changes)
                         for c, w in zip(self.children, self.weights, strict=True)) / total
