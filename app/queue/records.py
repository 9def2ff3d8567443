"""Plain records the queue hands out: stored messages, claimed deliveries, stats."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One row of ``queue_messages``; ``seq`` is its global, stable number."""

    seq: int
    topic: str
    partition_key: str
    message_id: str
    payload_json: str
    metadata: dict[str, Any]
    published_at_ms: int
    source_group: str = ""
    settled_at_ms: int | None = None
    parked: bool = False
    original_topic: str | None = None
    failed_at_ms: int | None = None
    failure_count: int | None = None
    last_error: str | None = None
    failure_detail: dict[str, Any] | None = None

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredMessage:
        detail = row.get("failure_detail")
        return cls(
            seq=int(row["seq"]),
            topic=row["topic"],
            partition_key=row["partition_key"],
            message_id=row["message_id"],
            payload_json=row["payload"],
            metadata=json.loads(row["metadata"] or "{}"),
            published_at_ms=int(row["published_at_ms"]),
            source_group=row.get("source_group") or "",
            settled_at_ms=row.get("settled_at_ms"),
            parked=bool(row.get("parked") or 0),
            original_topic=row.get("original_topic"),
            failed_at_ms=row.get("failed_at_ms"),
            failure_count=row.get("failure_count"),
            last_error=row.get("last_error"),
            failure_detail=json.loads(detail) if detail else None,
        )


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A message leased to one consumer of one group."""

    delivery_id: int
    consumer_group: str
    lease_token: str
    lease_until_ms: int
    attempt: int
    message: StoredMessage


@dataclass(frozen=True, slots=True)
class PublishResult:
    seq: int | None
    created: bool


@dataclass(slots=True)
class GroupStats:
    topic: str
    consumer_group: str
    depth: int = 0
    in_flight: int = 0
    held: int = 0
    retrying: int = 0
    oldest_age_ms: int | None = None
    paused: bool = False
    paused_partitions: list[str] = field(default_factory=list)


@dataclass(slots=True)
class TopicStats:
    topic: str
    serial: bool
    is_dlq: bool
    groups: list[GroupStats]
    dlq_topic: str | None
    dlq_size: int = 0
    dlq_parked: int = 0
    parked: int = 0


@dataclass(frozen=True, slots=True)
class Trouble:
    """A message that failed at least once and is not settled (``Broker.troubles``).

    ``state``: ``retrying`` (a delivery of ``topic`` waits for, or runs, another attempt)
    or ``dead_lettered`` (it moved to ``dlq_topic``). ``attempts``: attempts made so far
    (a running one included); ``max_attempts``: the topic's budget. ``parked``: nobody
    will consume it until an operator requeues or discards it; ``reconciler_paused``: its
    dead-letter consumer is paused, so it waits for an operator too.
    """

    seq: int
    topic: str
    partition_key: str
    payload: Any
    state: str
    attempts: int
    max_attempts: int | None
    last_error: str
    next_attempt_ms: int | None = None
    running: bool = False
    dlq_topic: str | None = None
    failed_at_ms: int | None = None
    parked: bool = False
    reconciler_paused: bool = False

    @property
    def needs_operator(self) -> bool:
        return self.parked or self.reconciler_paused
