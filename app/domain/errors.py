"""The one exception tree of SubmitQueue.

Only ``app/api`` maps these to HTTP (one handler). The durable queue classifies
them through their ``retryable`` attribute, without importing this module.

| Error | Meaning | Retryable | HTTP |
|---|---|---|---|
| ``NotFound`` | the entity does not exist (in that queue) | no | 404 |
| ``AlreadyExists`` | a create met an existing key | no | 409 |
| ``VersionMismatch`` | a conditional write lost a race; reload and try again | yes | 409 |
| ``InvalidState`` | the entity is in a state this operation cannot start from | no | 409 |
| ``ValidationError`` | input breaks a rule; the message says which and how to fix it | no | 400 |
| ``Busy`` | a shared resource (the SQLite write lock) stayed taken past its bound; nothing was written | yes | 503 + ``Retry-After`` |
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations


class SubmitQueueError(Exception):
    """Root of the tree. ``code`` is the stable machine-readable name."""

    code = "error"
    retryable = False


class NotFound(SubmitQueueError):
    code = "not_found"


class AlreadyExists(SubmitQueueError):
    code = "already_exists"


class VersionMismatch(SubmitQueueError):
    code = "version_mismatch"
    retryable = True


class InvalidState(SubmitQueueError):
    code = "invalid_state"


class ValidationError(SubmitQueueError):
    code = "validation_error"


class Busy(SubmitQueueError):
    code = "busy"
    retryable = True
