"""Errors raised by the durable queue.

``QueueError`` is the root. Errors raised at publish time (``UnknownTopic``,
``InvalidPayload``, ``PayloadTooLarge``) mean nothing was stored.
"""

from __future__ import annotations


class QueueError(Exception):
    """Base class of every error the queue raises itself."""


class UnknownTopic(QueueError):
    """The topic was never declared in the topology."""


class InvalidPayload(QueueError):
    """The payload or metadata cannot be encoded as JSON, or a key is malformed."""


class PayloadTooLarge(QueueError):
    """The encoded payload exceeds the configured cap."""


class QueueBusy(QueueError):
    """The SQLite write lock stayed taken past the backend's bound; the operation was not
    run (nothing was stored). Retryable."""

    retryable = True


class LeaseLost(QueueError):
    """The delivery's lease expired and another consumer may hold the message now."""


class MessageNotFound(QueueError):
    """No message with that id exists in that topic (it may have been collected)."""


class NotDeadLettered(QueueError):
    """Requeue was asked for a message that is not in a dead-letter topic."""
