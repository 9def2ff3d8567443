"""The one exception tree of SubmitQueue: every error the application raises on
purpose is drawn here (httpx's model: one module, the whole tree).

Only ``app/api/errors.py`` maps these to HTTP (``response_for``; one handler for the
whole tree). The durable queue classifies them through their ``retryable`` (and
``park``, ``subjects``) attributes, without importing this module: ``app/queue`` is a
library that knows nothing of merge queues, so its own small tree (``QueueError``:
``UnknownTopic``, ``InvalidPayload``, ``PayloadTooLarge``, ``QueueBusy``,
``LeaseLost``, ``MessageNotFound``, ``NotDeadLettered``; ``app/queue/errors.py``)
stays there and is mapped by the same function. Errors private to one adapter that
never leave it (``GitError``, ``Conflict``, ``SandboxUnavailable``; the client's
``ClientError``) stay in their modules.

```
SubmitQueueError
├── NotFound                         404
├── AlreadyExists                    409
│   ├── ChangeInFlight
│   └── ChangeLanded
├── IdempotencyKeyReused             422
├── VersionMismatch                  409 (retryable)
├── InvalidState                     409
├── ValidationError                  400
│   └── Undecodable                  (a dead letter naming no entity; parked)
├── ChangeRejected                   (the change provider refused it; never reaches the API)
├── Unauthorized                     401 + WWW-Authenticate: Bearer
│   └── BadSignature                 401 (a CI request's signature)
├── Forbidden                        403
│   ├── AdminDisabled
│   ├── MissingScope                 (names the scope the token lacks)
│   └── HotfixNotAllowed             (priority hotfix without the admin token or the allow-list)
├── QuotaExceeded                    429 + Retry-After
├── BuildTriggerRefused              (CI refused a trigger; never reaches the API)
├── Unattributed                     (a speculate dead letter naming no batch; parked)
├── NotificationFailed               (an endpoint did not take a notification; never reaches the API)
├── NotificationGivenUp              (a notify dead letter; parked)
├── PlanError                        (decided; never reaches the API)
│   ├── PlanRejected
│   └── PlanInvariantError           (app/speculation/invariants.py: also an AssertionError)
├── Busy                             503 + Retry-After (retryable)
└── ServiceUnavailable               503 + Retry-After (retryable)
    └── TooManyStreams
```

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
| ``ServiceUnavailable`` | a dependency (queue, database) failed transiently | yes | 503 + ``Retry-After`` |
| ``TooManyStreams`` | the live-stream cap is reached, or the server is stopping | yes | 503 + ``Retry-After: 5`` |
| ``Unauthorized`` | no or a wrong token | no | 401 |
| ``BadSignature`` | a CI request's ``X-SubmitQueue-Signature`` is missing, malformed, stale or wrong | no | 401 |
| ``Forbidden`` / ``AdminDisabled`` | the caller may not do this / the admin API is off | no | 403 |
| ``MissingScope`` (``Forbidden``) | the token lacks the scope the call needs (the message names it) | no | 403 |
| ``HotfixNotAllowed`` (``Forbidden``) | a land asked for priority ``hotfix`` without the admin token or a place on the queue's ``hotfix_allowed`` | no | 403 |
| ``QuotaExceeded`` | the actor's quota of the queue is used up; nothing was stored | yes, after ``retry_after_s`` | 429 + ``Retry-After`` |
| ``ChangeRejected`` | the change cannot land as it is (unknown, stale, unreadable) | no | - (ends the request `error`) |
| ``BuildTriggerRefused`` | the CI answered a trigger with a permanent error | no | - |
| ``Undecodable`` | a dead letter names no entity a reconciler can act on | no, parked | - |
| ``Unattributed`` | a ``speculate`` dead letter names no batch | no, parked | - |
| ``NotificationFailed`` | a notify endpoint answered 408/429/5xx or was unreachable (``retryable``), or answered a permanent error | per instance | - |
| ``NotificationGivenUp`` | a notification reached ``notify_dlq``: nothing to reconcile, kept for an operator | no, parked | - |

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


class ServiceUnavailable(SubmitQueueError):
    """A dependency (the queue or the database) failed transiently; the client should
    retry after ``retry_after_s``."""

    code = "unavailable"
    retryable = True
    retry_after_s = 2


class TooManyStreams(ServiceUnavailable):
    """No more live streams: the cap is reached, or the server is shutting down."""

    retry_after_s = 5


class Unauthorized(SubmitQueueError):
    """No credentials, or wrong ones (401; the answer names the Bearer scheme)."""

    code = "unauthorized"
    bearer = True


class BadSignature(Unauthorized):
    """A request's ``X-SubmitQueue-Signature`` is missing, malformed, stale, or does not
    match the build and the body it came with."""

    code = "bad_signature"
    bearer = False


class Forbidden(SubmitQueueError):
    code = "forbidden"


class AdminDisabled(Forbidden):
    """The admin API is off (no ``SQ_ADMIN_TOKEN``)."""

    code = "admin_disabled"


class MissingScope(Forbidden):
    """The caller's token lacks the scope the call needs; the message names it."""

    code = "missing_scope"


class HotfixNotAllowed(Forbidden):
    """A land asked for priority ``hotfix``, which needs the admin token or the caller's
    actor on the queue's ``hotfix_allowed`` list; the message says which."""

    code = "hotfix_not_allowed"


class QuotaExceeded(SubmitQueueError):
    """The actor used up a quota of the queue (``limit``: ``in_flight`` or
    ``per_hour``); try again after ``retry_after_s``."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, limit: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.retry_after_s = max(1, retry_after_s)


class ChangeRejected(SubmitQueueError):
    """The change cannot land as it is (unknown, stale, unreadable); the reason says why."""

    code = "change_rejected"


class BuildTriggerRefused(SubmitQueueError):
    """The CI answered the trigger with a permanent error (e.g. 401, 404)."""

    code = "build_trigger_refused"


class Undecodable(ValidationError):
    """The dead letter names no entity a reconciler can act on; an operator decides."""

    code = "undecodable"
    park = True  # the queue parks it at once: retrying cannot decode it


class Unattributed(SubmitQueueError):
    """A ``speculate`` dead letter whose error names no batch it is about: nothing is
    failed (the message's own batch is innocent); an operator decides."""

    code = "unattributed"
    park = True


class NotificationFailed(SubmitQueueError):
    """A notify endpoint did not take a notification: ``retryable`` for a timeout, a
    connection error or HTTP 408/429/5xx (not 501/505), else permanent (the DLQ)."""

    code = "notification_failed"

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class NotificationGivenUp(SubmitQueueError):
    """A notification in ``notify_dlq``: no state to drive, so it is parked for an
    operator (requeue it once the endpoint is fixed, or discard it)."""

    code = "notification_given_up"
    park = True


class CheckRunGivenUp(SubmitQueueError):
    """A ``SubmitQueue`` check-run update in ``github_check_dlq`` that failed once more:
    parked for an operator (requeue it once GitHub takes it, or discard it)."""

    code = "check_run_given_up"
    park = True


class PlanRejected(PlanError):
    """The controller's check refused a plan (``app/controllers/plan_check.py``)."""

    code = "plan_rejected"
    summary = "speculation plan rejected"
