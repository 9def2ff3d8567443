"""``gateway_log``'s state table, row by row (app/controllers/gateway_log.py).

Its world is the gateway's tables: a request's summary and history. The race row is
constructed directly: ``summaries_of`` is patched to hand ``persist_log`` the summary as
it was before another writer's committed fold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import pydantic
import pytest

from app.controllers import gateway_log
from app.controllers.gateway_log import GatewayLogController
from app.db.repos import request_log as log_repo
from app.domain.entities import RequestLog, RequestSummary
from app.domain.errors import NotFound, ValidationError, VersionMismatch
from app.domain.messages import LogMsg
from tests.conftest import BACKENDS
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
    event_entry,
    run_case,
    run_redelivery,
    status_entry,
)

T0 = NOW_MS - 10_000  # when the seeded summary's status was written
STARTED = status_entry(1, "started", at_ms=T0 + 1, request_version=1, metadata={"k": "v"})
LANDED = status_entry(1, "landed", at_ms=T0 - 5, request_version=4, last_error="",
                      metadata={"batch_id": "demo/batch/1"})


def msg(entry: RequestLog, **changes: Any) -> dict[str, Any]:
    return {**LogMsg.of(entry).model_dump(mode="json"), **changes}


def summary(status: str = "accepted", request_version: int = 0, *,
            stored: RequestLog | None = None) -> Seed:
    """Request 1's summary at ``status`` (version 2; 1 when ``accepting``), written at
    ``T0``; ``stored`` is already in its history."""
    async def seed(rig: Rig) -> None:
        await rig.summary(1, status, request_version=request_version, at_ms=T0)
        if stored is not None:
            await rig.history_row(stored)
    return seed


def raced(concurrent: RequestLog, *, times: int = 1) -> Seed:
    """Summary ``accepted``; another writer folds ``concurrent`` first, and the next
    ``times`` reads ``persist_log`` makes still see the summary from before it."""
    async def seed(rig: Rig) -> None:
        await summary()(rig)
        stale = await rig.get_summary(1)
        await log_repo.persist_log(rig.db, concurrent)
        rig.stack.enter_context(mock.patch.object(
            log_repo, "summaries_of", new=StaleReads(log_repo.summaries_of, stale, times)))
    return seed


class StaleReads:
    """``summaries_of`` that answers ``stale`` for its first ``times`` calls."""

    def __init__(self, real: Callable[..., Awaitable[dict[tuple[str, str], RequestSummary]]],
                 stale: RequestSummary | None, times: int) -> None:
        self.real, self.stale, self.times, self.calls = real, stale, times, 0

    async def __call__(self, session: Any, keys: set[tuple[str, str]]
                       ) -> dict[tuple[str, str], RequestSummary]:
        self.calls += 1
        if self.calls > self.times:
            return await self.real(session, keys)
        s = self.stale
        return {} if s is None else {(s.queue, s.request_id): s}


def folded(status: str, version: int, *, request_version: int, at_ms: int,
           history: list[str], before: tuple[str, int] | None, last_error: str = "",
           metadata: dict[str, Any] | None = None, reads: int | None = None) -> Check:
    """The summary as given, the history's log ids in order, and what the metrics
    observer was told: the summary before the fold (``(status, version)``) or None."""
    async def check(rig: Rig) -> None:
        if reads is not None:  # before this check reads the summary itself
            assert isinstance(log_repo.summaries_of, StaleReads)
            assert log_repo.summaries_of.calls == reads
        s = await rig.get_summary(1)
        assert s is not None
        assert (s.status, s.version, s.request_version, s.status_timestamp_ms, s.last_error,
                s.metadata) == (status, version, request_version, at_ms, last_error,
                                metadata or {})
        assert [e.log_id for e in await rig.history(1)] == history
        assert len(rig.metrics.folded) == 1
        seen = rig.metrics.folded[0][1]
        assert (None if seen is None else (seen.status, seen.version)) == before
    return check


def untouched(status: str = "accepted", request_version: int = 0, *,
              history: list[str]) -> Check:
    """The entry lost: the summary is as seeded, the row is in the history anyway."""
    return folded(status, 2, request_version=request_version, at_ms=T0, history=history,
                  before=None)


async def not_folded(rig: Rig) -> None:
    assert rig.metrics.folded == []


async def gave_up(rig: Rig) -> None:
    await not_folded(rig)
    assert isinstance(log_repo.summaries_of, StaleReads)
    assert log_repo.summaries_of.calls == log_repo.PERSIST_ATTEMPTS


S = "demo/1/started"
WINS = "summary the entry wins (``log_wins``)"
LOSES = "summary the entry does not win"
RACE = "same, another writer changed it first"
BAD = "no ``log_id``, unknown status, unnamed event"
INVALID = "payload not a valid ``LogMsg``"

TABLE = StateTable(gateway_log, [
    Case(INVALID, summary(), {"queue": "demo"}, name="fields-missing",
         raises=pydantic.ValidationError, check=not_folded),
    Case(INVALID, summary(), msg(STARTED, colour="red"), name="unknown-field",
         raises=pydantic.ValidationError, check=not_folded),
    Case(INVALID, summary(), msg(STARTED, timestamp_ms="soon"), name="wrong-type",
         raises=pydantic.ValidationError, check=not_folded),
    Case(INVALID, summary(), ["not", "an", "object"], name="not-an-object",
         raises=pydantic.ValidationError, check=not_folded),
    Case(BAD, summary(), msg(STARTED, log_id=""), name="no-log-id", raises=ValidationError,
         check=not_folded),
    Case(BAD, summary(), msg(STARTED, status="shipped"), name="unknown-status",
         raises=ValidationError, check=not_folded),
    Case(BAD, summary(), msg(STARTED, status="accepting"), name="internal-status",
         raises=ValidationError, check=not_folded),
    Case(BAD, summary(), msg(event_entry(1, "", occurrence="b-1")), name="unnamed-event",
         raises=ValidationError, check=not_folded),
    Case("summary missing", summary(), msg(STARTED, request_id="demo/2", log_id="demo/2/x"),
         raises=NotFound, check=not_folded),
    Case(WINS, summary(), msg(STARTED), name="newer-status",
         check=folded("started", 3, request_version=1, at_ms=T0 + 1, history=[S],
                      before=("accepted", 2), metadata={"k": "v"})),
    Case(WINS, summary("accepting"), msg(STARTED, timestamp_ms=T0 - 1),
         name="accepting-takes-even-an-older-status",
         check=folded("started", 2, request_version=1, at_ms=T0 - 1, history=[S],
                      before=("accepting", 1), metadata={"k": "v"})),
    Case(WINS, summary("speculating"), msg(LANDED), name="versioned-terminal-beats-newer",
         check=folded("landed", 3, request_version=4, at_ms=T0 - 5, history=[LANDED.log_id],
                      before=("speculating", 2), metadata={"batch_id": "demo/batch/1"})),
    Case(WINS, summary("error", 3), msg(status_entry(1, "cancelled", at_ms=T0 - 9,
                                                     request_version=5, last_error="no")),
         name="higher-versioned-terminal-wins",
         check=folded("cancelled", 3, request_version=5, at_ms=T0 - 9,
                      history=["demo/1/cancelled"], before=("error", 2), last_error="no")),
    Case(RACE, raced(status_entry(1, "validating", at_ms=T0 + 1)),
         msg(STARTED, timestamp_ms=T0 + 2),
         name="reloads-and-still-wins",
         check=folded("started", 4, request_version=1, at_ms=T0 + 2,
                      history=["demo/1/validating", S], before=("validating", 3),
                      metadata={"k": "v"}, reads=2)),
    Case(RACE, raced(LANDED), msg(STARTED), name="reloads-and-now-loses",
         check=folded("landed", 3, request_version=4, at_ms=T0 - 5, history=[LANDED.log_id, S],
                      before=None, metadata={"batch_id": "demo/batch/1"}, reads=2)),
    # Every attempt lost: the retryable error reaches the queue; nothing is stored.
    Case(RACE, raced(LANDED, times=log_repo.PERSIST_ATTEMPTS), msg(STARTED),
         name="gives-up-after-10-attempts", raises=VersionMismatch, check=gave_up),
    Case("history row already stored", summary(stored=STARTED), msg(STARTED),
         name="lost-fold-is-repaired",
         check=folded("started", 3, request_version=1, at_ms=T0 + 1, history=[S],
                      before=("accepted", 2), metadata={"k": "v"})),
    Case("history row already stored", summary("landed", 4, stored=STARTED), msg(STARTED),
         name="stored-and-still-losing", writes_nothing=True,
         check=untouched("landed", 4, history=[S])),
    Case(LOSES, summary(), msg(event_entry(1, "building", occurrence="b-1", at_ms=T0 + 1)),
         name="an-event", check=untouched(history=["demo/1/building/b-1"])),
    Case(LOSES, summary("validating"), msg(STARTED, timestamp_ms=T0 - 1),
         name="an-older-status", check=untouched("validating", history=[S])),
    Case(LOSES, summary("validating"), msg(STARTED, timestamp_ms=T0),
         name="an-exact-tie-keeps-the-current", check=untouched("validating", history=[S])),
    Case(LOSES, summary("started", 1), msg(status_entry(1, "accepted", at_ms=T0 + 1)),
         name="accepted-after-progress",
         check=untouched("started", 1, history=["demo/1/accepted"])),
    Case(LOSES, summary("landed", 4), msg(status_entry(1, "speculating", at_ms=T0 + 1)),
         name="non-terminal-after-versioned-terminal",
         check=untouched("landed", 4, history=["demo/1/speculating"])),
    Case(LOSES, summary("landed", 4), msg(status_entry(1, "landed", at_ms=T0 + 1,
                                                       request_version=3)),
         name="older-versioned-terminal",
         check=untouched("landed", 4, history=["demo/1/landed"])),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", TABLE.cases, ids=lambda c: c.id)
async def test_row(rig: Rig, case: Case) -> None:
    # The gateway's consumer publishes nothing, whatever the row.
    await run_case(rig, GatewayLogController(rig.db, rig.metrics), "log",
                   replace(case, published=[]))


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
@pytest.mark.parametrize("case", [c for c in TABLE.cases if c.raises is None],
                         ids=lambda c: c.id)
async def test_a_duplicate_delivery_writes_nothing(rig: Rig, case: Case) -> None:
    # The gateway's consumer publishes nothing, whatever the row.
    await run_redelivery(rig, GatewayLogController(rig.db, rig.metrics), "log",
                         replace(case, published=[]))
