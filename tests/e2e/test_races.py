"""Races the state tables allow, each driven deterministically on the real app (SQLite and
PostgreSQL): one side is paused between its read and its write (``tests/support/
interleave.py``), the other runs to completion, then the first goes on. Each test
asserts the documented winner (``docs/races.md`` is the matrix), that no state went
backwards, that the request has exactly one terminal status in its history, that
nothing landed that should not have, and that the loser either retried cleanly
(``VersionMismatch``) or acked as superseded.

Pauses are never inside a ``Database.write()`` block (on SQLite every writer of the
process would wait behind it): a hook sits on a repository read, on a function called
between transactions, or on an extension call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from app.controllers import cancel as cancel_module
from app.controllers import conclude as conclude_module
from app.controllers.cancel import CancelController
from app.controllers.dlq import Outcome, build_reconcilers, reconcilers
from app.controllers.mergesignal import MergeSignalController
from app.db import tables
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain import messages as m
from app.domain.entities import Batch, LandRequest
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, RequestState
from app.extensions.merger.fake import FakeMerger
from app.queue import DLQ_SUFFIX, StoredMessage
from tests.conftest import BACKENDS
from tests.e2e.harness import TERMINAL, Server, change, serve
from tests.support.interleave import hook

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

ORCH = m.ORCHESTRATOR_GROUP
QUEUE = "demo"


# -- probes ----------------------------------------------------------------------------


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
    for topic in (*m.ORCHESTRATOR_TOPICS, m.LOG):
        for t in (topic, topic + DLQ_SUFFIX):
            if await broker.list_messages(t, limit=1):
                return False
    return True


async def settle(server: Server) -> None:
    await until("every topic drained", lambda: settled(server))


async def assert_one_terminal(server: Server, sqid: str, expected: str) -> None:
    """The request ended ``expected`` in its row, its summary and its history, and its
    history holds exactly one terminal status, the last one."""
    await settle(server)
    assert (await request_row(server, sqid)).state.value == expected
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


# -- DLQ reconcilers vs merge --------------------------------------------------------------


@pytest.mark.parametrize("topic", [m.BUILDSIGNAL, m.BUILD, m.DEPENDENCY_ANALYSIS])
async def test_a_dead_letter_about_a_merging_batch_leaves_it_to_its_merge(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: str
) -> None:
    """A build poll (say of a cancelled sibling path) dead-letters while the batch's
    merge is about to push: the reconciler must leave the merging batch to its merge,
    else the change lands on trunk while the request ends ``error``."""
    async with serve(database_url, tmp_path) as server:
        pushing = hook(monkeypatch, FakeMerger, "merge", pause="entry")
        sqid = await server.land(change("landing", files="a/x.py"))
        await pushing.reached()
        batch = await the_batch(server, sqid)
        assert batch.state is BatchState.MERGING
        (build,) = await builds_of(server, batch.id)
        outcome = await reconcile(server, topic, build if topic == m.BUILDSIGNAL else batch.id)
        assert (outcome.action, outcome.changed) == ("left", False), outcome
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        pushing.release()
        assert await server.wait_terminal(sqid) == "landed"
        await assert_one_terminal(server, sqid, "landed")
        assert pushing.entered == 1
        assert (await the_batch(server, sqid)).state is BatchState.SUCCEEDED


async def test_a_merge_dead_letter_after_the_merge_reported_leaves_the_outcome_to_it(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge pushed and published its result, then a later attempt of the same
    message dead-lettered (its ack was lost, the merger's remote went away). The
    reconciler's verdict must not overtake the merge's own result on its way to
    ``mergesignal``: the change is on trunk, so the request ends ``landed``."""
    async with serve(database_url, tmp_path) as server:
        recording = hook(monkeypatch, MergeSignalController, "process", pause="entry")
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("reported", files="a/x.py"))
        await recording.reached()
        assert merges.finished == 1 and merges.results[0].succeeded
        batch = await the_batch(server, sqid)
        assert batch.state is BatchState.MERGING
        outcome = await reconcile(server, m.MERGE, batch.id)
        assert outcome.changed is False, outcome
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        recording.release()
        assert await server.wait_terminal(sqid) == "landed"
        await assert_one_terminal(server, sqid, "landed")
        assert (await the_batch(server, sqid)).state is BatchState.SUCCEEDED
        assert merges.entered == 1
