"""The one exception tree of SubmitQueue.

Only ``app/api`` maps these to HTTP (one handler). The durable queue classifies
them through their ``retryable`` attribute, without importing this module.

| Error | Meaning | Retryable | HTTP |
|---|---|---|---|
| ``NotFound`` | the entity does not exist (in that queue) | no | 404 |
| ``AlreadyExists`` | a create met an existing key | no | 409 |
| ``ChangeInFlight`` (``AlreadyExists``) | a live request (``sqid``) holds the change | no | 409 |
| ``ChangeLanded`` (``AlreadyExists``) | the change landed (``sqid``, ``commit``) | no | 409 |
| ``IdempotencyKeyReused`` | an ``Idempotency-Key`` came back with another body | no | 422 |
| ``VersionMismatch`` | a conditional write lost a race; reload and try again | yes | 409 |
| ``InvalidState`` | the entity is in a state this operation cannot start from | no | 409 |
| ``ValidationError`` | input breaks a rule; the message says which and how to fix it | no | 400 |
| ``PlanError`` | a speculation plan broke a rule (a planner or check bug) | no, decided | - |
| ``Busy`` | a shared resource (the SQLite write lock) stayed taken past its bound; nothing was written | yes | 503 + ``Retry-After`` |

``PlanError`` (raised as ``PlanRejected`` by the controller's check and as
``PlanInvariantError`` by the planner) is classified deliberately: the planner is a
pure function of the snapshot, so retrying gives the same answer and would only delay
the dead letter. It carries the batches it is about (the plan's offending heads) and
the queue; the durable queue stores its ``subjects`` with the dead letter (read
generically, like ``retryable``) and the ``speculate`` DLQ reconciler fails only those
batches. It never reaches the API (it is raised only inside the speculate stage).
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from collections.abc import Mapping, Sequence


class SubmitQueueError(Exception):
    """Root of the tree. ``code`` is the stable machine-readable name."""

    code = "error"
    retryable = False


class NotFound(SubmitQueueError):
    code = "not_found"


class AlreadyExists(SubmitQueueError):
    code = "already_exists"


class ChangeInFlight(AlreadyExists):
    """A change is claimed by another live request of the queue (``sqid``)."""

    code = "change_in_flight"

    def __init__(self, message: str, *, sqid: str) -> None:
        super().__init__(message)
        self.sqid = sqid


class ChangeLanded(AlreadyExists):
    """A change already landed in the queue, by ``sqid`` as ``commit`` ("" if unknown)."""

    code = "change_landed"

    def __init__(self, message: str, *, sqid: str, commit: str) -> None:
        super().__init__(message)
        self.sqid = sqid
        self.commit = commit


class IdempotencyKeyReused(SubmitQueueError):
    """An ``Idempotency-Key`` was sent again with a different request body."""

    code = "idempotency_key_reused"


class VersionMismatch(SubmitQueueError):
    code = "version_mismatch"
    retryable = True


class InvalidState(SubmitQueueError):
    code = "invalid_state"


class ValidationError(SubmitQueueError):
    code = "validation_error"


class PlanError(SubmitQueueError):
    """A speculation plan broke a rule. ``problems`` maps each batch the plan is wrong
    about to what is wrong with it; ``queue`` names the merge queue (set by whoever
    knows it). ``subjects`` is the attribution the durable queue records with a dead
    letter: ``{"type": "batch", "id", "reason"}`` per batch, then ``{"type": "queue"}``."""

    code = "plan_error"
    retryable = False
    summary = "speculation plan error"  # leads each subject's reason

    def __init__(self, message: str, *, queue: str = "",
                 problems: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(message)
        self.queue = queue
        self.problems: dict[str, tuple[str, ...]] = {
            b: tuple(p) for b, p in (problems or {}).items() if b}

    @property
    def batches(self) -> tuple[str, ...]:
        return tuple(self.problems)

    @property
    def subjects(self) -> list[dict[str, str]]:
        out = [{"type": "batch", "id": b, "reason": f"{self.summary}: {'; '.join(p)}"}
               for b, p in self.problems.items()]
        if self.queue:
            out.append({"type": "queue", "id": self.queue})
        return out


class Busy(SubmitQueueError):
    code = "busy"
    retryable = True
