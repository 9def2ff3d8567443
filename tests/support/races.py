"""Probes and shortcuts the race tests share (``tests/e2e/test_races*.py``): the rows,
batches and builds of a request on the real app, "every topic drained", the
one-terminal-status check, dead letters handed straight to their reconciler, and a
delivery for running a controller directly as a second holder of one message."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from app.controllers.dlq import Outcome
from app.controllers.pipeline import build_reconcilers
from app.controllers.stages import topics
from app.db import tables
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain import messages as m
from app.domain.entities import Batch, LandRequest
from app.domain.states import BatchState, RequestState
from app.queue import DLQ_SUFFIX, StoredMessage
from tests.e2e.harness import TERMINAL, Server

ORCH = m.ORCHESTRATOR_GROUP
QUEUE = "demo"
# No periodic resync: a wake-up the code loses must show as a stuck request, not be
# papered over by the next resync tick.
QUIET = {"speculate_resync_ms": 0}


async def until(what: str, probe: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout}s")
        await asyncio.sleep(0.02)


async def request_row(server: Server, sqid: str) -> LandRequest:
    async with server.runtime.db.read() as s:
        return await request_repo.get(s, queue=QUEUE, id=sqid)


async def the_batch(server: Server, sqid: str) -> Batch:
    """The request's newest batch."""
    async with server.runtime.db.read() as s:
        found = await batch_repo.for_request(s, queue=QUEUE, request_id=sqid)
    assert found, f"{sqid} has no batch"
    return found[-1]


async def batch_in(server: Server, sqid: str, *states: BatchState) -> Batch | None:
    async with server.runtime.db.read() as s:
        found = await batch_repo.for_request(s, queue=QUEUE, request_id=sqid)
    return found[-1] if found and found[-1].state in states else None


async def request_in(server: Server, sqid: str, state: RequestState) -> bool:
    return (await request_row(server, sqid)).state is state


async def builds_of(server: Server, batch_id: str) -> list[str]:
    t = tables.builds
    async with server.runtime.db.read() as s:
        rows = await s.execute(sa.select(t.c.id).where(t.c.queue == QUEUE,
                                                       t.c.batch_id == batch_id))
    return [r.id for r in rows]


async def settled(server: Server) -> bool:
    """No message of any topic (primaries, DLQs, log) is waiting or in flight."""
    broker = server.runtime.broker
    for topic in topics():
        for t in (topic, topic + DLQ_SUFFIX):
            if await broker.list_messages(t, limit=1):
                return False
    return True


async def idle(server: Server, topic: str) -> bool:
    return not await server.runtime.broker.list_messages(topic, limit=1)


async def settle(server: Server) -> None:
    await until("every topic drained", lambda: settled(server))


async def _terminal_row(server: Server, sqid: str) -> bool:
    return (await request_row(server, sqid)).state.value in TERMINAL


async def assert_one_terminal(server: Server, sqid: str, expected: str) -> None:
    """The request ended ``expected`` in its row, its summary and its history, and its
    history holds exactly one terminal status, the last one.

    A build in progress holds no message on any topic (its verdict arrives by callback
    or poll), so "every topic drained" alone can be seen mid-build: wait for the row to
    reach a terminal state first, then for the fan-out that follows to drain."""
    await until(f"{sqid} terminal", lambda: _terminal_row(server, sqid), timeout=30)
    await settle(server)
    row = await request_row(server, sqid)
    assert row.state.value == expected, (row.state.value, await server.statuses(sqid))
    assert (await server.summary(sqid))["status"] == expected
    statuses = await server.statuses(sqid)
    ends = [s for s in statuses if s in TERMINAL]
    assert ends == [expected] and statuses[-1] == expected, statuses


def letter(topic: str, ident: str, *, detail: dict[str, Any] | None = None) -> StoredMessage:
    """A dead letter of ``topic`` naming ``ident``, as the queue stores one."""
    return StoredMessage(
        seq=0, topic=topic + DLQ_SUFFIX, partition_key=QUEUE, message_id=f"dead/{ident}",
        payload_json=json.dumps({"id": ident, "queue": QUEUE}), metadata={},
        published_at_ms=0, original_topic=topic, failed_at_ms=0, failure_count=10,
        last_error="ConnectionError: injected",
        failure_detail=detail if detail is not None else {"retryable": True})


async def reconcile(server: Server, topic: str, ident: str, **kw: Any) -> Outcome:
    reconciler = build_reconcilers(server.runtime.deps)[topic + DLQ_SUFFIX]
    return await reconciler.reconcile(letter(topic, ident, **kw))



class Handed:
    """A delivery as a controller sees it, for running one directly (a second holder)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.attempt = 1
        self.message = type("Message", (), {"published_at_ms": 0, "seq": 10**12})()

    async def ensure_held(self) -> None:
        return None  # both holders believe they hold it: the race the link decides


