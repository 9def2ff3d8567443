"""Dead-letter reconcilers against the primaries they race, on the real app (SQLite and
PostgreSQL): a reconciler never fails a batch its merge is landing, never overtakes a
merge's reported result, and loses cleanly to any primary write that got there first
(cancel, conclude, mergesignal, speculate); ``start`` against the ``start_dlq``
tombstone. Dead letters are handed straight to their reconciler.

Pauses are never inside a ``Database.write()`` block (on SQLite every writer of the
process would wait behind it): a hook sits on a repository read, on a function called
between transactions, or on an extension call. ``docs/races.md`` is the matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.controllers import cancel as cancel_module
from app.controllers import conclude as conclude_module
from app.controllers import start as start_module
from app.controllers.cancel import CancelController
from app.controllers.dlq import reconcilers
from app.controllers.mergesignal import MergeSignalController
from app.controllers.speculate import SpeculateController
from app.db.repos import batches as batch_repo
from app.domain import messages as m
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, RequestState
from app.extensions.merger.fake import FakeMerger
from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve
from tests.support.interleave import Actor, hook
from tests.support.races import (
    ORCH,
    QUIET,
    assert_one_terminal,
    batch_in,
    builds_of,
    idle,
    reconcile,
    request_in,
    request_row,
    the_batch,
    until,
)

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]


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
        # The wake-up the merge sent beside its conclusion has run; it sent no second
        # conclusion (it used to: a repair that could land the request under the test).
        await until("speculate idle", lambda: idle(server, m.SPECULATE))
        concluding = await server.runtime.broker.list_messages(m.CONCLUDE, unsettled_only=False)
        assert [c.message_id for c in concluding] == [
            f"{(await the_batch(server, sqid)).id}/conclude/merged"]
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
