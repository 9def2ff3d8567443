"""The contract between stages: topic names and payloads (each topic's payload type,
partition key, consumer and reconciler are declared once, in the stage registry
``app/controllers/stages.py``).

Within the orchestrator a message carries an id and the consumer reloads the
entity; across the gateway boundary (``start``, ``cancel``, ``log``) it carries the
full payload. Message ids are *intent ids* (``entity[/cause...]``) so a replayed
fan-out is stored once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.domain.entities import RequestLog
from app.domain.states import LandStrategy, LogType, Priority

START = "start"
CANCEL = "cancel"
VALIDATE = "validate"
MERGECHECK = "mergecheck"
MERGECONFLICTSIGNAL = "mergeconflictsignal"
BATCH = "batch"
DEPENDENCY_ANALYSIS = "dependency_analysis"
SPECULATE = "speculate"
BUILD = "build"
BUILDSIGNAL = "buildsignal"
MERGE = "merge"
MERGESIGNAL = "mergesignal"
CONCLUDE = "conclude"
LOG = "log"
NOTIFY = "notify"
GITHUB_CHECK = "github_check"

ORCHESTRATOR_GROUP = "orchestrator"
GATEWAY_LOG_GROUP = "gateway-log"
ORCHESTRATOR_DLQ_GROUP = "orchestrator-dlq"  # reconciles every orchestrator topic's ``_dlq``
GATEWAY_DLQ_GROUP = "gateway-dlq"  # reconciles ``log_dlq``
NOTIFY_RELAY_GROUP = "notify-relay"  # a second group on ``log``: notifiable entries -> ``notify``
NOTIFIER_GROUP = "notifier"  # POSTs each ``notify`` message to its endpoint
NOTIFIER_DLQ_GROUP = "notifier-dlq"  # parks ``notify_dlq`` (a notification given up)
# a group on ``log``: entries of GitHub queues -> ``github_check``
GITHUB_CHECK_RELAY_GROUP = "github-check-relay"
GITHUB_CHECK_GROUP = "github-checks"  # writes the SubmitQueue check-run of a request
GITHUB_CHECK_DLQ_GROUP = "github-checks-dlq"  # parks ``github_check_dlq`` (an update given up)


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LandRequestMsg(_Msg):
    id: str
    queue: str
    change_uris: list[str] = Field(min_length=1)
    strategy: LandStrategy
    received_at_ms: int = 0  # when the gateway accepted it (0: unknown, older messages)
    submitted_by: str = ""  # the actor who asked ("" in messages from before access)
    priority: Priority = Priority.NORMAL  # normal in messages from before priorities


class CancelRequestMsg(_Msg):
    id: str
    queue: str
    reason: str = ""
    actor: str = ""  # who asked to cancel ("" in messages from before access)


class EntityMsg(_Msg):
    """An id within the orchestrator (request sqid, batch id or build id) and its queue."""

    id: str
    queue: str


class BuildMsg(_Msg):
    id: str  # batch id
    queue: str
    path_id: str
    attempt: int = Field(ge=1)


class ResultMsg(_Msg):
    """The outcome of a dry-run merge check (id = sqid) or a merge (id = batch id)."""

    id: str
    queue: str
    outcome: Literal["succeeded", "failed"]
    reason: str = ""
    outputs: list[str] = Field(default_factory=list)
    conflicting_paths: list[str] = Field(default_factory=list)
    # a merge's landed commits per member request (sqid -> one commit per change)
    commits: dict[str, list[str]] = Field(default_factory=dict)
    code: str = ""  # a typed failure: "untested_tree"
    tip: str = ""  # untested_tree: the target tip the merger found
    moved: bool = False  # untested_tree: that tip is no passed build's base
    round: int = 0  # which merge of the batch (a move found sends it back to speculation)


class ConcludeMsg(_Msg):
    id: str  # batch id
    queue: str
    failure_reason: str = ""


class LogMsg(_Msg):
    queue: str
    request_id: str
    log_id: str
    timestamp_ms: int
    type: LogType
    status: str = ""
    event: str = ""
    request_version: int = 0
    last_error: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, entry: RequestLog) -> LogMsg:
        return cls(
            queue=entry.queue, request_id=entry.request_id, log_id=entry.log_id,
            timestamp_ms=entry.timestamp_ms, type=entry.type, status=entry.status,
            event=entry.event, request_version=entry.request_version,
            last_error=entry.last_error, metadata=dict(entry.metadata),
        )

    def entry(self) -> RequestLog:
        return RequestLog(
            queue=self.queue, request_id=self.request_id, timestamp_ms=self.timestamp_ms,
            type=self.type, status=self.status, event=self.event,
            request_version=self.request_version, last_error=self.last_error,
            metadata=dict(self.metadata), log_id=self.log_id,
        )


class NotifyMsg(_Msg):
    """One notification for one endpoint (``app/controllers/notify.py``): the facts of
    the log entry it announces, decided by the relay, so every attempt sends the same
    body. Message id ``<log id>/<endpoint>`` (also the ``X-SubmitQueue-Delivery``)."""

    id: str  # the request's sqid
    queue: str
    endpoint: str
    log_id: str
    event: Literal["landed", "removed", "needs_operator"]
    status: str
    reason: str | None = None  # app/domain/removals.py, None for landed
    last_error: str = ""
    timestamp_ms: int
    batch_id: str = ""
    commits: list[str] = Field(default_factory=list)

    @property
    def delivery_id(self) -> str:
        return f"{self.log_id}/{self.endpoint}"


class GitHubCheckMsg(_Msg):
    """Bring one request's ``SubmitQueue`` check-run up to date
    (``app/controllers/github_check.py``): written from the request's state once the
    request log holds ``log_id``. Message id ``<log id>/github-check``."""

    id: str  # the request's sqid
    queue: str
    log_id: str
    timestamp_ms: int

    @property
    def message_id(self) -> str:
        return f"{self.log_id}/github-check"


def log_id(sqid: str, name: str, occurrence: str | None = None) -> str:
    """``<sqid>/<status|event>[/<occurrence>]``: one log message per intent."""
    return f"{sqid}/{name}/{occurrence}" if occurrence else f"{sqid}/{name}"


def accepted_entry(msg: LandRequestMsg, now_ms: int = 0) -> RequestLog:
    """The ``accepted`` history entry of a land: the gateway writes it, and ``start``
    publishes the same one (same log id, same payload) in case the gateway could not."""
    return RequestLog(
        queue=msg.queue, request_id=msg.id, timestamp_ms=msg.received_at_ms or now_ms,
        type=LogType.STATUS, status="accepted", request_version=0,
        metadata={"actor": msg.submitted_by} if msg.submitted_by else {},
        log_id=log_id(msg.id, "accepted"))
