"""Request and response bodies of the gateway's REST API (``/api/v1``), and the text
types every string from a client passes through before it reaches the database.

**Text from clients.** ``SafeLine`` (identifiers, change URIs, search terms, cursors,
keys) refuses control characters; ``SafeText`` (free text such as a cancel or admin
reason) allows tab, newline and carriage return and refuses the other control
characters. Both refuse lone surrogates (``\\ud800``: not encodable as UTF-8, so no
database can store them) and NUL (PostgreSQL text columns reject it). A refused
string is a 422 ``invalid_request`` naming the field, before anything is written.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.domain.entities import RequestLog, RequestSummary
from app.domain.states import LandStrategy, LogType, Priority
from app.domain.text import check_line, check_text
from app.views.stages import landed_commits

SafeText = Annotated[str, BeforeValidator(check_text)]
SafeLine = Annotated[str, BeforeValidator(check_line)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


LAND_URI = ("git://demo.example.com/demo/refs%2Fheads%2Ffix-login/"
            "eff1965577a12efafdad1d05394297d224362c79?sq-files=src/auth/login.py")


class LandBody(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"change_uris": [LAND_URI]},
        {"change_uris": ["git://sandbox.local/sandbox/refs%2Fheads%2Fstack-1/"
                         "9f1c2e4a6b8d0f1e3c5a7b9d1f3e5c7a9b1d3f5e",
                         "git://sandbox.local/sandbox/refs%2Fheads%2Fstack-2/"
                         "2b4d6f8a0c1e3a5c7e9b1d3f5a7c9e1b3d5f7a9c"],
         "strategy": "squash_rebase"},
    ]})

    change_uris: list[SafeLine] = Field(
        min_length=1,
        description="The ordered stack of change URIs to land together (first = bottom).",
    )
    strategy: LandStrategy | None = Field(
        default=None, description="How to land; null uses the queue's default strategy."
    )
    priority: Priority = Field(
        default=Priority.NORMAL,
        description="normal, high or hotfix: a batch goes ahead of every conflicting batch "
                    "of a lower priority that is not yet merging (docs/pipeline.md). hotfix "
                    "needs the admin token or an actor on the queue's hotfix_allowed list.")


class CancelBody(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"reason": "superseded by demo/3"}]})

    reason: SafeText = Field(default="", max_length=1000, description="Why, for the history.")


class LandAccepted(BaseModel):
    sqid: str
    queue: str
    status: str


class CancelAccepted(BaseModel):
    sqid: str
    status: str


class RequestSummaryOut(BaseModel):
    sqid: str
    queue: str
    change_uris: list[str]
    received_at_ms: int
    status: str
    last_error: str
    metadata: dict[str, Any]
    landed_commits: list[str] = Field(
        default_factory=list,
        description="Landed only: the target commit each change landed as, in order.")
    submitted_by: str = Field(
        default="", description="Who submitted it: the token's label, or 'anonymous' "
                                "(SQ_AUTH=open without a token); empty for requests "
                                "accepted before tokens existed.")
    priority: Priority = Field(default=Priority.NORMAL,
                               description="normal, high or hotfix, as accepted.")

    @classmethod
    def of(cls, s: RequestSummary) -> RequestSummaryOut:
        return cls(
            sqid=s.request_id, queue=s.queue, change_uris=list(s.change_uris),
            received_at_ms=s.received_at_ms, status=s.status, last_error=s.last_error,
            metadata=dict(s.metadata), landed_commits=landed_commits(s),
            submitted_by=s.submitted_by, priority=s.priority,
        )


class HistoryEventOut(BaseModel):
    timestamp_ms: int
    type: LogType
    status: str | None = None
    event: str | None = None
    last_error: str
    metadata: dict[str, Any]

    @classmethod
    def of(cls, e: RequestLog) -> HistoryEventOut:
        is_status = e.type is LogType.STATUS
        return cls(
            timestamp_ms=e.timestamp_ms, type=e.type,
            status=e.status if is_status else None, event=None if is_status else e.event,
            last_error=e.last_error, metadata=dict(e.metadata),
        )


class HistoryOut(BaseModel):
    sqid: str
    events: list[HistoryEventOut]


class ListOut(BaseModel):
    items: list[RequestSummaryOut]
    next_cursor: str | None = Field(
        default=None, description="Pass as ?cursor= with the same filters for the next page."
    )


class QueueOut(BaseModel):
    name: str
    description: str
    build_budget: int
    counts: dict[str, int] = Field(description="Visible requests by public status.")


class QueuesOut(BaseModel):
    items: list[QueueOut]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    """Every error answer: a stable ``code`` and a message a person can act on."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"error": {
        "code": "not_found",
        "message": "queue 'nope' is not configured (configured: demo, sandbox)"}}]})

    error: ErrorDetail
