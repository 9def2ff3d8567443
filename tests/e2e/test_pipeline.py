"""The land pipeline end to end over HTTP, on SQLite and PostgreSQL, with and without
chaos delivery (every message handled twice, a fraction of runs failing after their
writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db.repos import request_log
from app.domain import messages as m
from app.domain.entities import RequestLog
from app.domain.states import LandStrategy, LogType
from app.extensions.merger.fake import landed_sha
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.integration.queue_support import drained, eventually

HAPPY_TRAIL = ["accepted", "started", "validating", "validated", "batching", "batched",
               "speculating", "speculated", "landing", "landed"]

MODES = [pytest.param({}, id="plain"),
         pytest.param({"queue_chaos_duplicate": True, "queue_chaos_fail_rate": 0.2},
                      id="chaos")]

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.parametrize("mode", MODES),
    pytest.mark.timeout(90),
]


async def assert_clean_history(server: Server, sqid: str) -> None:
    """Every status appears once, in a legal order, ending in one terminal status."""
    statuses = await server.statuses(sqid)
    assert len(statuses) == len(set(statuses)), " > ".join(statuses)
    terminal = [s for s in statuses if s in ("landed", "error", "cancelled")]
    assert len(terminal) == 1 and statuses[-1] == terminal[0], statuses


async def test_happy_path_trail(database_url: str, mode: dict, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        sqid = await server.land(change("happy", files="a/x.py"))
        assert await server.wait_terminal(sqid) == "landed"
        assert await server.statuses(sqid) == HAPPY_TRAIL
        events = [e["event"] for e in await server.history(sqid) if e["type"] == "event"]
        assert events == ["building", "built"]
        summary = await server.summary(sqid)
        assert summary["metadata"]["batch_id"] == "demo/batch/1"
        uri = summary["change_uris"][0]
        assert summary["metadata"]["commits"] == [landed_sha(uri)]
        assert summary["landed_commits"] == [landed_sha(uri)]


async def test_a_failing_change_is_evicted_and_the_next_one_still_lands(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        bad = await server.land(change("bad", files="lib/a.py", fake="build-fail",
                                       build_ms=3000))
        await server.wait_status(bad, {"batched", "speculating"})
        good = await server.land(change("good", files="lib/b.py"))
        assert await server.wait_terminal(bad) == "error"
        assert await server.wait_terminal(good) == "landed"
        bad_summary = await server.summary(bad)
        assert "no speculation path could pass" in bad_summary["last_error"]
        batched = [e for e in await server.history(good) if e.get("status") == "batched"]
        assert batched[0]["metadata"]["dependencies"] == ["demo/batch/1"]
        await assert_clean_history(server, bad)
        await assert_clean_history(server, good)


@pytest.mark.slow
async def test_independent_folders_do_not_wait_on_each_other(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        slow = await server.land(change("slow", files="alpha/a.py", build_ms=10_000))
        await server.wait_status(slow, {"speculating"})
        fast = await server.land(change("fast", files="beta/b.py"))
        assert await server.wait_terminal(fast, timeout=20) == "landed"
        assert (await server.summary(slow))["status"] == "speculating"
        batched = [e for e in await server.history(fast) if e.get("status") == "batched"]
        assert batched[0]["metadata"]["dependencies"] == []
        assert await server.wait_terminal(slow) == "landed"


async def test_duplicate_land_of_an_in_flight_change_is_refused(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        uri = change("dup", files="d/x.py", build_ms=4000)
        first = await server.land(uri)
        await server.wait_status(first, {"batched", "speculating"})
        url = "/api/v1/queues/demo/requests"
        r = await server.client.post(url, json={"change_uris": [uri]})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "change_in_flight"
        assert f"already in flight as {first}" in r.json()["error"]["message"]
        # the validate stage's duplicate check stays as a second line of defence: a
        # receipt that bypassed the gateway's claim (written directly) is rejected there
        async with server.runtime.db.write() as s:
            await request_log.create_summary(s, queue="demo", request_id="demo/99",
                                             change_uris=[uri], received_at_ms=1)
        await request_log.persist_log(server.runtime.db, RequestLog(
            queue="demo", request_id="demo/99", timestamp_ms=1, type=LogType.STATUS,
            status="accepted", log_id=m.log_id("demo/99", "accepted")))
        await server.runtime.broker.publish(m.START, m.LandRequestMsg(
            id="demo/99", queue="demo", change_uris=[uri], strategy=LandStrategy.REBASE,
        ).model_dump(mode="json"), partition_key="demo", message_id="demo/99")
        assert await server.wait_terminal("demo/99") == "error"
        assert f"duplicate of in-flight request {first}" in (
            await server.summary("demo/99"))["last_error"]
        assert await server.wait_terminal(first) == "landed"
        r = await server.client.post(url, json={"change_uris": [uri]})
        assert r.status_code == 409 and r.json()["error"]["code"] == "change_landed"
        assert (f"already landed as {landed_sha(uri)} by {first}"
                in r.json()["error"]["message"])
        assert set(await server.statuses_of_queue()) == {first, "demo/99"}
        await assert_clean_history(server, "demo/99")


async def test_a_merge_conflict_ends_in_error_with_the_paths(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        sqid = await server.land(change("conflict", files="c/x.py", fake="merge-conflict"))
        assert await server.wait_terminal(sqid) == "error"
        assert "merge conflict" in (await server.summary(sqid))["last_error"]
        await assert_clean_history(server, sqid)


async def test_cancel_before_batching_never_lands(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        broker = server.runtime.broker
        await broker.pause(m.ORCHESTRATOR_GROUP, m.BATCH, reason="test")
        sqid = await server.land(change("early", files="e/x.py"))
        await server.wait_status(sqid, {"validated"})
        assert (await server.cancel(sqid, "changed my mind")).status_code == 202
        assert await server.wait_terminal(sqid) == "cancelled"
        await broker.resume(m.ORCHESTRATOR_GROUP, m.BATCH)
        # The batch message is handled (settled) and must not have revived it.
        await eventually(lambda: drained(broker, m.BATCH, m.ORCHESTRATOR_GROUP),
                         what="batch drained")
        assert (await server.summary(sqid))["status"] == "cancelled"
        statuses = await server.statuses(sqid)
        assert "landed" not in statuses and "batched" not in statuses
        await assert_clean_history(server, sqid)


async def test_cancel_during_speculation_ends_cancelled(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        sqid = await server.land(change("long", files="l/x.py", build_ms=8000))
        await server.wait_status(sqid, {"speculating"})
        assert (await server.cancel(sqid)).status_code == 202
        assert await server.wait_terminal(sqid, timeout=40) == "cancelled"
        statuses = await server.statuses(sqid)
        assert "landed" not in statuses and statuses[-1] == "cancelled"
        assert "cancelling" in statuses


async def test_cancel_of_a_terminal_request_is_a_no_op(
    database_url: str, mode: dict, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, **mode) as server:
        sqid = await server.land(change("done", files="n/x.py"))
        assert await server.wait_terminal(sqid) == "landed"
        before = await server.history(sqid)
        r = await server.cancel(sqid)
        assert r.status_code == 202 and r.json()["status"] == "landed"
        # The cancel message was handled (settled) by every group before the checks.
        await eventually(lambda: drained(server.runtime.broker, m.CANCEL), what="cancel drained")
        assert (await server.summary(sqid))["status"] == "landed"
        assert await server.history(sqid) == before
