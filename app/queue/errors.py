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
    """This delivery's lease is no longer held: its receipt token is stale.

    The lease lapsed and another consumer claimed the message, a restart of this
    member took its claims back, or an operator discarded the message. The holder must
    not act on the message any more (no push, no trigger). The consumer framework
    discards the outcome of a handler whose lease was lost without settling anything
    (no attempt is counted, nothing is retried or dead-lettered): the successor owns
    the message. ``retryable`` only matters outside the framework.
    """

    retryable = True


class MessageNotFound(QueueError):
    """No message with that id exists in that topic (it may have been collected)."""


class NotDeadLettered(QueueError):
    """Requeue was asked for a message that is not in a dead-letter topic."""
