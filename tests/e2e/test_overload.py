"""Overload gets a bounded, honest 503 from the real app: a burst of live streams past
the cap, a land behind a held SQLite write lock, and a readiness probe that fails while
the database takes no writes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from app.db.engine import Database
from app.db.tables import counters, request_summaries
from app.domain.errors import TooManyStreams
from app.domain.messages import START
from app.queue.backends import sqlite_path_from_url
from app.views import events
from app.views.events import MAX_STREAMS, EventHub
from tests.conftest import BACKENDS, _pg_admin
from tests.e2e.harness import Server, change, serve

pytestmark = [pytest.mark.timeout(120)]
both = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
sqlite_only = pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)


def error_of(r: httpx.Response) -> dict[str, str]:
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


# -- live streams -----------------------------------------------------------------------


@sqlite_only
async def test_the_stream_cap_holds_while_the_first_read_is_slow(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap's check and the taking of a slot are one step: 200 subscribers arriving
    while the hub's first read of the log is in flight cannot all pass the check."""
    real = events.view_repo.last_log_id

    async def slow_last_log_id(s: Any) -> int:
        await asyncio.sleep(0.05)
        return await real(s)

    monkeypatch.setattr(events.view_repo, "last_log_id", slow_last_log_id)
    db = Database(database_url)
    hub = EventHub(db, max_streams=MAX_STREAMS)
    try:
        results = await asyncio.gather(*(hub.subscribe("demo") for _ in range(200)),
                                       return_exceptions=True)
        admitted = [r for r in results if isinstance(r, events.Subscriber)]
        refused = [r for r in results if isinstance(r, TooManyStreams)]
        assert (len(admitted), len(refused)) == (MAX_STREAMS, 200 - MAX_STREAMS)
        assert len(hub.subscribers) == MAX_STREAMS
        for sub in admitted:
            hub.unsubscribe(sub)
        assert not hub.subscribers
        assert isinstance(await hub.subscribe("demo"), events.Subscriber)  # slots come back
    finally:
        await hub.aclose()
        await db.dispose()


@both
async def test_a_burst_of_200_streams_admits_100_and_refuses_the_rest_with_503(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server, httpx.AsyncClient(
            base_url=server.base_url, timeout=60,
            limits=httpx.Limits(max_connections=250, max_keepalive_connections=0)) as client:
        answered = 0
        all_answered = asyncio.Event()
        outcomes: list[tuple[int, Any, str | None]] = []

        async def connect() -> None:
            nonlocal answered
            async with client.stream("GET", "/api/v1/events", params={"queue": "demo"}) as r:
                body = None if r.status_code == 200 else (await r.aread(), error_of(r))[1]
                outcomes.append((r.status_code, body, r.headers.get("retry-after")))
                answered += 1
                if answered == 200:
                    all_answered.set()
                await all_answered.wait()  # every accepted stream stays open until then

        await asyncio.wait_for(asyncio.gather(*(connect() for _ in range(200))), 60)
        statuses = sorted(s for s, _, _ in outcomes)
        assert statuses.count(200) == MAX_STREAMS, statuses
        assert statuses.count(503) == 200 - MAX_STREAMS, statuses
        for status, body, retry_after in outcomes:
            if status == 503:
                assert body["code"] == "unavailable" and "no more live streams" in body["message"]
                assert retry_after == "5"
        hub: EventHub = server.runtime.event_hub
        deadline = time.monotonic() + 10
        while hub.subscribers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not hub.subscribers


# -- a held SQLite write lock ------------------------------------------------------------


@contextlib.asynccontextmanager
async def held_lock(url: str) -> AsyncIterator[None]:
    conn = sqlite3.connect(sqlite_path_from_url(url), isolation_level=None,
                           check_same_thread=False)
    await asyncio.to_thread(conn.execute, "BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        await asyncio.to_thread(conn.execute, "ROLLBACK")
        conn.close()


async def count(server: Server, table: sa.Table) -> int:
    async with server.runtime.db.read() as s:
        return int((await s.execute(sa.select(sa.func.count()).select_from(table))).scalar_one())


@sqlite_only
async def test_a_land_behind_a_held_write_lock_is_503_within_5_s_with_nothing_written(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        async with held_lock(database_url):

            async def land(n: int) -> tuple[httpx.Response, float]:
                started = time.monotonic()
                r = await server.client.post("/api/v1/queues/demo/requests", json={
                    "change_uris": [change(f"locked-{n}", files=f"l/{n}.py")]})
                return r, time.monotonic() - started

            answers = await asyncio.gather(*(land(n) for n in range(4)))
        for r, took in answers:
            assert r.status_code == 503, r.text
            assert took < 5.0, f"answered after {took:.1f} s"
            assert r.headers["retry-after"] == "2"
            err = error_of(r)
            assert err["code"] == "busy" and "try again" in err["message"]
        assert await count(server, request_summaries) == 0
        assert await count(server, counters) == 0  # no request number was taken
        assert await server.runtime.broker.list_messages(START, unsettled_only=False) == []
        listed = (await server.client.get("/api/v1/queues/demo/requests")).json()
        assert listed["items"] == []
        sqid = await server.land(change("after-the-lock", files="l/after.py"))
        assert sqid == "demo/1"


# -- readiness ---------------------------------------------------------------------------


async def wait_ready(server: Server, want: bool, timeout: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        started = time.monotonic()
        r = await server.client.get("/readyz")
        took = time.monotonic() - started
        assert took < 5.5, f"/readyz took {took:.1f} s"
        body: dict[str, Any] = r.json()
        assert r.status_code == (200 if body["ready"] else 503)
        if body["ready"] is want:
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.1)


@both
async def test_readyz_is_503_while_the_database_takes_no_writes(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        body = await wait_ready(server, True)
        assert body["checks"]["database_writes"] == {"ok": True}
        if server.runtime.db.dialect == "sqlite":
            async with held_lock(database_url):
                body = await wait_ready(server, False)
            assert body["checks"].get("database_writes") == {"ok": False, "error": "Busy"}, body
        else:
            name = make_url(database_url).database
            await _pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            await server.runtime.db.engine.dispose()  # as after a failover to a standby
            body = await wait_ready(server, False)
            assert body["checks"]["database_writes"]["ok"] is False
            assert body["checks"]["database"] == {"ok": True}  # reads still work
            await _pg_admin(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            await server.runtime.db.engine.dispose()
        body = await wait_ready(server, True)
        assert body["checks"]["database_writes"] == {"ok": True}
