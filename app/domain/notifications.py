"""Outbound notifications (pure): which request-log entries are notifiable, and the
bodies sent for them (``docs/notifications.md``).

| Log entry (``type: status``) | Event | Reason |
|---|---|---|
| ``landed`` | ``landed`` | - |
| ``error`` / ``cancelled``, reason ``dead_lettered`` | ``needs_operator`` (a removal whose stage kept failing: its dead letter is on ``/admin``) | ``dead_lettered`` |
| ``error`` / ``cancelled``, any other reason | ``removed`` | ``removals.classify`` (None: no word fits; the error text says it) |
| any other status, any event entry | not notifiable | - |

An endpoint subscribed to ``removed`` also gets ``needs_operator`` (it is a removal);
one subscribed only to ``needs_operator`` gets just those.

Bodies are a function of the :class:`NotifyMsg` alone (no clock), so every attempt of
one delivery sends the same bytes: ``json`` (:func:`json_body`) or Slack-compatible
``{"text", "blocks"}`` (:func:`slack_body`).
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Literal

from app.domain.entities import RequestLog
from app.domain.messages import NotifyMsg
from app.domain.removals import WORDS, RemovalReason, classify
from app.domain.states import LogType

Event = Literal["landed", "removed", "needs_operator"]
EVENTS: tuple[Event, ...] = ("landed", "removed", "needs_operator")
SCHEMA = "submitqueue.notification/v1"
_ERROR_CHARS = 500


#: the statuses that make a notification (``event_of``)
NOTIFYING_STATUSES = frozenset({"landed", "error", "cancelled"})


def event_of(entry: RequestLog) -> tuple[Event, RemovalReason | None] | None:
    """The notification a log entry makes, or None if it makes none."""
    if entry.type is not LogType.STATUS:
        return None
    if entry.status == "landed":
        return "landed", None
    if entry.status not in NOTIFYING_STATUSES:
        return None
    reason = classify(entry.status, entry.last_error)
    return ("needs_operator" if reason is RemovalReason.DEAD_LETTERED else "removed"), reason


def wanted(events: Collection[str], event: str) -> bool:
    """Whether an endpoint subscribed to ``events`` gets ``event``."""
    return event in events or (event == "needs_operator" and "removed" in events)


def message(entry: RequestLog, endpoint: str) -> NotifyMsg | None:
    """The ``notify`` message of ``entry`` for ``endpoint`` (None: not notifiable)."""
    found = event_of(entry)
    if found is None:
        return None
    event, reason = found
    commits = entry.metadata.get("commits")
    return NotifyMsg(
        id=entry.request_id, queue=entry.queue, endpoint=endpoint,
        log_id=entry.log_id, event=event, status=entry.status,
        reason=reason.value if reason else None, last_error=entry.last_error[:2000],
        timestamp_ms=entry.timestamp_ms, batch_id=str(entry.metadata.get("batch_id") or ""),
        commits=[str(c) for c in commits] if isinstance(commits, list) else [])


def page_url(public_url: str, sqid: str) -> str:
    """The request's page: ``<public url>/queues/<queue>/requests/<n>``."""
    queue, _, number = sqid.rpartition("/")
    return f"{public_url.rstrip('/')}/queues/{queue}/requests/{number}"


def reason_words(msg: NotifyMsg) -> str:
    """The reason in words (``""`` for a landing)."""
    if msg.event == "landed":
        return ""
    if msg.reason and msg.reason in RemovalReason.__members__.values():
        return WORDS[RemovalReason(msg.reason)]
    return "error"


def summary(msg: NotifyMsg) -> str:
    """One line: ``demo/1 landed in demo (commit 1a2b3c4)``."""
    if msg.event == "landed":
        shas = [c[:12] for c in msg.commits if c]
        landed_as = f" (commit{'s' if len(shas) > 1 else ''} {', '.join(shas)})" if shas else ""
        return f"{msg.id} landed in {msg.queue}{landed_as}"
    words = reason_words(msg)
    if msg.event == "needs_operator":
        return f"{msg.id} needs an operator: it was removed from {msg.queue}, {words}"
    return f"{msg.id} was removed from {msg.queue}: {words}"


def json_body(msg: NotifyMsg, *, public_url: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "delivery_id": msg.delivery_id,
        "event": msg.event,
        "queue": msg.queue,
        "sqid": msg.id,
        "status": msg.status,
        "reason": msg.reason,
        "reason_text": reason_words(msg),
        "needs_operator": msg.event == "needs_operator",
        "text": summary(msg),
        "url": page_url(public_url, msg.id),
        "at_ms": msg.timestamp_ms,
        "batch_id": msg.batch_id or None,
        "commits": list(msg.commits),
        "last_error": msg.last_error[:_ERROR_CHARS],
    }


def _mrkdwn(text: str) -> str:
    """Slack's three control characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(msg: NotifyMsg, *, public_url: str) -> dict[str, Any]:
    """A Slack incoming-webhook payload (also read by Mattermost, Rocket.Chat, ...)."""
    url = page_url(public_url, msg.id)
    line = _mrkdwn(summary(msg)).replace(msg.id, f"<{url}|{msg.id}>", 1)
    context = [f"queue *{_mrkdwn(msg.queue)}*", f"status `{msg.status}`"]
    if msg.reason:
        context.append(f"reason `{msg.reason}`")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": line}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]},
    ]
    if msg.event != "landed" and msg.last_error:
        blocks.insert(1, {"type": "section", "text": {
            "type": "mrkdwn", "text": f"```{_mrkdwn(msg.last_error[:_ERROR_CHARS])}```"}})
    return {"text": summary(msg) + f" <{url}>", "blocks": blocks}


def body(msg: NotifyMsg, *, fmt: str, public_url: str) -> bytes:
    """The exact bytes POSTed (and signed) for ``msg`` in format ``fmt``."""
    doc = slack_body(msg, public_url=public_url) if fmt == "slack" else \
        json_body(msg, public_url=public_url)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
