"""The seams a merge queue plugs into, one protocol each (fakes and real ones).

Errors: an extension raises ``ChangeRejected`` / returns a failed outcome for a
*permanent* problem with the change (a person must act), and lets infrastructure
errors (timeouts, connection errors, HTTP 5xx) propagate: the queue classifies
those as retryable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.domain.entities import ChangeDetails
from app.domain.errors import SubmitQueueError
from app.domain.states import BuildStatus, LandStrategy


class ChangeRejected(SubmitQueueError):
    """The change cannot land as it is (unknown, stale, unreadable); the reason says why."""

    code = "change_rejected"


class ChangeProvider(Protocol):
    async def get(self, queue: str, change_uris: Sequence[str]) -> list[ChangeDetails]:
        """Details of each change of a stack, in order."""
        ...


@dataclass(frozen=True, slots=True)
class BatchChanges:
    """What a conflict analyzer knows of a batch: its id and the files it touches."""

    batch_id: str
    files: tuple[str, ...]


class ConflictAnalyzer(Protocol):
    def analyze(self, candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[str]:
        """Ids of the in-flight batches the candidate conflicts with, in input order."""
        ...


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """Build the head batch's changes on top of the base changes (assumed to land)."""

    queue: str
    batch_id: str
    path_id: str
    attempt: int
    base_changes: tuple[str, ...]
    head_changes: tuple[str, ...]

    @property
    def idempotency_key(self) -> str:
        return f"{self.queue}:{self.path_id}:{self.attempt}"


@dataclass(frozen=True, slots=True)
class BuildReport:
    status: BuildStatus
    log_url: str = ""
    detail: str = ""


class BuildRunner(Protocol):
    async def trigger(self, request: BuildRequest) -> str:
        """Start a build promptly and return its id (unique per trigger)."""
        ...

    async def status(self, build_id: str) -> BuildReport: ...

    async def cancel(self, build_id: str) -> None:
        """Ask the build to stop (best effort; the status reports when it did)."""
        ...


@dataclass(frozen=True, slots=True)
class MergeStep:
    step_id: str  # the request's sqid
    change_uris: tuple[str, ...]
    strategy: LandStrategy


@dataclass(frozen=True, slots=True)
class MergeSpec:
    queue: str
    id: str  # sqid for a check, batch id for a merge
    steps: tuple[MergeStep, ...]


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    succeeded: bool
    reason: str = ""
    outputs: tuple[str, ...] = ()
    conflicting_paths: tuple[str, ...] = field(default_factory=tuple)


class Merger(Protocol):
    async def check(self, spec: MergeSpec) -> MergeOutcome:
        """Dry run: would the steps apply cleanly onto the target now?"""
        ...

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        """Apply the steps onto the target and publish them as one update.

        Must be idempotent: a step already on the target is recognised, not re-applied.
        """
        ...


class Scorer(Protocol):
    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        """Probability in (0, 1) that the batch ultimately lands."""
        ...


@dataclass(frozen=True, slots=True)
class QueueExtensions:
    provider: ChangeProvider
    analyzer: ConflictAnalyzer
    runner: BuildRunner
    merger: Merger
    scorer: Scorer
    build_budget: int
