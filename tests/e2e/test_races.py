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
from app.controllers import start as start_module
from app.controllers.build import BuildController
from app.controllers.cancel import CancelController
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.dlq import Outcome, build_reconcilers, reconcilers
from app.controllers.mergeconflictsignal import MergeConflictSignalController
from app.controllers.mergesignal import MergeSignalController
from app.controllers.speculate import SpeculateController
from app.controllers.validate import ValidateController
from app.db import tables
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import counters
from app.db.repos import request_log as log_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain import messages as m
from app.domain.entities import Batch, LandRequest
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, LandStrategy, RequestState
from app.extensions.builds.fake import FakeBuildRunner
from app.extensions.merger.fake import FakeMerger
from app.queue import DLQ_SUFFIX, StoredMessage
from tests.conftest import BACKENDS
from tests.e2e.harness import TERMINAL, Server, change, serve
from tests.support.interleave import Actor, hook

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

ORCH = m.ORCHESTRATOR_GROUP
QUEUE = "demo"
# No periodic resync: a wake-up the code loses must show as a stuck request, not be
# papered over by the next resync tick.
QUIET = {"speculate_resync_ms": 0}


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


async def idle(server: Server, topic: str) -> bool:
    return not await server.runtime.broker.list_messages(topic, limit=1)


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
    async with serve(database_url, tmp_path, **QUIET) as server:
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
    async with serve(database_url, tmp_path, **QUIET) as server:
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


# -- cancel vs merge -------------------------------------------------------------------


async def test_a_cancel_arriving_while_the_merge_pushes_loses_to_the_landing(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        pushing = hook(monkeypatch, FakeMerger, "merge", pause="entry")
        cancels = hook(monkeypatch, CancelController, "process")
        sqid = await server.land(change("pushing", files="a/x.py"))
        await pushing.reached()
        assert (await server.cancel(sqid, "too late")).status_code == 202
        await cancels.exited()
        assert cancels.errors == []  # it wrote ``cancelling``; the merging batch owns it
        assert (await request_row(server, sqid)).state is RequestState.CANCELLING
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        pushing.release()
        await assert_one_terminal(server, sqid, "landed")
        assert "cancelling" in await server.statuses(sqid)
        assert pushing.entered == 1


async def test_a_cancel_that_read_a_merging_batch_leaves_it_to_land(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel read the batch ``merging`` and stalls; the merge pushes and the request
    lands meanwhile. The cancel then has nothing to write (a merging batch owns the
    request): no ``cancelled``, with or without the change on trunk."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        pushing = hook(monkeypatch, FakeMerger, "merge", pause="entry")
        sqid = await server.land(change("owned", files="a/x.py"))
        await pushing.reached()
        reading = hook(monkeypatch, batch_repo, "for_request", pause="exit",
                       when=lambda *a, **kw: kw["request_id"] == sqid)
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await reading.reached()
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        pushing.release()
        await until("landed", lambda: request_in(server, sqid, RequestState.LANDED))
        reading.release()
        await cancels.exited()
        assert cancels.errors == []
        await assert_one_terminal(server, sqid, "landed")
        assert pushing.entered == 1


async def test_a_cancel_that_read_a_speculating_batch_loses_to_the_merge_decision(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel read the batch ``speculating``; before it writes ``cancelling``, speculate
    decides to merge. The cancel's write loses (``VersionMismatch``), its retry finds
    the batch ``merging`` (owned: nothing to do) and the change lands."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILD)
        sqid = await server.land(change("decided", files="a/x.py"))
        await until("speculating", lambda: batch_in(server, sqid, BatchState.SPECULATING))
        reading = hook(monkeypatch, batch_repo, "for_request", pause="exit",
                       when=lambda *a, **kw: kw["request_id"] == sqid)
        cancels = hook(monkeypatch, CancelController, "process")
        pushing = hook(monkeypatch, FakeMerger, "merge", pause="entry")
        assert (await server.cancel(sqid)).status_code == 202
        await reading.reached()
        assert (await request_row(server, sqid)).state is RequestState.CANCELLING
        await rt.broker.resume(ORCH, m.BUILD)
        await pushing.reached()  # the build passed, speculate wrote ``merging``
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        reading.release()
        await cancels.exited(2)
        assert [type(e) for e in cancels.errors] == [VersionMismatch]
        assert (await the_batch(server, sqid)).state is BatchState.MERGING
        pushing.release()
        await assert_one_terminal(server, sqid, "landed")
        assert pushing.entered == 1


async def test_a_merge_decision_from_a_snapshot_older_than_the_cancel_loses(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A speculate run read the passed build (it will decide to merge); a cancel makes
    the batch ``cancelling`` first. The run's plan write loses, the retry finishes the
    cancellation; nothing is merged."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILDSIGNAL)
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("undecided", files="a/x.py"))
        batch = await until("speculating", lambda: batch_in(server, sqid,
                                                             BatchState.SPECULATING))
        await until("a build started", lambda: builds_of(server, batch.id))
        await until("speculate idle", lambda: idle(server, m.SPECULATE))
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        runs = hook(monkeypatch, SpeculateController, "process")
        await rt.broker.resume(ORCH, m.BUILDSIGNAL)  # the build passes; a run wakes
        await snapshot.reached()
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await cancels.exited()
        assert (await the_batch(server, sqid)).state is BatchState.CANCELLING
        snapshot.release()
        await assert_one_terminal(server, sqid, "cancelled")
        assert isinstance(runs.errors[0], VersionMismatch), runs.errors
        assert merges.entered == 0
        assert (await the_batch(server, sqid)).state is BatchState.CANCELLED
        assert "speculated" not in await server.statuses(sqid)


# -- cancel vs dependency_analysis -----------------------------------------------------


async def test_dependency_analysis_that_read_a_validated_request_loses_to_a_cancel(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.DEPENDENCY_ANALYSIS)
        sqid = await server.land(change("enrolled", files="a/x.py"))
        await server.wait_status(sqid, {"batching"})
        reading = hook(monkeypatch, change_repo, "details_for", pause="exit",
                       when=lambda *a, **kw: sqid in kw["request_ids"])
        enrolling = hook(monkeypatch, DependencyAnalysisController, "process")
        await rt.broker.resume(ORCH, m.DEPENDENCY_ANALYSIS)
        await reading.reached()  # DA read its member ``validated``
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await cancels.exited()  # no batch owns it yet: cancelled at once
        assert (await request_row(server, sqid)).state is RequestState.CANCELLED
        reading.release()
        await enrolling.exited(2)  # the claim lost; the retry abandons the batch
        assert [type(e) for e in enrolling.errors] == [VersionMismatch]
        await assert_one_terminal(server, sqid, "cancelled")
        assert (await the_batch(server, sqid)).state is BatchState.CREATING  # inert
        assert "batched" not in await server.statuses(sqid)


async def test_a_cancel_that_read_a_validated_request_loses_to_dependency_analysis(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel read the request ``validated``; dependency_analysis claims it (``batched``)
    first. The cancel's write loses; its retry takes the batch instead."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.DEPENDENCY_ANALYSIS)
        await rt.broker.pause(ORCH, m.BUILD)
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("claimed", files="a/x.py"))
        await server.wait_status(sqid, {"batching"})
        reading = hook(monkeypatch, cancel_module, "load_request", pause="exit")
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await reading.reached()
        await rt.broker.resume(ORCH, m.DEPENDENCY_ANALYSIS)
        await until("claimed", lambda: request_in(server, sqid, RequestState.BATCHED))
        reading.release()
        await cancels.exited(2)
        assert [type(e) for e in cancels.errors] == [VersionMismatch]
        await until("the batch cancelled",
                    lambda: batch_in(server, sqid, BatchState.CANCELLED))
        await rt.broker.resume(ORCH, m.BUILD)  # its builds are for a halted batch: none
        await assert_one_terminal(server, sqid, "cancelled")
        assert merges.entered == 0
        assert await builds_of(server, (await the_batch(server, sqid)).id) == []


# -- cancel vs speculate admitting the batch ---------------------------------------------


async def test_an_admission_that_read_a_created_batch_loses_to_a_cancel(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.SPECULATE)
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("admitted", files="a/x.py"))
        await until("created", lambda: batch_in(server, sqid, BatchState.CREATED))
        admitting = hook(monkeypatch, SpeculateController, "_admit", pause="entry")
        runs = hook(monkeypatch, SpeculateController, "process")
        await rt.broker.resume(ORCH, m.SPECULATE)
        await admitting.reached()
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await cancels.exited()
        assert (await the_batch(server, sqid)).state is BatchState.CANCELLING
        admitting.release()
        await assert_one_terminal(server, sqid, "cancelled")
        assert isinstance(runs.errors[0], VersionMismatch), runs.errors
        batch = await the_batch(server, sqid)
        assert batch.state is BatchState.CANCELLED
        assert await builds_of(server, batch.id) == []  # never funded, never built
        assert merges.entered == 0


async def test_a_cancel_that_read_a_created_batch_loses_to_its_admission(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.SPECULATE)
        await rt.broker.pause(ORCH, m.BUILD)
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("admitted", files="a/x.py"))
        await until("created", lambda: batch_in(server, sqid, BatchState.CREATED))
        reading = hook(monkeypatch, batch_repo, "for_request", pause="exit",
                       when=lambda *a, **kw: kw["request_id"] == sqid)
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await reading.reached()  # cancel read the batch ``created``
        await rt.broker.resume(ORCH, m.SPECULATE)
        await until("admitted", lambda: batch_in(server, sqid, BatchState.SPECULATING))
        reading.release()
        await cancels.exited(2)
        assert [type(e) for e in cancels.errors] == [VersionMismatch]
        await until("the batch cancelled",
                    lambda: batch_in(server, sqid, BatchState.CANCELLED))
        await rt.broker.resume(ORCH, m.BUILD)
        await assert_one_terminal(server, sqid, "cancelled")
        assert merges.entered == 0


# -- cancel vs mergeconflictsignal -----------------------------------------------------


async def test_a_validated_write_from_a_read_older_than_the_cancel_loses(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.MERGECONFLICTSIGNAL)
        sqid = await server.land(change("checked", files="a/x.py"))
        await until("the check reported",
                    lambda: rt.broker.list_messages(m.MERGECONFLICTSIGNAL, limit=1))
        reading = hook(monkeypatch, request_repo, "get", pause="exit",
                       when=lambda *a, **kw: kw["id"] == sqid)
        signals = hook(monkeypatch, MergeConflictSignalController, "process")
        await rt.broker.resume(ORCH, m.MERGECONFLICTSIGNAL)
        await reading.reached()  # it read ``started``
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await cancels.exited()
        reading.release()
        await signals.exited(2)  # ``validated`` lost; the retry finds it halted and acks
        assert [type(e) for e in signals.errors] == [VersionMismatch]
        await assert_one_terminal(server, sqid, "cancelled")
        assert "validated" not in await server.statuses(sqid)
        async with rt.db.read() as s:
            assert await batch_repo.for_request(s, queue=QUEUE, request_id=sqid) == []


# -- the request DLQ vs cancel ----------------------------------------------------------


async def test_a_request_dead_letter_that_read_a_live_request_loses_to_a_cancel(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BATCH)
        sqid = await server.land(change("dead", files="a/x.py"))
        await server.wait_status(sqid, {"validated"})
        dlq = Actor("dlq")
        failing = hook(monkeypatch, reconcilers, "terminate_request", pause="entry", when=dlq)
        task = dlq.start(reconcile(server, m.BATCH, sqid))
        await failing.reached()  # classified: validated, no batch owns it
        cancels = hook(monkeypatch, CancelController, "process")
        assert (await server.cancel(sqid)).status_code == 202
        await cancels.exited()
        failing.release()
        with pytest.raises(VersionMismatch):
            await task
        again = await reconcile(server, m.BATCH, sqid)
        assert (again.action, again.changed) == ("left", False), again
        await rt.broker.resume(ORCH, m.BATCH)
        await assert_one_terminal(server, sqid, "cancelled")


async def test_a_cancel_that_wrote_cancelling_loses_to_a_request_dead_letter(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconciler ends a ``cancelling`` request ``error`` (its table says so); a
    cancel that had written ``cancelling`` finds it terminal and leaves it."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BATCH)
        sqid = await server.land(change("dead", files="a/x.py"))
        await server.wait_status(sqid, {"validated"})
        ending = hook(monkeypatch, cancel_module, "terminate_request", pause="entry")
        assert (await server.cancel(sqid)).status_code == 202
        await ending.reached()  # cancelling written, no batch owns it
        outcome = await reconcile(server, m.BATCH, sqid)
        assert (outcome.action, outcome.changed) == ("terminated", True), outcome
        ending.release()
        await ending.exited()
        assert ending.results == ["diverged"]
        await rt.broker.resume(ORCH, m.BATCH)
        await assert_one_terminal(server, sqid, "error")


# -- conclude vs the request DLQ -----------------------------------------------------------


async def test_a_request_dead_letter_that_read_a_failed_batch_loses_to_conclude(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both write ``error``; the one that classified first but wrote second loses its
    conditional write and its retry only repairs the log: one ``error``, with the
    batch's reason."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.CONCLUDE)
        sqid = await server.land(change("broken", files="a/x.py", fake="build-fail"))
        await until("failed", lambda: batch_in(server, sqid, BatchState.FAILED))
        dlq = Actor("dlq")
        failing = hook(monkeypatch, reconcilers, "terminate_request", pause="entry", when=dlq)
        task = dlq.start(reconcile(server, m.VALIDATE, sqid))
        await failing.reached()  # the failed batch does not own it: it will write error
        await rt.broker.resume(ORCH, m.CONCLUDE)
        await until("concluded", lambda: request_in(server, sqid, RequestState.ERROR))
        failing.release()
        with pytest.raises(VersionMismatch):
            await task
        again = await reconcile(server, m.VALIDATE, sqid)
        assert (again.action, again.changed) == ("repaired", False), again
        await assert_one_terminal(server, sqid, "error")
        last_error = (await server.summary(sqid))["last_error"]
        assert "dead-lettered" not in last_error and "no speculation path" in last_error


async def test_a_request_dead_letter_while_conclude_lands_it_is_left_to_the_batch(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        landing = hook(monkeypatch, conclude_module, "terminate_request", pause="entry")
        sqid = await server.land(change("concluding", files="a/x.py"))
        await landing.reached()  # conclude read the batch ``succeeded``
        assert (await request_row(server, sqid)).state is RequestState.BATCHED
        outcome = await reconcile(server, m.VALIDATE, sqid)
        assert (outcome.action, outcome.changed) == ("owned_by_batch", False), outcome
        landing.release()
        await assert_one_terminal(server, sqid, "landed")


# -- mergesignal vs the speculate DLQ --------------------------------------------------


def culprit(batch_id: str) -> dict[str, Any]:
    """The failure detail of a speculate dead letter whose plan was rejected because of
    ``batch_id``."""
    return {"retryable": False, "subjects": [
        {"type": "batch", "id": batch_id, "reason": "injected: plan rejected"}]}


async def test_a_speculate_dead_letter_about_a_merging_batch_leaves_it_to_its_merge(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        pushing = hook(monkeypatch, FakeMerger, "merge", pause="entry")
        sqid = await server.land(change("culprit", files="a/x.py"))
        await pushing.reached()
        batch = await the_batch(server, sqid)
        outcome = await reconcile(server, m.SPECULATE, batch.id, detail=culprit(batch.id))
        assert (outcome.action, outcome.changed) == ("left", False), outcome
        pushing.release()
        await assert_one_terminal(server, sqid, "landed")
        assert pushing.entered == 1


async def test_a_speculate_dead_letter_that_read_a_speculating_batch_loses_to_mergesignal(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconciler read its culprit ``speculating``; meanwhile the batch merges and
    ``mergesignal`` writes ``succeeded``. Its ``failed`` write loses; its retry leaves
    the landed batch alone."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILD)
        sqid = await server.land(change("culprit", files="a/x.py"))
        batch = await until("speculating", lambda: batch_in(server, sqid,
                                                             BatchState.SPECULATING))
        dlq = Actor("dlq")
        reading = hook(monkeypatch, batch_repo, "get", pause="exit", when=dlq)
        task = dlq.start(reconcile(server, m.SPECULATE, batch.id, detail=culprit(batch.id)))
        await reading.reached()
        await rt.broker.resume(ORCH, m.BUILD)
        await until("succeeded", lambda: batch_in(server, sqid, BatchState.SUCCEEDED))
        reading.release()
        with pytest.raises(VersionMismatch):
            await task
        again = await reconcile(server, m.SPECULATE, batch.id, detail=culprit(batch.id))
        assert (again.action, again.changed) == ("left", False), again
        await assert_one_terminal(server, sqid, "landed")


async def test_a_merge_decision_from_a_snapshot_older_than_a_batch_dead_letter_loses(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build dead letter fails a ``speculating`` batch while a run that read its passed
    build is about to write ``merging``: the run loses and re-plans without it."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILDSIGNAL)
        merges = hook(monkeypatch, FakeMerger, "merge")
        sqid = await server.land(change("dead", files="a/x.py"))
        batch = await until("speculating", lambda: batch_in(server, sqid,
                                                             BatchState.SPECULATING))
        await until("a build started", lambda: builds_of(server, batch.id))
        await until("speculate idle", lambda: idle(server, m.SPECULATE))
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        runs = hook(monkeypatch, SpeculateController, "process")
        await rt.broker.resume(ORCH, m.BUILDSIGNAL)
        await snapshot.reached()
        outcome = await reconcile(server, m.BUILD, batch.id)
        assert (outcome.action, outcome.changed) == ("failed", True), outcome
        snapshot.release()
        await assert_one_terminal(server, sqid, "error")
        assert isinstance(runs.errors[0], VersionMismatch), runs.errors
        assert merges.entered == 0
        assert "dead-lettered from build" in (await server.summary(sqid))["last_error"]


# -- speculate vs what wakes it: buildsignal, dependency_analysis ------------------------


async def test_a_build_result_recorded_while_a_run_is_between_snapshot_and_write(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run writes from a snapshot that misses the result (the path stays
    ``building``); the result's wake-up was published after the run's mark, so it is
    not coalesced away: the next run sees the result and the change lands (no resync
    here to hide a lost wake-up)."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILDSIGNAL)
        sqid = await server.land(change("signalled", files="a/x.py"))
        batch = await until("speculating", lambda: batch_in(server, sqid,
                                                             BatchState.SPECULATING))
        (build,) = await until("a build started", lambda: builds_of(server, batch.id))
        await until("speculate idle", lambda: idle(server, m.SPECULATE))
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        runs = hook(monkeypatch, SpeculateController, "_run")
        await rt.broker.publish(m.SPECULATE, {"id": batch.id, "queue": QUEUE},
                                partition_key=QUEUE, message_id=f"{batch.id}/poke")
        await snapshot.reached()  # the build is ``accepted`` in this snapshot
        await rt.broker.resume(ORCH, m.BUILDSIGNAL)
        wake = f"{batch.id}/build-signal/{build}/succeeded"
        await until("the result's wake-up", lambda: rt.broker.find_messages(m.SPECULATE, wake))
        snapshot.release()
        await assert_one_terminal(server, sqid, "landed")
        assert runs.entered >= 2 and runs.errors == []


async def test_a_batch_created_while_a_run_is_between_snapshot_and_write(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILD)
        first = await server.land(change("first", files="a/x.py"))
        batch = await until("speculating", lambda: batch_in(server, first,
                                                             BatchState.SPECULATING))
        await until("speculate idle", lambda: idle(server, m.SPECULATE))
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        await rt.broker.publish(m.SPECULATE, {"id": batch.id, "queue": QUEUE},
                                partition_key=QUEUE, message_id=f"{batch.id}/poke")
        await snapshot.reached()
        second = await server.land(change("second", files="b/x.py"))
        await until("created", lambda: batch_in(server, second, BatchState.CREATED))
        snapshot.release()
        await rt.broker.resume(ORCH, m.BUILD)
        await assert_one_terminal(server, first, "landed")
        await assert_one_terminal(server, second, "landed")


# -- start vs the start DLQ --------------------------------------------------------------


async def test_a_start_that_read_no_row_loses_to_the_start_dead_letter(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A (stale) start found no row; the start DLQ reconciler records the request
    ``error`` first. The start's create finds the row: it must take that row as it is
    (terminal: re-publish its log, ack), not go on to log ``started`` after ``error``."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        reading = hook(monkeypatch, start_module, "load_request", pause="exit")
        validating = hook(monkeypatch, rt.deps, "publish", times=0,
                          when=lambda topic, *a, **kw: topic == m.VALIDATE)
        sqid = await server.land(change("tombstone", files="a/x.py"))
        await reading.reached()  # no row yet
        outcome = await reconcile(server, m.START, sqid)
        assert (outcome.action, outcome.changed) == ("terminated", True), outcome
        reading.release()
        await reading.exited()
        await assert_one_terminal(server, sqid, "error")
        assert "started" not in await server.statuses(sqid)
        assert validating.entered == 0
        req = await request_row(server, sqid)
        assert (req.state, req.version) == (RequestState.ERROR, 1)


# -- land vs land of the same change -----------------------------------------------------


async def straight_to_the_pipeline(server: Server, uri: str) -> str:
    """A second request of ``uri`` handed to the orchestrator without an acceptance
    claim (a gateway from before change claims, during a rolling upgrade): its summary,
    then its ``start``, as the gateway writes them."""
    rt = server.runtime
    now = rt.broker.clock()
    async with rt.db.write() as s:
        sqid = f"{QUEUE}/{await counters.next_number(s, queue=QUEUE, domain='request')}"
        await log_repo.create_summary(s, queue=QUEUE, request_id=sqid, change_uris=[uri],
                                      received_at_ms=now)
    await rt.broker.publish(m.START, m.LandRequestMsg(
        id=sqid, queue=QUEUE, change_uris=[uri], strategy=LandStrategy.REBASE,
        received_at_ms=now).model_dump(mode="json"), partition_key=QUEUE, message_id=sqid)
    return sqid


async def test_two_lands_of_one_change_land_it_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second land of a change arrives while the first one's validation is between
    its duplicate check and its claim. The gateway refuses it at acceptance (it claims
    changes there); one that reaches the orchestrator anyway waits for the first
    validation (serial per queue), finds its claim and ends ``error``: the change
    lands once."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        uri = change("twice", files="a/x.py")
        merges = hook(monkeypatch, FakeMerger, "merge")
        checking = hook(monkeypatch, ValidateController, "_duplicate_of", pause="exit")
        trace: list[tuple[str, str]] = []
        for n in (1, 2):
            hook(monkeypatch, ValidateController, "process", times=0, trace=trace,
                 label=f"{QUEUE}/{n}", when=lambda _c, d, n=n: d.payload["id"] == f"{QUEUE}/{n}")
        first = await server.land(uri)
        assert first == f"{QUEUE}/1"
        await checking.reached()  # no other claimant: it is about to claim
        r = await server.client.post(f"/api/v1/queues/{QUEUE}/requests",
                                     json={"change_uris": [uri]})
        if r.status_code == 409:
            assert first in r.json()["error"]["message"], r.text
            second = await straight_to_the_pipeline(server, uri)
        else:  # a gateway without acceptance claims
            assert r.status_code == 202, r.text
            second = r.json()["sqid"]
        assert second == f"{QUEUE}/2"
        checking.release()
        assert await server.wait_terminal(first) == "landed"
        assert await server.wait_terminal(second) == "error"
        assert f"duplicate of in-flight request {first}" in \
            (await server.summary(second))["last_error"]
        await assert_one_terminal(server, first, "landed")
        await assert_one_terminal(server, second, "error")
        # the second validation began only after the first one returned
        assert trace.index((second, "enter")) > trace.index((first, "return")), trace
        landed = [u for call in merges.calls for step in call[0][1].steps
                  for u in step.change_uris]
        assert landed == [uri]


# -- one controller twice on one message (a stale holder beside its successor) ----------


class Handed:
    """A delivery as a controller sees it, for running one directly (a second holder)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.attempt = 1
        self.message = type("Message", (), {"published_at_ms": 0, "seq": 10**12})()

    async def ensure_held(self) -> None:
        return None  # both holders believe they hold it: the race the link decides


async def test_two_dependency_analysis_runs_of_one_batch_claim_it_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.DEPENDENCY_ANALYSIS)
        sqid = await server.land(change("twice", files="a/x.py"))
        await server.wait_status(sqid, {"batching"})
        batch = await the_batch(server, sqid)
        reading = hook(monkeypatch, change_repo, "details_for", pause="exit",
                       when=lambda *a, **kw: sqid in kw["request_ids"])
        payload = {"id": batch.id, "queue": QUEUE}
        stale = asyncio.create_task(DependencyAnalysisController(rt.deps).process(
            Handed(payload)))
        await reading.reached()
        await DependencyAnalysisController(rt.deps).process(Handed(payload))
        assert (await request_row(server, sqid)).state is RequestState.BATCHED
        reading.release()
        with pytest.raises(VersionMismatch):
            await stale
        await DependencyAnalysisController(rt.deps).process(Handed(payload))  # its retry
        await rt.broker.resume(ORCH, m.DEPENDENCY_ANALYSIS)
        await assert_one_terminal(server, sqid, "landed")
        assert (await request_row(server, sqid)).version == 4  # started, validated, batched, landed
        assert (await server.statuses(sqid)).count("batched") == 1


async def test_two_cancel_runs_of_one_request_take_its_batch_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.SPECULATE)
        await rt.broker.pause(ORCH, m.CANCEL)
        sqid = await server.land(change("twice", files="a/x.py"))
        await until("created", lambda: batch_in(server, sqid, BatchState.CREATED))
        assert (await server.cancel(sqid)).status_code == 202
        reading = hook(monkeypatch, batch_repo, "for_request", pause="exit",
                       when=lambda *a, **kw: kw["request_id"] == sqid)
        payload = {"id": sqid, "queue": QUEUE, "reason": "twice"}
        stale = asyncio.create_task(CancelController(rt.deps).process(Handed(payload)))
        await reading.reached()  # request ``cancelling`` written; batch read ``created``
        await CancelController(rt.deps).process(Handed(payload))
        assert (await the_batch(server, sqid)).state is BatchState.CANCELLING
        reading.release()
        with pytest.raises(VersionMismatch):
            await stale
        await CancelController(rt.deps).process(Handed(payload))  # its retry: no write
        await rt.broker.resume(ORCH, m.CANCEL)
        await rt.broker.resume(ORCH, m.SPECULATE)
        await assert_one_terminal(server, sqid, "cancelled")
        assert (await the_batch(server, sqid)).state is BatchState.CANCELLED


async def test_two_build_runs_that_both_trigger_keep_the_build_that_linked_first(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both passed their lease check; the stale one triggers after its successor linked
    its build. The write-once link decides: the stale build is signalled, found
    unwanted and cancelled; the path goes on with the linked one."""
    async with serve(database_url, tmp_path, **QUIET) as server:
        rt = server.runtime
        await rt.broker.pause(ORCH, m.BUILD)
        sqid = await server.land(change("linked", files="a/x.py", build_ms=1500))
        (msg,) = await until("a build dispatched",
                             lambda: rt.broker.list_messages(m.BUILD, limit=1))
        triggering = hook(monkeypatch, FakeBuildRunner, "trigger", pause="entry")
        cancels = hook(monkeypatch, FakeBuildRunner, "cancel")
        stale = asyncio.create_task(BuildController(rt.deps).process(Handed(msg.payload)))
        await triggering.reached()
        await BuildController(rt.deps).process(Handed(msg.payload))
        triggering.release()
        await stale
        async with rt.db.read() as s:
            held = await spec_repo.get_link(s, queue=QUEUE, path_id=msg.payload["path_id"],
                                            attempt=msg.payload["attempt"])
        winner, loser = triggering.results  # the successor's trigger returned first
        assert held == winner != loser
        await rt.broker.resume(ORCH, m.BUILD)
        await assert_one_terminal(server, sqid, "landed")
        assert [c[0][1] for c in cancels.calls] == [loser]
        async with rt.db.read() as s:
            lost = await spec_repo.get_build(s, queue=QUEUE, id=loser)
        assert lost.status.value == "cancelled"
