"""The planner's input and output types: a snapshot of one queue, and the plan for it.

They live apart from :mod:`app.speculation.planner` so that its invariant check
(:mod:`app.speculation.invariants`) can name them without importing the planner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.speculation.allocator import AllocatorName
from app.speculation.coverage import CoveragePolicy
from app.speculation.evidence import EvidencePolicy

__all__ = ["DEFAULT_EVIDENCE", "Decision", "Plan", "PlanInput"]

DEFAULT_EVIDENCE = EvidencePolicy()


@dataclass(frozen=True, slots=True)
class PlanInput:
    """A snapshot of one merge queue. ``entries`` are already folded with build results.

    ``probs``: P(batch lands) per batch id from the scorer (missing/invalid -> 0.95).
    ``budget`` counts live entries (pending, building, cancelling) of every batch.
    ``merging_probability``: P(lands) used for a ``merging`` dependency.
    ``evidence``: how finished builds refine ``probs`` (None: use ``probs`` as given).
    ``min_probability``: fund no path less likely than this, except each head's most
    likely path (0, the default: plain best-first, the whole budget is spent; the
    simulator's best variants use 0.1: fewer wasted builds and a better P95). A path's
    probability is that all its assumptions hold, times the head's own P(good) for every
    path but the head's most likely one (``weigh_alternatives``).
    ``hedge_by_time``: discount hedges on a dependency whose own build reports soon
    (:func:`app.speculation.evidence.hedge_weights`; needs ``evidence``). Off by default;
    the simulator's best variants turn it on.
    ``vindication_depth``: a head whose paths all failed is not failed while a path of
    one of its first N dependents that contains a failed one is pending or building
    (:func:`app.speculation.vindication.pending`; 0, the default: off).
    """

    batches: Mapping[str, Batch]
    entries: Mapping[str, Sequence[PathEntry]]
    probs: Mapping[str, float]
    budget: int
    allocator: AllocatorName = "sticky"
    coverage: CoveragePolicy | None = None
    now_ms: int = 0
    mean_build_ms: float = 600_000.0
    merging_probability: float = 0.99
    evidence: EvidencePolicy | None = DEFAULT_EVIDENCE
    min_probability: float = 0.0
    weigh_alternatives: bool = True
    hedge_by_time: bool = False
    vindication_depth: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_probability < 1.0:
            raise ValueError(f"min_probability must be in [0, 1), got {self.min_probability}")
        if not 0.0 < self.merging_probability < 1.0:
            raise ValueError("merging_probability must be strictly between 0 and 1")


@dataclass(frozen=True, slots=True)
class Decision:
    head: str
    kind: Literal["merge", "fail"]
    path_id: str | None = None
    reason: str = ""
    bypass: bool = False
    overtaken: tuple[str, ...] = ()
    covering: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    decisions: tuple[Decision, ...]
    entries: Mapping[str, tuple[PathEntry, ...]]
    dependencies: Mapping[str, tuple[str, ...]]
    builds: tuple[SpeculationPath, ...]
    cancels: tuple[str, ...]
    rebuilds: int
