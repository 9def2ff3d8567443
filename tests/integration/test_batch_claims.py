"""Batch claims (``app/db/repos/batches.py``): one batch per batching intent of a request,
also when two transactions claim at once (PostgreSQL: the second insert waits for the
first transaction and loses to it; SQLite: writers take turns)."""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa

from app.db.engine import Database
from app.db.repos import batches as batch_repo
from tests.conftest import BACKENDS

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

KEY = {"queue": "demo", "request_id": "demo/1", "cause": "validated@v2"}


async def _lock_waiters(db: Database) -> int:
    async with db.read() as s:
        return int((await s.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"))).scalar_one())


async def test_the_first_claim_wins_and_a_concurrent_one_gets_its_batch(
    database_url: str,
) -> None:
    db = Database(database_url)
    try:
        first_claimed, commit_first = asyncio.Event(), asyncio.Event()

        async def first() -> str:
            async with db.write() as s:
                won = await batch_repo.claim(s, **KEY, batch_id="demo/batch/1", now_ms=1)
                first_claimed.set()
                await commit_first.wait()
            return won

        async def second() -> str:
            await first_claimed.wait()
            async with db.write() as s:
                return await batch_repo.claim(s, **KEY, batch_id="demo/batch/2", now_ms=2)

        t1, t2 = asyncio.create_task(first()), asyncio.create_task(second())
        await first_claimed.wait()
        if db.dialect == "postgresql":  # the second insert blocks on the uncommitted claim
            deadline = time.monotonic() + 10
            while await _lock_waiters(db) < 1:
                assert time.monotonic() < deadline, "the second claim never waited"
                await asyncio.sleep(0.02)
        commit_first.set()
        assert await t1 == "demo/batch/1"
        assert await t2 == "demo/batch/1"
        async with db.read() as s:
            assert await batch_repo.claimed(s, **KEY) == "demo/batch/1"
            assert await batch_repo.claimed(s, **{**KEY, "cause": "validated@v3"}) is None
    finally:
        await db.dispose()
