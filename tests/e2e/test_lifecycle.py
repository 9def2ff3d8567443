"""Every request ends with an honest answer, and no ``error`` is written over a landing:
races between a stage and its competitor, replayed deterministically with
``tests/support/interleave.py`` (a paused call waits on an event while the test runs
the competing path to a known state), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.controllers import cancel as cancel_module
from app.controllers import start as start_module
from app.controllers.batch import BatchController
from app.controllers.common import Outbox
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.dlq import reconcilers
from app.controllers.validate import ValidateController
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain import messages as m
from app.domain.entities import Batch
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, RequestState
from app.extensions.merger.fake import FakeMerger
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.support.interleave import hook
from tests.support.races import ORCH, request_row, until

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(90),
]

FAST = {"queue_max_attempts": 2}


async def batches_of(server: Server, sqid: str) -> list[Batch]:
    async with server.runtime.db.read() as s:
        return await batch_repo.for_request(s, queue="demo", request_id=sqid)


async def in_state(server: Server, sqid: str, state: RequestState) -> bool:
    return (await request_row(server, sqid)).state is state


class Handed:
    """A delivery as a controller sees it, for calling one directly."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.attempt = 1


# -- item 5: the DLQ request reconciler vs. a batch claiming the request -------------


async def test_a_dead_letter_reconciled_while_its_request_is_batched_leaves_it_to_land(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        await broker.pause(ORCH, m.BATCH)
        await broker.pause(ORCH, m.SPECULATE)
        sqid = await server.land(change("dlq-race", files="a/x.py"))
        await server.wait_status(sqid, {"validated"})
        # The reconciler reads the request (validated, no batch) and stops before writing.
        gate = hook(monkeypatch, reconcilers, "terminate_request", pause="entry",
                    when=lambda *a, **kw: kw["sqid"] == sqid)
        await broker.publish(m.BATCH + "_dlq", {"id": sqid, "queue": "demo"},
                             partition_key="demo", message_id=f"dead-{uuid.uuid4().hex[:8]}")
        await gate.reached()
        # Meanwhile the primary path goes on: batch, then dependency_analysis claims it.
        await broker.resume(ORCH, m.BATCH)
        await until("batched", lambda: in_state(server, sqid, RequestState.BATCHED))
        gate.release()
        await gate.exited()
        assert (await request_row(server, sqid)).state is RequestState.BATCHED
        # The retried dead letter finds the owning batch and acks; the batch lands.
        await until("the dead letter settled",
                    lambda: _empty(broker.list_messages(m.BATCH + "_dlq")))
        await broker.resume(ORCH, m.SPECULATE)
        assert await server.wait_terminal(sqid) == "landed"
        statuses = await server.statuses(sqid)
        assert "error" not in statuses, statuses
        assert (await server.summary(sqid))["last_error"] == ""


async def _empty(listing: Awaitable[list[Any]]) -> bool:
    return not await listing


async def test_merge_refuses_a_batch_whose_members_already_ended(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.MERGE)
        sqid = await server.land(change("ended", files="a/x.py"))
        await server.wait_status(sqid, {"speculated"})
        (batch,) = await batches_of(server, sqid)
        assert batch.state is BatchState.MERGING
        # What the reconciler race used to leave: the member ended while its batch merges.
        req = await request_row(server, sqid)
        async with rt.db.write() as s:
            await request_repo.update(s, old=req, new=replace(
                req, state=RequestState.ERROR, version=req.version + 1,
                last_error="dead-lettered from batch (simulated)"), now_ms=rt.broker.clock())
        merges = hook(monkeypatch, FakeMerger, "merge")
        await rt.broker.resume(ORCH, m.MERGE)

        async def settled() -> Batch | None:
            (b,) = await batches_of(server, sqid)
            return b if b.state.terminal else None

        ended = await until("the batch settled", settled)
        assert ended.state is BatchState.FAILED, ended
        assert "refused to land" in ended.failure_reason
        assert f"{sqid} is error" in ended.failure_reason
        assert merges.entered == 0  # nothing was merged, nothing pushed
        assert await server.wait_terminal(sqid) == "error"
        statuses = await server.statuses(sqid)
        assert "landing" not in statuses and "landed" not in statuses, statuses
        assert (await request_row(server, sqid)).state is RequestState.ERROR


# -- item 8: a start dead-lettered before its request row exists ----------------------


async def test_a_start_dead_lettered_before_its_row_exists_ends_error_for_good(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    injected = hook(monkeypatch, start_module.StartController, "process", times=2,
                    raises=lambda: ConnectionError("injected: the database went away"))
    async with serve(database_url, tmp_path, **FAST) as server:
        sqid = await server.land(change("never-started", files="a/x.py"))
        assert await server.wait_terminal(sqid, timeout=20) == "error"
        summary = await server.summary(sqid)
        assert "dead-lettered from start after 2 attempts: ConnectionError: injected" in \
            summary["last_error"], summary["last_error"]
        assert injected.entered == 2
        req = await request_row(server, sqid)
        assert (req.state, req.version) == (RequestState.ERROR, 1)
        assert req.change_uris == (change("never-started", files="a/x.py"),)
    monkeypatch.undo()  # the start stage works again from here on
    async with serve(database_url, tmp_path, **FAST) as server:
        broker = server.runtime.broker
        assert (await server.summary(sqid))["status"] == "error"  # after a restart too
        # An operator requeues the dead-lettered start: it must not resurrect the request.
        (dead,) = await broker.list_messages(m.START + "_dlq", unsettled_only=False)
        await broker.requeue(m.START + "_dlq", dead.seq)

        async def start_settled() -> bool:
            msgs = await broker.list_messages(m.START, unsettled_only=False)
            return any(x.message_id == sqid and x.settled_at_ms is not None for x in msgs)

        await until("the requeued start handled", start_settled)
        req = await request_row(server, sqid)
        assert (req.state, req.version) == (RequestState.ERROR, 1)
        assert await server.statuses(sqid) == ["accepted", "error"]
        assert (await server.summary(sqid))["status"] == "error"


# -- item 12: validate vs. cancel, batch after a lost lease, dependency_analysis logs --


async def test_validate_does_not_write_error_over_a_request_a_cancel_took(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path) as server:
        uri = change("rejected", files="a/x.py", fake="provider-error")
        # validate stops after its read; it would reject the change (provider error).
        checking = hook(monkeypatch, ValidateController, "_duplicate_of", pause="entry")
        validating = hook(monkeypatch, ValidateController, "process", times=0)
        # cancel stops after writing ``cancelling``, before its own terminal write.
        cancelling = hook(monkeypatch, cancel_module, "terminate_request", pause="entry")
        sqid = await server.land(uri)
        await checking.reached()
        assert (await server.cancel(sqid, "changed my mind")).status_code == 202
        await cancelling.reached()
        assert (await request_row(server, sqid)).state is RequestState.CANCELLING
        checking.release()
        await validating.exited()  # validate's attempt is over (written or refused)
        assert (await request_row(server, sqid)).state is RequestState.CANCELLING
        cancelling.release()
        assert await server.wait_terminal(sqid) == "cancelled"
        assert (await request_row(server, sqid)).state is RequestState.CANCELLED
        assert "error" not in await server.statuses(sqid)


async def test_two_runs_of_one_batch_message_make_one_batch(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BATCH)
        sqid = await server.land(change("lease", files="a/x.py"))
        await server.wait_status(sqid, {"validated"})
        # Run A (its lease lost) read "no batch yet" and stalls; run B, its successor on
        # the same message, goes all the way; then A goes on.
        reading = hook(monkeypatch, batch_repo, "for_request", pause="exit",
                       when=lambda *a, **kw: kw["request_id"] == sqid)
        payload = {"id": sqid, "queue": "demo"}
        run_a = asyncio.create_task(BatchController(rt.deps).process(Handed(payload)))
        await reading.reached()
        await BatchController(rt.deps).process(Handed(payload))
        reading.release()
        await run_a
        assert [b.id for b in await batches_of(server, sqid)] == ["demo/batch/1"]
        await rt.broker.resume(ORCH, m.BATCH)
        assert await server.wait_terminal(sqid) == "landed"
        (batch,) = await batches_of(server, sqid)
        assert batch.state is BatchState.SUCCEEDED
        assert (await server.summary(sqid))["metadata"]["batch_id"] == batch.id


async def test_dependency_analysis_logs_batched_only_after_its_write(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        trace: list[tuple[str, str]] = []
        await rt.broker.pause(ORCH, m.DEPENDENCY_ANALYSIS)
        sqid = await server.land(change("logged-late", files="a/x.py"))
        await server.wait_status(sqid, {"batching"})

        def claims_member(*a: Any, **kw: Any) -> bool:
            return bool(kw["new"].state is BatchState.CREATED and sqid in kw["new"].contains)

        def logs_batched(entries: Any) -> bool:
            return any(e.status == "batched" for e in entries)

        # The claim loses a race once (as to a cancel); the retry succeeds.
        hook(monkeypatch, batch_repo, "update", when=claims_member, trace=trace,
             label="write", raises=lambda: VersionMismatch("injected: lost the claim race"))
        hook(monkeypatch, Outbox, "logs", when=lambda _outbox, entries: logs_batched(entries),
             trace=trace, label="log", times=0)
        await rt.broker.resume(ORCH, m.DEPENDENCY_ANALYSIS)
        assert await server.wait_terminal(sqid) == "landed"
        assert trace[:2] == [("write", "enter"), ("write", "raise")], trace
        first_log = trace.index(("log", "enter"))
        assert ("write", "return") in trace[:first_log], trace
        statuses = await server.statuses(sqid)
        assert statuses.count("batched") == 1
        assert statuses.index("batching") < statuses.index("batched") < \
            statuses.index("speculating"), statuses


async def test_batched_is_logged_with_the_write_when_dependency_analysis_dies_after_it(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DA's ``created`` write and its ``batched`` logs commit together (the outbox): a DA
    that dies after that commit, before its ``speculate`` wake-up, has logged already;
    its redelivery finds the batch ``created`` and replays the logs (no-ops) and the
    wake-up, and the request lands with its history in order."""
    async with serve(database_url, tmp_path) as server:
        dying = hook(monkeypatch, DependencyAnalysisController, "_wake", pause="entry")
        sqid = await server.land(change("dies", files="a/x.py"))
        await dying.reached()
        (batch,) = await batches_of(server, sqid)
        assert batch.state is BatchState.CREATED

        async def logged() -> bool:
            return "batched" in await server.statuses(sqid)

        await until("batched logged before the wake-up", logged)
        dying.release(ConnectionError("injected: died before the wake-up"))
        await dying.exited(2)  # the redelivery's wake-up
        assert await server.wait_terminal(sqid) == "landed"
        statuses = await server.statuses(sqid)
        assert statuses.index("batching") < statuses.index("batched") < \
            statuses.index("speculating"), statuses

