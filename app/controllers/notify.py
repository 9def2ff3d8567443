"""Outbound notifications: a relay on the ``log`` topic and the ``notify`` stage that
POSTs each notification to its endpoint (``docs/notifications.md``; the pure rules and
bodies are ``app/domain/notifications.py``, the sink ``app/extensions/notify/``).

``NotifyRelayController`` is a second consumer group (``notify-relay``, a *tap* of the
stage registry) on ``log``, beside the gateway's projection: it reads the same entries
and writes no table. A terminal status entry is the fact it announces (the orchestrator
publishes it with, or after, the conditional write of that state), so the relay
reloads nothing.

| Loaded log entry | Relative to checkpoint | Action |
|---|---|---|
| not a ``LogMsg`` | invalid | ack with a warning: the gateway's own group dead-letters the same message (one poison, one dead letter) |
| an event entry, or a status that is not ``landed`` / ``error`` / ``cancelled`` | - | nothing to notify; ack |
| terminal, queue unknown or no endpoint subscribed to its event | - | ack |
| terminal, endpoints subscribed | before / at | publish one ``notify`` message per endpoint, id ``<log id>/<endpoint>``, in one queue operation: a redelivery (or a repaired terminal log, same log id) replays the same ids, stored once |

``NotifyController`` (group ``notifier``) sends one message:

| Loaded notification | Relative to checkpoint | Action |
|---|---|---|
| not a ``NotifyMsg`` | invalid | raise ``ValidationError`` (``notify_dlq``, parked) |
| its endpoint is no longer configured (queue or name) | superseded | log a warning; ack (nothing to send to) |
| endpoint configured, it answers 2xx | before | check the lease is held, POST the body (the same bytes on every attempt, signed anew); ack |
| endpoint configured, 408/429/5xx or unreachable | before | raise ``NotificationFailed`` (retryable): retried with the topic's backoff, then ``notify_dlq`` |
| endpoint configured, any other answer | before | raise ``NotificationFailed`` (permanent): ``notify_dlq`` at once |

There is no "at": the receiver's 2xx is the only checkpoint, and a receiver must treat a
repeated ``X-SubmitQueue-Delivery`` as the same notification (a lost 2xx sends it again).

Dead letters (``NotifyReconciler``, group ``notifier-dlq``, and ``LogDeadLetters``, the
``log_dlq`` reconciler of group ``gateway-dlq``):

| Dead letter | Action |
|---|---|
| a ``notify`` message (``notify_dlq``) | nothing to drive: raise ``NotificationGivenUp`` and the queue parks it ("notification given up"), visible on ``/admin`` and in ``GET /api/v1/admin/dlq`` until an operator requeues it (the same delivery id is sent again) or discards it |
| a ``log`` entry the ``notify-relay`` group gave up on (``source_group``; its publish kept failing) | relay it again with the same ids (``relayed``) |
| a ``log`` entry the ``github-check-relay`` group gave up on | relay it again with the same id (``app/controllers/github_check.py``) |
| a ``log`` entry of the gateway's group | ``LogReconciler`` (``app/controllers/dlq/reconcilers.py``) |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from app.controllers import github_check
from app.controllers.common import Deps, StageController, tapped_entry
from app.controllers.dlq.reconcilers import (
    LogReconciler,
    Outcome,
    Reconciler,
    Undecodable,
    failure_text,
)
from app.domain import messages as m
from app.domain import notifications as n
from app.domain.entities import RequestLog
from app.domain.errors import NotFound, NotificationGivenUp, ValidationError
from app.domain.states import LogType
from app.extensions.notify.webhook import WebhookSink
from app.queue import Delivery, StoredMessage

log = logging.getLogger("submitqueue.notify")


def _sinks(deps: Deps, queue: str) -> tuple[WebhookSink, ...]:
    try:
        return deps.extensions(queue).notify
    except NotFound:
        return ()


def wants(deps: Deps, payload: Any) -> bool:
    """The ``notify-relay`` group's publish-time filter (``Topology.filter``): a ``log``
    entry gets a delivery only if its queue has an endpoint that wants the notification
    it makes; the relay checks the same again when it runs."""
    if not isinstance(payload, dict):
        return True  # not a log entry: delivered, and the relay says so
    sinks = _sinks(deps, str(payload.get("queue", "")))
    if not sinks or payload.get("type") != LogType.STATUS.value \
            or payload.get("status") not in n.NOTIFYING_STATUSES:
        return False
    found = n.event_of(m.LogMsg.model_validate(payload).entry())
    return found is not None and any(n.wanted(s.events, found[0]) for s in sinks)


async def relay(deps: Deps, entry: RequestLog) -> int:
    """Publish ``entry``'s notifications (one per subscribed endpoint); how many."""
    items: list[tuple[str, m.NotifyMsg, str]] = []
    for sink in _sinks(deps, entry.queue):
        msg = n.message(entry, sink.name)
        if msg is not None and n.wanted(sink.events, msg.event):
            items.append((m.NOTIFY, msg, msg.delivery_id))
    await deps.publish_all(items)
    return len(items)


class NotifyRelayController(StageController):
    async def process(self, delivery: Delivery) -> None:
        entry = tapped_entry(delivery)
        if entry is None:
            return
        if n.event_of(entry) is None:
            return
        await relay(self.deps, entry)


class NotifyController(StageController):
    async def process(self, delivery: Delivery) -> None:
        try:
            msg = m.NotifyMsg.model_validate(delivery.payload)
        except PydanticValidationError as exc:
            raise ValidationError(f"notify message {delivery.message_id!r} is not a "
                                  f"notification: {exc}") from None
        sink = next((s for s in _sinks(self.deps, msg.queue) if s.name == msg.endpoint), None)
        if sink is None:
            log.warning("notification for an endpoint that is no longer configured; dropped",
                        extra={"queue": msg.queue, "endpoint": msg.endpoint,
                               "message_id": delivery.message_id})
            return
        body = n.body(msg, fmt=sink.format, public_url=sink.public_url)
        await delivery.ensure_held()
        code = await sink.send(delivery_id=msg.delivery_id, event=msg.event, body=body)
        log.info("notification delivered", extra={
            "queue": msg.queue, "sqid": msg.id, "endpoint": msg.endpoint,
            "message_id": delivery.message_id, "status_code": code,
            "attempt": delivery.attempt})


class NotifyReconciler(Reconciler):
    async def reconcile(self, msg: StoredMessage) -> Outcome:
        raise NotificationGivenUp(
            f"notification given up: {failure_text(msg)}; requeue it once the endpoint "
            "takes it (the same delivery id is sent again), or discard it")


class LogDeadLetters(LogReconciler):
    """``log_dlq`` with the relays' dead letters too: an entry the ``notify-relay`` or
    ``github-check-relay`` group gave up on (its publish kept failing) is relayed again,
    with the same message ids (``relayed``); every other dead letter is the gateway's
    (``LogReconciler``)."""

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps.db)
        self.deps = deps

    async def reconcile(self, msg: StoredMessage) -> Outcome:
        relays = {m.NOTIFY_RELAY_GROUP: relay, m.GITHUB_CHECK_RELAY_GROUP: github_check.relay}
        again = relays.get(msg.source_group or "")
        if again is None:
            return await super().reconcile(msg)
        try:
            entry = m.LogMsg.model_validate(msg.payload).entry()
        except (ValueError, PydanticValidationError) as exc:
            raise Undecodable(f"message {msg.seq} is not a log entry: {exc}") from None
        count = await again(self.deps, entry)
        return Outcome("relayed", entry.request_id, f"{count} notification(s)", bool(count))
