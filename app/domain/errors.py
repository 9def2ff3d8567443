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
"""

from __future__ import annotations


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
