"""Crash windows found by bench/chaos.py, replayed deterministically.

Each test puts the system in the state a SIGKILL at the worst moment leaves behind
(a write done, the log message after it never published) and checks that the
redelivered message repairs the history.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from app.db.repos import request_log as log_repo
from app.db.repos import requests as request_repo
from app.domain.messages import CANCEL, START, CancelRequestMsg, LandRequestMsg
from app.domain.states import LandStrategy, RequestState
from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


async def test_accepted_is_logged_when_the_gateway_died_after_publishing_start(
        database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        received = rt.broker.clock()
        # What the gateway does before it would record `accepted` itself: an invisible
        # receipt, then the `start` message. Then it "dies".
        async with rt.db.write() as s:
            await log_repo.create_summary(s, queue="demo", request_id="demo/77",
                                          change_uris=[change("x", files="a/x.py")],
                                          received_at_ms=received)
        msg = LandRequestMsg(id="demo/77", queue="demo",
                             change_uris=[change("x", files="a/x.py")],
                             strategy=LandStrategy.REBASE, received_at_ms=received)
        await rt.broker.publish(START, msg.model_dump(mode="json"), partition_key="demo",
                                message_id="demo/77")
        # invisible (`accepting`) until something logs `accepted`: the start stage does
        deadline = asyncio.get_running_loop().time() + 20
        while (await server.client.get("/api/v1/queues/demo/requests/77")).status_code == 404:
            assert asyncio.get_running_loop().time() < deadline, "never became visible"
            await asyncio.sleep(0.05)
        assert await server.wait_terminal("demo/77") == "landed"
        history = await server.history("demo/77")
        assert [e["status"] for e in history if e["type"] == "status"][:2] == \
            ["accepted", "started"]
        assert history[0]["timestamp_ms"] == received


async def test_a_cancel_redelivered_after_its_write_publishes_the_lost_log(
        database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        sqid = await server.land(change("slow", files="b/x.py", build_ms=60_000))
        await server.wait_status(sqid, {"speculating"})
        # The cancel controller wrote `cancelled` and died before publishing its log.
        async with rt.db.read() as s:
            req = await request_repo.get(s, queue="demo", id=sqid)
        async with rt.db.write() as s:
            await request_repo.update(s, old=req, new=replace(
                req, state=RequestState.CANCELLED, version=req.version + 1),
                now_ms=rt.broker.clock())
        assert (await server.summary(sqid))["status"] == "speculating"
        await rt.broker.publish(CANCEL, CancelRequestMsg(id=sqid, queue="demo").model_dump(),
                                partition_key=sqid, message_id=f"{sqid}/cancel/redelivered")
        assert await server.wait_status(sqid, {"cancelled"}, timeout=20) == "cancelled"
