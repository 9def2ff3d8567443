"""Cancel against everything that can take its request or batch first, on the real app
(SQLite and PostgreSQL): merge, speculate's merge decision and admission,
dependency_analysis' claim, mergeconflictsignal, and a second cancel run. A cancel is
an intent: it wins only the writes it makes first; a merge under way wins always.
One side is paused between its read and its write, the other runs to completion,
then the first goes on; each test asserts the winner, one terminal status, nothing
merged that should not be, and a loser that retried (``VersionMismatch``) or acked.

Pauses are never inside a ``Database.write()`` block (on SQLite every writer of the
process would wait behind it): a hook sits on a repository read, on a function called
between transactions, or on an extension call. ``docs/races.md`` is the matrix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.controllers import cancel as cancel_module
from app.controllers.cancel import CancelController
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.mergeconflictsignal import MergeConflictSignalController
from app.controllers.speculate import SpeculateController
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain import messages as m
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, RequestState
from app.extensions.merger.fake import FakeMerger
from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve
from tests.support.interleave import hook
from tests.support.races import (
    ORCH,
    QUEUE,
    QUIET,
    Handed,
    assert_one_terminal,
    batch_in,
    builds_of,
    idle,
    request_in,
    request_row,
    the_batch,
    until,
)

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]


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
