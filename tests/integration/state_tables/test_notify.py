"""``notify``'s state tables, row by row (app/controllers/notify.py): the relay on
``log``, the sender on ``notify``, and their dead letters.

The endpoints are recording sinks (the real sink, against a real HTTP receiver, is
``tests/unit/test_notify_sink.py`` and the e2e test ``tests/e2e/test_notifications.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from app.controllers import notify
from app.controllers.notify import NotifyController, NotifyRelayController
from app.domain import notifications as n
from app.domain.entities import RequestLog
from app.domain.errors import NotFound, NotificationFailed, NotificationGivenUp, ValidationError
from app.domain.messages import GITHUB_CHECK_RELAY_GROUP, NOTIFY_RELAY_GROUP, LogMsg
from app.speculation.core import NO_PATH_PASSED
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    Rig,
    Seed,
    StateTable,
    event_entry,
    run_case,
    status_entry,
)
from tests.support.dead_letters import DeadLetters, checks_on
from tests.support.tables import filter_test, table_tests

PUBLIC = "https://sq.example.com"
LANDED = status_entry(1, "landed", request_version=5, metadata={"batch_id": "demo/batch/1",
                                                                  "commits": ["a" * 40]})
FAILED = status_entry(1, "error", request_version=5, last_error=f"x: {NO_PATH_PASSED}")
DEAD = status_entry(1, "error", request_version=5,
                    last_error="dead-lettered from build after 10 attempts: boom")


class Sink:
    """A recording endpoint: what it was sent, answering ``answer`` (a code or an error)."""

    def __init__(self, name: str, events: tuple[str, ...] = n.EVENTS, *, fmt: str = "json",
                 answer: int | BaseException = 200) -> None:
        self.name, self.events, self.format = name, frozenset(events), fmt
        self.public_url = PUBLIC
        self.answer = answer
        self.sent: list[tuple[str, str, bytes]] = []

    async def send(self, *, delivery_id: str, event: str, body: bytes) -> int:
        self.sent.append((delivery_id, event, body))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


    def fresh(self) -> Sink:
        return Sink(self.name, tuple(sorted(self.events)), fmt=self.format, answer=self.answer)


def sinks(*endpoints: Sink) -> Seed:
    """The queue's endpoints: fresh copies per case run (each records its own sends)."""
    async def seed(rig: Rig) -> None:
        rig.configure(notify=tuple(e.fresh() for e in endpoints))
    return seed


async def unknown_queue(rig: Rig) -> None:
    def missing(queue: str) -> Any:
        raise NotFound(f"queue {queue!r} is not configured")
    rig.deps.extensions = missing


def log(entry: RequestLog, **changes: Any) -> dict[str, Any]:
    return {**LogMsg.of(entry).model_dump(mode="json"), **changes}


def note(entry: RequestLog, endpoint: str) -> dict[str, Any]:
    msg = n.message(entry, endpoint)
    assert msg is not None
    return msg.model_dump(mode="json")


def sent(index: int, *expected: tuple[str, str, RequestLog, str]) -> Any:
    """Endpoint ``index`` of the rig was sent exactly ``expected``: (delivery id, event,
    entry, format) each, with the bytes the pure body builder makes."""
    async def check(rig: Rig) -> None:
        sink = rig.ext.notify[index]
        want = []
        for delivery_id, event, entry, fmt in expected:
            msg = n.message(entry, sink.name)
            assert msg is not None
            want.append((delivery_id, event, n.body(msg, fmt=fmt, public_url=PUBLIC)))
        assert sink.sent == want  # type: ignore[attr-defined]
    return check


# --- the relay -----------------------------------------------------------------------

def team_and_chat() -> Seed:
    return sinks(Sink("team", ("landed",)), Sink("chat", ("removed",), fmt="slack"),
                 Sink("ops", ("needs_operator",)))


RELAY = StateTable(notify, [
    Case("not a ``LogMsg``", team_and_chat(), {"queue": "demo"}, name="fields-missing",
         published=[], writes_nothing=True),
    Case("an event entry, or a status that is not ``landed`` / ``error`` / ``cancelled``",
         team_and_chat(), log(event_entry(1, "building", occurrence="b-1")), name="event",
         published=[]),
    *[Case("an event entry, or a status that is not ``landed`` / ``error`` / ``cancelled``",
           team_and_chat(), log(status_entry(1, st)), name=st, published=[])
      for st in ("accepted", "started", "speculating", "cancelling")],
    Case("terminal, queue unknown or no endpoint subscribed to its event", unknown_queue,
         log(LANDED), name="queue-unknown", published=[]),
    Case("terminal, queue unknown or no endpoint subscribed to its event", sinks(),
         log(LANDED), name="no-endpoints", published=[]),
    Case("terminal, queue unknown or no endpoint subscribed to its event",
         sinks(Sink("team", ("landed",))), log(FAILED), name="not-subscribed", published=[]),
    Case("terminal, endpoints subscribed", team_and_chat(), log(LANDED), name="landed",
         published=[("notify", "demo/team", "demo/1/landed/team")]),
    Case("terminal, endpoints subscribed", team_and_chat(), log(FAILED), name="removed",
         published=[("notify", "demo/chat", "demo/1/error/chat")]),
    Case("terminal, endpoints subscribed", team_and_chat(), log(DEAD), name="needs-operator",
         published=[("notify", "demo/chat", "demo/1/error/chat"),
                    ("notify", "demo/ops", "demo/1/error/ops")]),
    Case("terminal, endpoints subscribed", team_and_chat(),
         log(status_entry(1, "cancelled", request_version=3)), name="cancelled",
         published=[("notify", "demo/chat", "demo/1/cancelled/chat")]),
], headers=["Loaded log entry"])

@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_relay_acks_a_message_that_is_not_json(rig: Rig) -> None:
    """(``run_redelivery`` re-sends the decoded payload, so this row is run alone.)"""
    case = Case("not a ``LogMsg``", team_and_chat(), None, name="not-json",
                delivery={"payload_json": "]"}, published=[], writes_nothing=True)
    await run_case(rig, NotifyRelayController(rig.deps), "log", case)


(test_relay_row, test_relay_crash_before_publishing_is_repaired,
 test_relay_duplicate_delivery_writes_nothing) = table_tests(RELAY, NotifyRelayController, "log")

test_the_relay_groups_filter_delivers_what_it_relays_only = filter_test(RELAY, notify.wants)


# --- the sender ----------------------------------------------------------------------

SENDER = StateTable(notify, [
    Case("not a ``NotifyMsg``", sinks(Sink("team")), {"id": "demo/1"}, name="fields-missing",
         raises=ValidationError),
    Case("not a ``NotifyMsg``", sinks(Sink("team")), {**note(LANDED, "team"), "event": "x"},
         name="unknown-event", raises=ValidationError),
    Case("its endpoint is no longer configured (queue or name)", sinks(Sink("other")),
         note(LANDED, "team"), name="renamed", published=[], check=sent(0)),
    Case("its endpoint is no longer configured (queue or name)", unknown_queue,
         note(LANDED, "team"), name="queue-gone", published=[]),
    Case("endpoint configured, it answers 2xx", sinks(Sink("team")), note(LANDED, "team"),
         name="json", published=[],
         check=sent(0, ("demo/1/landed/team", "landed", LANDED, "json"))),
    Case("endpoint configured, it answers 2xx", sinks(Sink("x"), Sink("chat", fmt="slack",
                                                                      answer=204)),
         note(DEAD, "chat"), name="slack", published=[],
         check=sent(1, ("demo/1/error/chat", "needs_operator", DEAD, "slack"))),
    Case("endpoint configured, 408/429/5xx or unreachable",
         sinks(Sink("team", answer=NotificationFailed("503", retryable=True))),
         note(LANDED, "team"), raises=NotificationFailed, name="retryable"),
    Case("endpoint configured, any other answer",
         sinks(Sink("team", answer=NotificationFailed("410", retryable=False))),
         note(LANDED, "team"), raises=NotificationFailed, name="permanent"),
], headers=["Loaded notification"])


def lease_checked(rig: Rig, case: Case, delivery: Any) -> None:
    """The lease is checked right before a POST, never when nothing is sent."""
    posts = sum(len(s.sent) for s in rig.ext.notify)  # type: ignore[attr-defined]
    assert delivery.lease_checks == posts


# the sender publishes nothing, so it has no crash points: no crash test is bound
test_sender_row, _, test_sender_duplicate_delivery_writes_nothing = table_tests(
    SENDER, NotifyController, "notify", after=lease_checked)


# --- dead letters --------------------------------------------------------------------

async def with_checks(rig: Rig) -> None:
    checks_on(rig)


def dead(topic: str, group: str = "") -> dict[str, Any]:
    return {"failure": {"original_topic": topic, "failure_count": 10, "last_error": "boom",
                        "failure_detail": {"retryable": True, "group": group},
                        "failed_at_ms": NOW_MS - 1000}}


DLQ = StateTable(notify, [
    Case("a ``notify`` message (``notify_dlq``)", sinks(Sink("team")), note(LANDED, "team"),
         delivery=dead("notify"), raises=NotificationGivenUp, published=[], check=sent(0)),
    Case("a ``log`` entry the ``notify-relay`` group gave up on (``source_group``; its "
         "publish kept failing)", team_and_chat(), log(LANDED),
         delivery=dead("log", NOTIFY_RELAY_GROUP), returns=("relayed", "demo/1", True),
         published=[("notify", "demo/team", "demo/1/landed/team")]),
    Case("a ``log`` entry the ``github-check-relay`` group gave up on", with_checks, log(LANDED),
         delivery=dead("log", GITHUB_CHECK_RELAY_GROUP), returns=("relayed", "demo/1", True),
         published=[("github_check", "demo/1", f"{LANDED.log_id}/github-check")]),
    Case("a ``log`` entry of the gateway's group", lambda rig: rig.summary(1), log(LANDED),
         delivery=dead("log", "gateway-log"), returns=("persisted", "demo/1", True),
         published=[]),
], headers=["Dead letter"])

(test_dead_letter_row, test_dead_letter_crash_before_publishing_is_repaired,
 test_dead_letter_duplicate_delivery_writes_nothing) = table_tests(DLQ, DeadLetters, "dlq")


def test_every_documented_row_has_a_case() -> None:
    for table in (RELAY, SENDER, DLQ):
        assert table.missing() == [] and table.unknown() == [], table.headers
    assert [len(t.rows()) for t in (RELAY, SENDER, DLQ)] == [4, 5, 4]
