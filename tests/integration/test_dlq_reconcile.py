"""Dead-letter reconciliation per topic, through the real pipeline (in-process app over
HTTP, SQLite and PostgreSQL): a fake that keeps raising a retryable error, or a poison
payload published straight to the topic, dead-letters a message; its reconciler
drives the request or batch to its failed state with an honest ``last_error``."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.controllers.dlq import Undecodable
from app.controllers.pipeline import build_reconcilers
from app.domain import messages as m
from app.queue import StoredMessage
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.integration.queue_support import drained, eventually

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(90),
]

FAST = {"queue_max_attempts": 2}


async def wait_dlq(server: Server, dlq_topic: str, *, timeout: float = 30,
                   unsettled: bool = False) -> StoredMessage:
    """The first message of ``dlq_topic`` (settled or not), waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = await server.runtime.broker.list_messages(dlq_topic, unsettled_only=unsettled)
        if msgs:
            return msgs[-1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing reached {dlq_topic} in {timeout}s")


async def poison(server: Server, topic: str, payload: Any, key: str) -> None:
    await server.runtime.broker.publish(topic, payload, partition_key=key,
                                        message_id=f"poison-{uuid.uuid4().hex[:8]}")


async def assert_error(server: Server, sqid: str, topic: str, attempts: int,
                       error: str) -> None:
    assert await server.wait_terminal(sqid) == "error"
    summary = await server.summary(sqid)
    expected = f"dead-lettered from {topic} after {attempts} attempt"
    assert expected in summary["last_error"], summary["last_error"]
    assert error in summary["last_error"], summary["last_error"]
    statuses = await server.statuses(sqid)
    assert statuses[-1] == "error" and statuses.count("error") == 1, statuses


# -- natural failures: a fake that keeps raising ConnectionError ---------------------


@pytest.mark.parametrize(("fake", "topic"), [
    ("build-error", m.BUILDSIGNAL),
    ("trigger-error", m.BUILD),
    ("merge-error-late", m.MERGE),
    ("merge-error", m.MERGECHECK),
])
async def test_retryable_failure_exhausts_attempts_and_fails_the_request(
    database_url: str, tmp_path: Path, fake: str, topic: str
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        sqid = await server.land(change(f"f-{fake}", files="a/x.py", fake=fake))
        await assert_error(server, sqid, topic, 2, "ConnectionError")
        dead = await wait_dlq(server, f"{topic}_dlq")
        assert dead.original_topic == topic and dead.failure_count == 2
        if topic != m.MERGECHECK:  # the batch failed too, with the same reason
            async with server.runtime.db.read() as s:
                from app.db.repos import batches as batch_repo
                (batch,) = await batch_repo.for_request(s, queue="demo", request_id=sqid)
            assert batch.state == "failed"
            assert f"dead-lettered from {topic}" in batch.failure_reason


# -- poison payloads, request-scoped: the request waits in `started` -----------------


REQUEST_POISON = {
    m.START: lambda sqid: {"id": sqid, "queue": "demo", "change_uris": []},
    m.CANCEL: lambda sqid: {"id": sqid, "queue": "demo", "reason": 7},
    m.VALIDATE: lambda sqid: {"id": sqid, "queue": "demo", "extra": 1},
    m.MERGECHECK: lambda sqid: {"id": sqid, "queue": "demo", "extra": 1},
    m.MERGECONFLICTSIGNAL: lambda sqid: {"id": sqid, "queue": "demo", "outcome": "maybe"},
    m.BATCH: lambda sqid: {"id": sqid, "queue": "demo", "extra": 1},
}


@pytest.mark.parametrize("topic", list(REQUEST_POISON))
async def test_poison_on_a_request_topic_ends_the_request_in_error(
    database_url: str, tmp_path: Path, topic: str
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        # Hold the request before the poisoned stage's own consumer.
        paused = m.MERGECHECK if topic == m.VALIDATE else m.VALIDATE
        await broker.pause(m.ORCHESTRATOR_GROUP, paused)
        sqid = await server.land(change(f"p-{topic}", files="a/x.py"))
        await server.wait_status(sqid, {"validating"} if topic == m.VALIDATE else {"started"})
        await poison(server, topic, REQUEST_POISON[topic](sqid), sqid)
        await assert_error(server, sqid, topic, 1, "ValidationError")
        await broker.resume(m.ORCHESTRATOR_GROUP, paused)
        # The paused stage handled (and settled) its message: it saw a halted request.
        await eventually(lambda: drained(broker, paused, m.ORCHESTRATOR_GROUP),
                         what=f"{paused} drained")
        assert (await server.summary(sqid))["status"] == "error"


# -- poison payloads, batch-scoped: the batch waits in `created` or `speculating` ----


BATCH_POISON = [
    (m.DEPENDENCY_ANALYSIS, m.SPECULATE),
    (m.CONCLUDE, m.SPECULATE),
    (m.MERGESIGNAL, m.SPECULATE),
    (m.MERGE, m.SPECULATE),
    (m.BUILD, m.SPECULATE),
]


@pytest.mark.parametrize(("topic", "paused"), BATCH_POISON)
async def test_poison_on_a_batch_topic_fails_the_batch_and_its_members(
    database_url: str, tmp_path: Path, topic: str, paused: str
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        await broker.pause(m.ORCHESTRATOR_GROUP, paused)
        sqid = await server.land(change(f"b-{topic}", files="a/x.py"))
        await server.wait_status(sqid, {"batched"} if paused == m.SPECULATE
                                 else {"speculating"})
        bid = (await server.summary(sqid))["metadata"]["batch_id"]
        payload: dict[str, Any] = {"id": bid, "queue": "demo", "extra": 1}
        await poison(server, topic, payload, "demo")
        await assert_error(server, sqid, topic, 1, "ValidationError")
        async with server.runtime.db.read() as s:
            from app.db.repos import batches as batch_repo
            batch = await batch_repo.get(s, queue="demo", id=bid)
        assert batch.state == "failed"
        await broker.resume(m.ORCHESTRATOR_GROUP, paused)
        await eventually(lambda: drained(broker, paused, m.ORCHESTRATOR_GROUP),
                         what=f"{paused} drained")
        assert (await server.summary(sqid))["status"] == "error"


# -- speculate: only the batches a failure names are failed ---------------------------


async def test_a_poison_speculate_message_fails_no_batch_and_is_parked(
    database_url: str, tmp_path: Path
) -> None:
    """A speculate run plans the whole queue: an error that names no batch (here a
    payload that does not decode) must not fail the batch the message happened to name."""
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        await broker.pause(m.ORCHESTRATOR_GROUP, m.BUILD)
        sqid = await server.land(change("innocent", files="a/x.py"))
        await server.wait_status(sqid, {"speculating"})
        bid = (await server.summary(sqid))["metadata"]["batch_id"]
        await poison(server, m.SPECULATE, {"id": bid, "queue": "demo", "extra": 1}, "demo")
        deadline = time.monotonic() + 30
        while not (parked := [d for d in await broker.list_messages("speculate_dlq")
                              if d.parked]):
            assert time.monotonic() < deadline, "the speculate dead letter was not parked"
            await asyncio.sleep(0.05)
        assert parked[0].failure_detail is not None
        assert "Unattributed" in parked[0].failure_detail["parked"]["error"]
        assert "names no batch" in parked[0].failure_detail["parked"]["error"]
        async with server.runtime.db.read() as s:
            from app.db.repos import batches as batch_repo
            batch = await batch_repo.get(s, queue="demo", id=bid)
        assert batch.state == "speculating" and batch.failure_reason == ""
        await broker.resume(m.ORCHESTRATOR_GROUP, m.BUILD)
        assert await server.wait_terminal(sqid) == "landed"


async def test_a_speculate_dead_letter_after_exhausted_retries_fails_no_batch(
    database_url: str, tmp_path: Path
) -> None:
    """The database was away: nobody is to blame, nothing is failed; the next wake-up
    (or the resync) re-plans."""
    async with serve(database_url, tmp_path, **FAST) as server:
        other = await server.land(change("waiting", files="b/x.py", build_ms=60_000))
        await server.wait_status(other, {"speculating"})
        live = (await server.summary(other))["metadata"]["batch_id"]
        letter = StoredMessage(
            seq=1, topic="speculate_dlq", partition_key="demo", message_id="x",
            payload_json=f'{{"id": "{live}", "queue": "demo"}}', metadata={},
            published_at_ms=0, original_topic="speculate", failure_count=2,
            last_error="ConnectionError: the database went away",
            failure_detail={"retryable": True, "reason": "attempts-exhausted"})
        outcome = await build_reconcilers(server.runtime.deps)["speculate_dlq"].reconcile(letter)
        assert (outcome.action, outcome.changed) == ("unattributed", False)
        assert (await server.summary(other))["status"] == "speculating"


# -- races, idempotence, undecodable ---------------------------------------------------


async def test_a_late_primary_success_wins_over_reconciliation(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        sqid = await server.land(change("race", files="a/x.py"))
        assert await server.wait_terminal(sqid) == "landed"
        bid = (await server.summary(sqid))["metadata"]["batch_id"]
        # Dead letters for the request and its batch arriving after the success.
        await poison(server, m.MERGE + "_dlq", {"id": bid, "queue": "demo"}, "demo")
        await poison(server, m.VALIDATE + "_dlq", {"id": sqid, "queue": "demo"}, "demo")
        await poison(server, m.CONCLUDE + "_dlq", {"id": bid, "queue": "demo"}, "demo")
        for dlq in ("merge_dlq", "validate_dlq", "conclude_dlq"):  # reconciled and acked
            await eventually(lambda dlq=dlq: drained(server.runtime.broker, dlq),
                             what=f"{dlq} drained")
        summary = await server.summary(sqid)
        assert summary["status"] == "landed" and summary["last_error"] == ""
        for dlq in ("merge_dlq", "validate_dlq", "conclude_dlq"):
            assert await server.runtime.broker.list_messages(dlq) == []  # settled: acked
        reconcilers = build_reconcilers(server.runtime.deps)
        msg = (await server.runtime.broker.list_messages("merge_dlq", unsettled_only=False))[0]
        outcome = await reconcilers["merge_dlq"].reconcile(msg)
        assert (outcome.action, outcome.changed) == ("left", False)


async def test_reconciling_twice_is_idempotent_and_repairs_the_log(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        sqid = await server.land(change("twice", files="a/x.py", fake="trigger-error"))
        await assert_error(server, sqid, m.BUILD, 2, "ConnectionError")
        dead = await wait_dlq(server, "build_dlq")
        reconciler = build_reconcilers(server.runtime.deps)["build_dlq"]
        again = await reconciler.reconcile(dead)
        assert (again.action, again.changed) == ("repaired", False)
        # Whatever the repair published to the log was persisted before the re-check.
        await eventually(lambda: drained(server.runtime.broker, m.LOG), what="log drained")
        await assert_error(server, sqid, m.BUILD, 2, "ConnectionError")


async def test_a_request_owned_by_a_live_batch_is_left_to_it(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        await server.runtime.broker.pause(m.ORCHESTRATOR_GROUP, m.SPECULATE)
        sqid = await server.land(change("owned", files="a/x.py"))
        await server.wait_status(sqid, {"batched"})
        await poison(server, m.BATCH, {"id": sqid, "queue": "demo", "extra": 1}, "demo")
        dead = await wait_dlq(server, "batch_dlq")
        outcome = await build_reconcilers(server.runtime.deps)["batch_dlq"].reconcile(dead)
        assert outcome.action == "owned_by_batch"
        await server.runtime.broker.resume(m.ORCHESTRATOR_GROUP, m.SPECULATE)
        assert await server.wait_terminal(sqid) == "landed"


async def test_missing_entity_is_acked_and_log_dlq_persists_decodable_entries(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        await poison(server, "build_dlq", {"id": "demo/batch/999", "queue": "demo"}, "x")
        await poison(server, "validate_dlq", {"id": "demo/999", "queue": "demo"}, "demo")
        sqid = await server.land(change("logged", files="a/x.py"))
        assert await server.wait_terminal(sqid) == "landed"
        entry = {"queue": "demo", "request_id": sqid, "log_id": f"{sqid}/waiting/dlq",
                 "timestamp_ms": 1, "type": "event", "event": "waiting"}
        await poison(server, "log_dlq", entry, sqid)
        deadline = time.monotonic() + 10
        while not any(e.get("event") == "waiting" for e in await server.history(sqid)):
            assert time.monotonic() < deadline, "log_dlq entry was not persisted"
            await asyncio.sleep(0.05)
        for dlq in ("build_dlq", "validate_dlq", "log_dlq"):  # acks are batched: wait
            while await server.runtime.broker.list_messages(dlq):
                assert time.monotonic() < deadline + 10, f"{dlq} was not settled"
                await asyncio.sleep(0.05)
        async with server.runtime.db.read() as s:
            from app.db.repos import requests as request_repo
            assert await request_repo.get_many(s, queue="demo", ids=["demo/999"]) == {}


async def test_a_start_dead_letter_for_a_request_never_received_parks_its_log(
    database_url: str, tmp_path: Path
) -> None:
    """A start dead letter whose request has no row is recorded ``error`` (the request
    never started); when the gateway never received that request either (a forged
    message), the terminal log has nowhere to go and parks in ``log_dlq`` for an
    operator instead of being retried for hours. A start dead letter naming no
    request id of its queue is undecodable."""
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        await poison(server, "start_dlq", {"id": "demo/999", "queue": "demo"}, "demo")
        await poison(server, "start_dlq", {"id": "demo/batch/3", "queue": "demo"}, "demo")
        orphan = await wait_dlq(server, "log_dlq", unsettled=True)
        assert orphan.payload["request_id"] == "demo/999"
        assert orphan.payload["status"] == "error"
        deadline = time.monotonic() + 10
        while True:
            parked = [x for x in await broker.list_messages("start_dlq") if x.parked]
            (still,) = await broker.list_messages("log_dlq")
            if parked and still.parked:
                break
            assert time.monotonic() < deadline, "not parked"
            await asyncio.sleep(0.05)
        assert "never received" in still.failure_detail["parked"]["error"]
        assert [x.payload["id"] for x in parked] == ["demo/batch/3"]
        async with server.runtime.db.read() as s:
            from app.db.repos import requests as request_repo
            tomb = await request_repo.get(s, queue="demo", id="demo/999")
        assert tomb.state == "error" and "dead-lettered from start" in tomb.last_error


async def test_an_undecodable_poison_stays_visible_in_its_dlq(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        await poison(server, m.LOG, {"garbage": True}, "nowhere")
        await poison(server, m.START, ["not", "an", "object"], "demo")
        reconcilers = build_reconcilers(server.runtime.deps)
        for dlq in ("log_dlq", "start_dlq"):
            dead = await wait_dlq(server, dlq, unsettled=True)
            with pytest.raises(Undecodable):
                await reconcilers[dlq].reconcile(dead)
        async def parked() -> bool:  # the reconciler consumer tried: parked at once
            flags = [x.parked for dlq in ("log_dlq", "start_dlq")
                     for x in await server.runtime.broker.list_messages(dlq)]
            return all(flags)
        await eventually(parked, what="both dead letters parked")
        for dlq, original in (("log_dlq", "log"), ("start_dlq", "start")):
            (still,) = await server.runtime.broker.list_messages(dlq)
            assert still.settled_at_ms is None and still.parked
            assert still.original_topic == original
            assert still.failure_count == 1  # a decode error is not retried
            assert "dead" not in (still.last_error or "")  # the original failure is kept
            assert still.failure_detail is not None
            assert "Undecodable" in still.failure_detail["parked"]["error"]
