"""Races of speculation and of one message's two holders, on the real app (SQLite and
PostgreSQL): results and new batches that arrive while a speculate run is between
its snapshot and its write, two lands of one change, and two runs of
dependency_analysis and build on one message (a stale holder beside its successor).
The other races: ``test_races_cancel.py``, ``test_races_dlq.py`` and
``tests/integration/test_races.py``.

Pauses are never inside a ``Database.write()`` block (on SQLite every writer of the
process would wait behind it): a hook sits on a repository read, on a function called
between transactions, or on an extension call. ``docs/races.md`` is the matrix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.controllers.build import BuildController
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.speculate import SpeculateController
from app.controllers.validate import ValidateController
from app.db.repos import changes as change_repo
from app.db.repos import counters
from app.db.repos import request_log as log_repo
from app.db.repos import speculation as spec_repo
from app.domain import messages as m
from app.domain.errors import VersionMismatch
from app.domain.states import BatchState, LandStrategy, RequestState
from app.extensions.builds.fake import FakeBuildRunner
from app.extensions.merger.fake import FakeMerger
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
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
    request_row,
    the_batch,
    until,
)

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]


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
