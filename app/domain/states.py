"""State enums; the wire value is the value. docs/pipeline.md lists every transition."""

from __future__ import annotations

from enum import StrEnum


class RequestState(StrEnum):
    """Orchestrator state of a land request."""

    STARTED = "started"
    VALIDATED = "validated"
    BATCHED = "batched"
    CANCELLING = "cancelling"
    LANDED = "landed"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _REQUEST_TERMINAL

    @property
    def halted(self) -> bool:
        """Terminal or cancelling: forward-progress controllers leave it alone."""
        return self.terminal or self is RequestState.CANCELLING


_REQUEST_TERMINAL = {RequestState.LANDED, RequestState.ERROR, RequestState.CANCELLED}


class BatchState(StrEnum):
    CREATING = "creating"
    CREATED = "created"
    SPECULATING = "speculating"
    MERGING = "merging"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLED)

    @property
    def halted(self) -> bool:
        return self.terminal or self is BatchState.CANCELLING

    @property
    def cancellable(self) -> bool:
        return self in (BatchState.CREATED, BatchState.SPECULATING, BatchState.CANCELLING)

    @property
    def active(self) -> bool:
        """In the queue's working set (speculation reads these)."""
        return self in _BATCH_ACTIVE

    @property
    def dependency_eligible(self) -> bool:
        """A later batch may depend on it."""
        return self in (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING)


_BATCH_ACTIVE = {
    BatchState.CREATED,
    BatchState.SPECULATING,
    BatchState.MERGING,
    BatchState.CANCELLING,
}


class PathStatus(StrEnum):
    PENDING = "pending"
    BUILDING = "building"
    CANCELLING = "cancelling"
    PASSED = "passed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (PathStatus.PASSED, PathStatus.FAILED, PathStatus.CANCELLED)

    @property
    def live(self) -> bool:
        """Holds a slot of the build budget."""
        return not self.terminal


class BuildStatus(StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # The build produced no verdict: infrastructure failure, or lost (its runner
    # restarted while it ran). Its path gets a new attempt (bounded); never a red flag.
    ERRORED = "errored"

    @property
    def terminal(self) -> bool:
        return self in (BuildStatus.SUCCEEDED, BuildStatus.FAILED, BuildStatus.CANCELLED,
                        BuildStatus.ERRORED)


class Assumption(StrEnum):
    SUCCEEDS = "succeeds"
    FAILS = "fails"


class LandStrategy(StrEnum):
    REBASE = "rebase"
    SQUASH_REBASE = "squash_rebase"
    MERGE = "merge"
    FAST_FORWARD = "fast_forward"


class Priority(StrEnum):
    """How urgently a land request goes through the queue (``docs/pipeline.md``): a batch
    goes ahead of every conflicting batch of a lower priority that is not yet merging.
    ``hotfix`` needs the admin token or the queue's ``hotfix_allowed`` list."""

    NORMAL = "normal"
    HIGH = "high"
    HOTFIX = "hotfix"

    @property
    def rank(self) -> int:
        """0 for ``normal``; a higher priority has a higher rank."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.NORMAL: 0, Priority.HIGH: 1, Priority.HOTFIX: 2}


class PublicStatus(StrEnum):
    """What the gateway reports; ``accepting`` is internal and never shown."""

    ACCEPTING = "accepting"
    ACCEPTED = "accepted"
    STARTED = "started"
    VALIDATING = "validating"
    VALIDATED = "validated"
    BATCHING = "batching"
    BATCHED = "batched"
    SPECULATING = "speculating"
    SPECULATED = "speculated"
    LANDING = "landing"
    LANDED = "landed"
    ERROR = "error"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (PublicStatus.LANDED, PublicStatus.ERROR, PublicStatus.CANCELLED)


class HistoryEvent(StrEnum):
    BUILDING = "building"
    BUILT = "built"
    FLAKE_SUSPECTED = "flake_suspected"  # a retried path passed after a failed build
    WAITING = "waiting"
    INVALIDATED = "invalidated"


class LogType(StrEnum):
    STATUS = "status"
    EVENT = "event"


REQUEST_TO_PUBLIC_TERMINAL = {
    RequestState.LANDED: PublicStatus.LANDED,
    RequestState.ERROR: PublicStatus.ERROR,
    RequestState.CANCELLED: PublicStatus.CANCELLED,
}

BATCH_TO_REQUEST_TERMINAL = {
    BatchState.SUCCEEDED: RequestState.LANDED,
    BatchState.FAILED: RequestState.ERROR,
    BatchState.CANCELLED: RequestState.CANCELLED,
}
