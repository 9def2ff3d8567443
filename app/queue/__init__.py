"""A durable, at-least-once message queue stored in SQL (SQLite or PostgreSQL).

General purpose: nothing here knows about merge queues. See ``ARCHITECTURE.md`` §3
and ``docs/queue.md`` for the semantics.
"""

from app.queue.backends import Backend, PostgresBackend, SqliteBackend, backend_for_url
from app.queue.broker import Broker, Outgoing, Staged, now_ms
from app.queue.classify import NonRetryable, Retryable, classify
from app.queue.consumer import (
    Chaos,
    ChaosFailure,
    Consumer,
    ConsumerService,
    ConsumerSpec,
    Controller,
)
from app.queue.delivery import Delivery, LeaseExpired
from app.queue.errors import (
    InvalidPayload,
    LeaseLost,
    MessageNotFound,
    NotDeadLettered,
    PayloadTooLarge,
    QueueBusy,
    QueueError,
    UnknownTopic,
)
from app.queue.records import (
    ClaimedDelivery,
    GroupStats,
    PublishResult,
    StoredMessage,
    TopicStats,
    Trouble,
)
from app.queue.topology import DLQ_SUFFIX, Backoff, TopicSpec, Topology

__all__ = [
    "DLQ_SUFFIX",
    "Backend",
    "Backoff",
    "Broker",
    "Chaos",
    "ChaosFailure",
    "ClaimedDelivery",
    "Consumer",
    "ConsumerService",
    "ConsumerSpec",
    "Controller",
    "Delivery",
    "GroupStats",
    "InvalidPayload",
    "LeaseExpired",
    "LeaseLost",
    "MessageNotFound",
    "NonRetryable",
    "NotDeadLettered",
    "Outgoing",
    "PayloadTooLarge",
    "PostgresBackend",
    "PublishResult",
    "QueueBusy",
    "QueueError",
    "Retryable",
    "SqliteBackend",
    "Staged",
    "StoredMessage",
    "TopicSpec",
    "TopicStats",
    "Topology",
    "Trouble",
    "UnknownTopic",
    "backend_for_url",
    "classify",
    "now_ms",
]
