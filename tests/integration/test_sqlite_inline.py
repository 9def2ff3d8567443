"""SQLite statements run on the event loop's thread (``app/db/sqlite_inline.py``): a
transaction never gives the loop a turn between its statements, and a locked file is
waited for off the loop, within the writer's budget."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.db.engine import Database
from app.db.tables import counters
from app.domain.errors import Busy


class Ticker:
    """Counts the event loop's turns while it runs."""

    def __init__(self) -> None:
        self.turns = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            self.turns += 1
            await asyncio.sleep(0)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Ticker]:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        try:
            yield self
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'inline.db'}")
    async with database.engine.begin() as conn:
        await conn.run_sync(counters.metadata.create_all, tables=[counters])
    yield database
    await database.dispose()


async def test_a_write_transaction_gives_the_loop_no_turn_between_its_statements(
        db: Database) -> None:
    async with db.write() as s:  # a connection opened and configured before counting
        await s.execute(counters.insert().values(queue="q", domain="warm", value=0))
    async with Ticker().running() as ticker, db.write() as s:
        before = ticker.turns
        for i in range(20):
            await s.execute(counters.insert().values(queue="q", domain=f"d{i}", value=i))
        await s.execute(sa.update(counters).where(counters.c.domain == "d3")
                        .values(value=counters.c.value + 1))
        rows = (await s.execute(sa.select(counters.c.value))).scalars().all()
        during = ticker.turns - before
    assert len(rows) == 21
    assert during == 0, f"the loop ran {during} other turns inside one transaction"


async def test_a_locked_file_is_waited_for_off_the_loop_within_the_budget(
        tmp_path: Path, db: Database) -> None:
    db.lock_timeout_ms = 600
    other = sqlite3.connect(tmp_path / "inline.db", isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        async with Ticker().running() as ticker:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(Busy):
                async with db.write() as s:
                    await s.execute(counters.insert().values(queue="q", domain="x", value=1))
            waited = loop.time() - started
            turns = ticker.turns
        assert 0.4 <= waited < 3, waited
        assert turns > 10, "the loop was blocked while the writer waited for the lock"
        async with db.read() as s:  # readers are not held up by the other writer (WAL)
            assert (await s.execute(sa.select(sa.func.count()).select_from(counters))
                    ).scalar_one() == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    async with db.write() as s:  # once released, the same pool writes again
        await s.execute(counters.insert().values(queue="q", domain="x", value=1))
    async with db.read() as s:
        assert (await s.execute(sa.select(counters.c.domain))).scalars().all() == ["x"]


async def test_a_lock_released_within_the_budget_lets_the_writer_through(
        tmp_path: Path, db: Database) -> None:
    other = sqlite3.connect(tmp_path / "inline.db", isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, lambda: (other.execute("ROLLBACK"), other.close()))
    async with db.write() as s:
        await s.execute(counters.insert().values(queue="q", domain="late", value=1))
    async with db.read() as s:
        assert (await s.execute(sa.select(counters.c.domain))).scalars().all() == ["late"]


async def test_a_writer_given_up_while_it_waits_for_the_lock_is_closed_safely(
        tmp_path: Path, db: Database) -> None:
    """A timeout cancels a writer whose ``BEGIN IMMEDIATE`` waits in a worker thread;
    the pool then closes its connection. Closing it under the running statement crashed
    the process (a segfault in ``/readyz`` under a held lock); now the wait is
    interrupted and the close waits for the thread to return."""
    other = sqlite3.connect(tmp_path / "inline.db", isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2), db.write() as s:
                    await s.execute(counters.insert().values(queue="q", domain="x", value=1))
        await db.engine.dispose()
    finally:
        other.execute("ROLLBACK")
        other.close()
    async with db.write() as s:
        await s.execute(counters.insert().values(queue="q", domain="y", value=1))
    async with db.read() as s:
        assert (await s.execute(sa.select(counters.c.domain))).scalars().all() == ["y"]
