"""``github_check``'s state tables, row by row (app/controllers/github_check.py): the
relay on ``log``, the check-run writer on ``github_check``, and their dead letters.

The publisher is a recorder (``tests/support/dead_letters.py``); the real one against
the fake GitHub is ``tests/integration/test_github_checkrun.py`` and, end to end,
``tests/e2e/test_github_queue.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.controllers import github_check
from app.controllers.github_check import (
    GitHubCheckController,
    GitHubCheckRelayController,
    ProjectionBehind,
)
from app.domain.checkrun import CheckFacts
from app.domain.entities import RequestLog
from app.domain.errors import CheckRunGivenUp, NotFound, ValidationError
from app.domain.messages import GitHubCheckMsg, LogMsg
from app.extensions.github.client import GitHubUnavailable
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    Rig,
    StateTable,
    event_entry,
    run_case,
    status_entry,
)
from tests.support.dead_letters import DeadLetters, checks_on
from tests.support.tables import filter_test, table_tests

ACCEPTED = status_entry(1, "accepted")
LANDED = status_entry(1, "landed", request_version=5)
BUILDING = event_entry(1, "building", occurrence="b-1")


def mid(entry: RequestLog) -> str:
    return f"{entry.log_id}/github-check"


def facts(status: str = "landed") -> CheckFacts:
    return CheckFacts(sqid="demo/1", queue="demo", status=status, stage="landed",
                      page_url="https://sq.example.com/queues/demo/requests/1",
                      change_uris=("github://github.com/acme/w/pull/1/" + "a" * 40,))


def checks(*, shows: str | None = LANDED.log_id, answer: BaseException | None = None,
           source: bool = True) -> Any:
    """The queue writes check-runs; the request log shows entries up to ``shows``
    (None: not yet); ``answer`` is what GitHub does; ``source``: the process has views."""
    async def seed(rig: Rig) -> None:
        checks_on(rig, answer)

        async def current(queue: str, sqid: str, log_id: str) -> CheckFacts | None:
            assert (queue, sqid) == ("demo", "demo/1")
            return facts() if shows is not None and log_id <= shows else None

        rig.deps.check_facts = current if source else None
    return seed


async def no_checks(rig: Rig) -> None:
    rig.configure(github_check=None)


async def unknown_queue(rig: Rig) -> None:
    def missing(queue: str) -> Any:
        raise NotFound(f"queue {queue!r} is not configured")
    rig.deps.extensions = missing


def log(entry: RequestLog) -> dict[str, Any]:
    return LogMsg.of(entry).model_dump(mode="json")


def update(entry: RequestLog) -> dict[str, Any]:
    return GitHubCheckMsg(id=entry.request_id, queue=entry.queue, log_id=entry.log_id,
                          timestamp_ms=entry.timestamp_ms).model_dump(mode="json")


def written(count: int) -> Any:
    async def check(rig: Rig) -> None:
        assert len(rig.ext.github_check.written) == count  # type: ignore[union-attr]
    return check


# --- the relay -----------------------------------------------------------------------

RELAY = StateTable(github_check, [
    Case("not a ``LogMsg``", checks(), {"queue": "demo"}, name="fields-missing",
         published=[], writes_nothing=True),
    Case("its queue is unknown or writes no check-run (no ``github:`` block, or "
         "``check_run: false``)", unknown_queue, log(LANDED), name="unknown", published=[]),
    Case("its queue is unknown or writes no check-run (no ``github:`` block, or "
         "``check_run: false``)", no_checks, log(LANDED), name="off", published=[]),
    Case("an event entry other than ``building`` / ``built`` (planner detail)", checks(),
         log(event_entry(1, "planned", occurrence="p-1")), published=[]),
    Case("a status entry, or ``building`` / ``built``", checks(), log(ACCEPTED),
         name="status", published=[("github_check", "demo/1", mid(ACCEPTED))]),
    Case("a status entry, or ``building`` / ``built``", checks(), log(BUILDING),
         name="building", published=[("github_check", "demo/1", mid(BUILDING))]),
], headers=["Loaded log entry"])

(test_relay_row, test_relay_crash_before_publishing_is_repaired,
 test_relay_duplicate_delivery_writes_nothing) = table_tests(
    RELAY, GitHubCheckRelayController, "log")

test_the_relay_groups_filter_delivers_what_it_relays_only = filter_test(RELAY, github_check.wants)


# --- the writer ----------------------------------------------------------------------

WRITER = StateTable(github_check, [
    Case("not a ``GitHubCheckMsg``", checks(), {"id": "demo/1"}, raises=ValidationError),
    Case("queue unknown or no longer writes check-runs, or no facts source (a process "
         "without the views)", unknown_queue, update(LANDED), name="unknown", published=[]),
    Case("queue unknown or no longer writes check-runs, or no facts source (a process "
         "without the views)", no_checks, update(LANDED), name="off", published=[]),
    Case("queue unknown or no longer writes check-runs, or no facts source (a process "
         "without the views)", checks(source=False), update(LANDED), name="no-views",
         published=[], check=written(0)),
    Case("the request is not in the request log yet, or the log does not hold ``log_id`` "
         "yet (the gateway's projection is behind the relay)", checks(shows=None),
         update(ACCEPTED), name="no-log", raises=ProjectionBehind),
    Case("the request is not in the request log yet, or the log does not hold ``log_id`` "
         "yet (the gateway's projection is behind the relay)",
         checks(shows=ACCEPTED.log_id), update(LANDED), name="behind", raises=ProjectionBehind),
    Case("facts hold ``log_id``", checks(), update(LANDED), name="written", published=[],
         check=written(1)),
    Case("facts hold ``log_id``", checks(), update(ACCEPTED), name="older-writes-current",
         published=[], check=written(1)),
    Case("facts hold ``log_id``", checks(answer=GitHubUnavailable("503")), update(LANDED),
         name="github-down", raises=GitHubUnavailable),
], headers=["Loaded message"])


def lease_checked(rig: Rig, case: Case, delivery: Any) -> None:
    """The lease is checked right before GitHub is written, never when nothing is."""
    recorder = rig.ext.github_check
    assert delivery.lease_checks == (recorder.attempts if recorder else 0)  # type: ignore[attr-defined]


# the writer publishes nothing, so it has no crash points: no crash test is bound
test_writer_row, _, test_writer_duplicate_delivery_writes_nothing = table_tests(
    WRITER, GitHubCheckController, "github_check", after=lease_checked)


# --- dead letters --------------------------------------------------------------------

def dead(topic: str, group: str = "") -> dict[str, Any]:
    return {"failure": {"original_topic": topic, "failure_count": 10, "last_error": "boom",
                        "failure_detail": {"retryable": True, "group": group},
                        "failed_at_ms": NOW_MS - 1000}}


DLQ = StateTable(github_check, [
    Case("a ``github_check`` message", checks(), update(LANDED), delivery=dead("github_check"),
         returns=("rewritten", "demo/1", True), published=[], check=written(1)),
    Case("a ``github_check`` message", checks(answer=GitHubUnavailable("503")),
         update(LANDED), name="still-down", delivery=dead("github_check"),
         raises=CheckRunGivenUp),
    Case("a ``github_check`` message", checks(shows=None), update(LANDED), name="behind",
         delivery=dead("github_check"), raises=CheckRunGivenUp),
    Case("a ``log`` entry the ``github-check-relay`` group gave up on", checks(), log(LANDED),
         delivery=dead("log", "github-check-relay"), returns=("relayed", "demo/1", True),
         published=[("github_check", "demo/1", mid(LANDED))]),
], headers=["Dead letter"])

(test_dead_letter_row, test_dead_letter_crash_before_publishing_is_repaired,
 test_dead_letter_duplicate_delivery_writes_nothing) = table_tests(DLQ, DeadLetters, "dlq")


def test_every_documented_row_has_a_case() -> None:
    for table in (RELAY, WRITER, DLQ):
        assert table.missing() == [] and table.unknown() == [], table.headers
    assert [len(t.rows()) for t in (RELAY, WRITER, DLQ)] == [4, 4, 2]


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_relay_acks_a_message_that_is_not_json(rig: Rig) -> None:
    """(``run_redelivery`` re-sends the decoded payload, so this row is run alone.)"""
    case = Case("not a ``LogMsg``", checks(), None, name="not-json",
                delivery={"payload_json": "]"}, published=[], writes_nothing=True)
    await run_case(rig, GitHubCheckRelayController(rig.deps), "log", case)
