"""The ``SubmitQueue`` check-run of GitHub queues: a relay on the ``log`` topic and the
``github_check`` stage that writes it (docs/github.md; the content is
``app/domain/checkrun.py``, the GitHub side ``app/extensions/github/checkrun.py``).

``GitHubCheckRelayController`` is a consumer group of its own (``github-check-relay``,
a *tap*) on ``log``, beside the gateway's projection and the notify relay. It writes no
table and reloads nothing:

| Loaded log entry | Relative to checkpoint | Action |
|---|---|---|
| not a ``LogMsg`` | invalid | ack with a warning: the gateway's own group dead-letters the same message |
| its queue is unknown or writes no check-run (no ``github:`` block, or ``check_run: false``) | - | ack |
| an event entry other than ``building`` / ``built`` (planner detail) | - | ack: the check-run shows builds and statuses |
| a status entry, or ``building`` / ``built`` | before / at | publish one ``github_check`` message, id ``<log id>/github-check``: a redelivery replays the same id, stored once |

``GitHubCheckController`` (group ``github-checks``, serial per sqid so two updates of
one request never race to create its check-run) writes the request's *current* state,
read as the request page reads it (``Deps.check_facts``), never the state the message
names: a late or replayed message writes the newest state again, so the order in which
messages are processed cannot leave an old state showing.

| Loaded message | Relative to checkpoint | Action |
|---|---|---|
| not a ``GitHubCheckMsg`` | invalid | raise ``ValidationError`` (``github_check_dlq``, parked) |
| queue unknown or no longer writes check-runs, or no facts source (a process without the views) | superseded | log; ack |
| the request is not in the request log yet, or the log does not hold ``log_id`` yet (the gateway's projection is behind the relay) | before | raise ``ProjectionBehind`` (retryable): tried again with the topic's backoff |
| facts hold ``log_id`` | before / at | check the lease is held; write the check-run of each pull request head (create, or update the one whose ``external_id`` is the sqid); ack. GitHub unavailable: ``GitHubUnavailable`` (retryable), then ``github_check_dlq`` |

Dead letters (``GitHubCheckReconciler``, group ``github-checks-dlq``):

| Dead letter | Action |
|---|---|
| a ``github_check`` message | write the current state once more (``rewritten``); if GitHub still refuses, raise ``CheckRunGivenUp``: the queue parks it, visible on ``/admin`` until an operator requeues or discards it |
| a ``log`` entry the ``github-check-relay`` group gave up on | ``LogDeadLetters`` relays it again with the same id |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from app.controllers.common import Deps, StageController, tapped_entry
from app.controllers.dlq.reconcilers import Outcome, Reconciler, failure_text
from app.domain import messages as m
from app.domain.entities import RequestLog
from app.domain.errors import CheckRunGivenUp, NotFound, ValidationError
from app.domain.states import LogType
from app.extensions.base import CheckPublisher
from app.queue import Delivery, StoredMessage

log = logging.getLogger("submitqueue.github_check")

#: event entries that change what the check-run shows (builds starting and ending)
RELAYED_EVENTS = frozenset({"building", "built"})


class ProjectionBehind(Exception):
    """The request log does not show the entry yet: try again shortly."""

    retryable = True


def _publisher(deps: Deps, queue: str) -> CheckPublisher | None:
    try:
        return deps.extensions(queue).github_check
    except NotFound:
        return None


def wants(deps: Deps, payload: Any) -> bool:
    """The ``github-check-relay`` group's publish-time filter (``Topology.filter``): a
    ``log`` entry gets a delivery only on a queue that writes check-runs, and an event
    only if it is one the check-run shows; the relay checks the same again."""
    if not isinstance(payload, dict):
        return True  # not a log entry: delivered, and the relay says so
    if _publisher(deps, str(payload.get("queue", ""))) is None:
        return False
    return payload.get("type") != LogType.EVENT.value or payload.get("event") in RELAYED_EVENTS


async def relay(deps: Deps, entry: RequestLog) -> int:
    """Publish ``entry``'s ``github_check`` message if it changes a check-run; how many."""
    if _publisher(deps, entry.queue) is None:
        return 0
    if entry.type is LogType.EVENT and entry.event not in RELAYED_EVENTS:
        return 0
    msg = m.GitHubCheckMsg(id=entry.request_id, queue=entry.queue, log_id=entry.log_id,
                           timestamp_ms=entry.timestamp_ms)
    await deps.publish_all([(m.GITHUB_CHECK, msg, msg.message_id)])
    return 1


async def write(deps: Deps, msg: m.GitHubCheckMsg, delivery: Delivery | None) -> int | None:
    """Write ``msg``'s request's check-runs from its current state: how many heads
    (None: nothing to write to any more)."""
    publisher = _publisher(deps, msg.queue)
    if publisher is None or deps.check_facts is None:
        log.info("check-run update with nothing to write to; dropped",
                 extra={"queue": msg.queue, "sqid": msg.id})
        return None
    facts = await deps.check_facts(msg.queue, msg.id, msg.log_id)
    if facts is None:
        raise ProjectionBehind(f"the request log does not show {msg.log_id} of {msg.id} yet; "
                               "its check-run is written once it does")
    if delivery is not None:
        await delivery.ensure_held()
    return await publisher.publish(facts)


class GitHubCheckRelayController(StageController):
    async def process(self, delivery: Delivery) -> None:
        entry = tapped_entry(delivery)
        if entry is None:
            return
        await relay(self.deps, entry)


def _decode(payload: object, what: str) -> m.GitHubCheckMsg:
    try:
        return m.GitHubCheckMsg.model_validate(payload)
    except PydanticValidationError as exc:
        raise ValidationError(f"github_check message {what!r} is not a check-run update: "
                              f"{exc}") from None


class GitHubCheckController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = _decode(delivery.payload, delivery.message_id)
        heads = await write(self.deps, msg, delivery)
        if heads is not None:
            log.info("check-run written", extra={
                "queue": msg.queue, "sqid": msg.id, "log_id": msg.log_id, "heads": heads,
                "message_id": delivery.message_id, "attempt": delivery.attempt})


class GitHubCheckReconciler(Reconciler):
    async def reconcile(self, msg: StoredMessage) -> Outcome:
        update = _decode(msg.payload, str(msg.seq))
        try:
            heads = await write(self.deps, update, None)
        except Exception as exc:
            raise CheckRunGivenUp(
                f"check-run update given up: {failure_text(msg)}; once more: {exc}; requeue "
                "it once GitHub takes it (the request's current state is written), or "
                "discard it") from exc
        return Outcome("rewritten", update.id, f"{heads or 0} check-run(s)", bool(heads))
