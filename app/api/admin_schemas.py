"""Response bodies of the admin API (``app/api/admin.py``); the OpenAPI schema shows
them, and the routes return exactly these."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


def _absent_if_none(value: object) -> bool:
    return value is None


class GroupStatsOut(BaseModel):
    group: str
    depth: int
    in_flight: int
    held: int
    retrying: int
    oldest_age_ms: int | None
    paused: bool
    paused_partitions: list[str]


class TopicStatsOut(BaseModel):
    topic: str
    serial: bool
    is_dlq: bool
    dlq_topic: str | None
    dlq_size: int
    dlq_parked: int
    parked: int
    groups: list[GroupStatsOut]


class TopicsOut(BaseModel):
    topics: list[TopicStatsOut]


class DlqConsumerOut(BaseModel):
    group: str
    paused: bool
    depth: int


class DlqTopicOut(BaseModel):
    topic: str
    original_topic: str
    size: int
    parked: int
    consumers: list[DlqConsumerOut]


class DlqTopicsOut(BaseModel):
    topics: list[DlqTopicOut]


class DeadLetterOut(BaseModel):
    id: int = Field(description="The queue's sequence number: the id drain takes.")
    message_id: str
    partition_key: str
    payload: Any = Field(description="The message's JSON payload (or its raw text).")
    original_topic: str | None
    attempts: int
    last_error: str | None
    failed_at_ms: int | None
    failure_detail: dict[str, Any] | None
    source_group: str | None
    parked: bool
    settled: bool
    entity_id: str | None = Field(description="The request or batch it names, if decodable.")


class DeadLettersOut(BaseModel):
    items: list[DeadLetterOut]
    next_cursor: str | None


class OutcomeOut(BaseModel):
    action: str
    entity: str
    detail: str
    changed: bool


DrainResult = Literal["not_found", "discarded", "already_settled", "requeued", "failed",
                      "undecodable", "reconciled"]


class DrainItemOut(BaseModel):
    """One message's result; ``error``, ``to`` and ``outcome`` appear only when set."""

    id: int
    result: DrainResult
    error: str | None = Field(default=None, exclude_if=_absent_if_none)
    to: str | None = Field(default=None, exclude_if=_absent_if_none,
                           description="requeued: the topic it went back to")
    outcome: OutcomeOut | None = Field(default=None, exclude_if=_absent_if_none,
                                       description="reconciled: what the reconciler did")


class DrainOut(BaseModel):
    topic: str
    mode: Literal["reconcile", "requeue", "discard"]
    results: list[DrainItemOut]
    counts: dict[str, int]
    next_cursor: str | None
    audit_id: int


class PauseOut(BaseModel):
    topic: str
    group: str
    partition_key: str | None
    paused: bool
    changed: bool


class AuditEntryOut(BaseModel):
    id: int
    at_ms: int
    actor: str
    action: str
    topic: str
    message_ids: list[Any]
    reason: str
    result: dict[str, Any]


class AuditOut(BaseModel):
    items: list[AuditEntryOut]
    next_cursor: str | None
