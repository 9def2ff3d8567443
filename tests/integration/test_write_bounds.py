"""Writes wait a bounded time, and the readiness write probe tells a database that takes
no writes from one that does.

SQLite: a writer that cannot get the write lock within its budget — another
connection holds ``BEGIN EXCLUSIVE``, or this process's writers queue up behind one that
waits — fails with ``Busy`` (the app's) or ``QueueBusy`` (the queue's) before anything
is written, instead of waiting out one 10 s busy timeout per writer ahead of it.
``probe_write`` fails on a locked or read-only SQLite file and on a read-only
PostgreSQL database, and passes otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from app.db.engine import Database
from app.db.tables import counters
from app.domain.errors import Busy
from app.queue import Broker, QueueBusy, SqliteBackend, TopicSpec, Topology
from app.queue.backends import sqlite_path_from_url
from tests.conftest import BACKENDS, _pg_admin

sqlite_only = pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
both = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


@contextlib.asynccontextmanager
async def held_lock(url: str) -> AsyncIterator[sqlite3.Connection]:
    """Another connection holding the SQLite file's write lock (``BEGIN EXCLUSIVE``)."""
    conn = sqlite3.connect(sqlite_path_from_url(url), isolation_level=None,
                           check_same_thread=False)
    await asyncio.to_thread(conn.execute, "BEGIN EXCLUSIVE")
    try:
        yield conn
    finally:
        await asyncio.to_thread(conn.execute, "ROLLBACK")
        conn.close()


async def count(db: Database) -> int:
    async with db.read() as s:
        return int((await s.execute(sa.select(sa.func.count()).select_from(counters)))
                   .scalar_one())


async def add_counter(db: Database, name: str) -> None:
    async with db.write() as s:
        await s.execute(counters.insert().values(queue="q", domain=name, value=1))


@sqlite_only
async def test_a_writer_behind_a_held_lock_gets_busy_within_its_budget(database_url: str) -> None:
    db = Database(database_url, lock_timeout_ms=1000)
    try:
        async with held_lock(database_url):
            started = time.monotonic()
            # five writers at once: each gets its answer within its own budget, not one
            # budget (or busy timeout) per writer queued ahead of it
            results = await asyncio.gather(*(add_counter(db, f"c{i}") for i in range(5)),
                                           return_exceptions=True)
            took = time.monotonic() - started
        assert all(isinstance(r, Busy) for r in results), results
        assert "nothing was written" in str(results[0])
        assert took < 2.0, f"writers waited {took:.1f} s for a 1 s budget"
        assert await count(db) == 0
        await add_counter(db, "after")  # the lock is free again: writes go through
        assert await count(db) == 1
    finally:
        await db.dispose()


@sqlite_only
async def test_the_default_budget_answers_within_five_seconds(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with held_lock(database_url):
            started = time.monotonic()
            with pytest.raises(Busy):
                await add_counter(db, "x")
            took = time.monotonic() - started
        assert 3.0 < took < 5.0, took
    finally:
        await db.dispose()


@sqlite_only
async def test_queue_operations_wait_a_bounded_time_for_the_shared_lock(
    database_url: str,
) -> None:
    topology = Topology()
    topology.declare(TopicSpec("in"))
    lock = asyncio.Lock()
    backend = SqliteBackend(sqlite_path_from_url(database_url), write_lock=lock,
                            lock_timeout_ms=500)
    broker = Broker(backend, topology)
    await broker.start()
    try:
        async with lock:  # a writer of this process holds its turn
            started = time.monotonic()
            with pytest.raises(QueueBusy, match="nothing was stored"):
                await broker.publish("in", {}, partition_key="p", message_id="m1")
            assert time.monotonic() - started < 1.5
        async with held_lock(database_url):  # another connection holds the file
            started = time.monotonic()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                await broker.publish("in", {}, partition_key="p", message_id="m2")
            assert time.monotonic() - started < 1.5
        assert await broker.list_messages("in", unsettled_only=False) == []
        await broker.publish("in", {}, partition_key="p", message_id="m3")
        assert [m.message_id for m in await broker.list_messages(
            "in", unsettled_only=False)] == ["m3"]
    finally:
        await broker.close()


# -- the readiness write probe ---------------------------------------------------------


@both
async def test_the_write_probe_passes_and_writes_nothing(database_url: str) -> None:
    db = Database(database_url)
    try:
        await db.probe_write()
        assert await count(db) == 0
    finally:
        await db.dispose()


@sqlite_only
async def test_the_write_probe_fails_on_a_locked_sqlite_file(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with held_lock(database_url):
            started = time.monotonic()
            with pytest.raises(Busy):
                await db.probe_write(timeout_ms=500)
            assert time.monotonic() - started < 1.5
        await db.probe_write()
    finally:
        await db.dispose()


@contextlib.contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """Files even root cannot write (``chattr +i``); skips where that is not allowed."""
    done: list[Path] = []
    try:
        for p in paths:
            if not shutil.which("chattr") or subprocess.run(
                    ["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                pytest.skip("chattr +i is not permitted here")
            done.append(p)
        yield
    finally:
        for p in done:
            subprocess.run(["chattr", "-i", str(p)], check=True)


@both
async def test_the_write_probe_fails_on_a_read_only_database(database_url: str) -> None:
    db = Database(database_url)
    try:
        await db.probe_write()
        if db.dialect == "sqlite":
            path = Path(sqlite_path_from_url(database_url))
            await db.dispose()  # connections opened from now on find the file read-only
            with immutable(path), pytest.raises(sa.exc.OperationalError, match="readonly"):
                await db.probe_write()
            await db.dispose()  # a connection opened read-only stays read-only
        else:
            name = make_url(database_url).database
            await _pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            await db.dispose()  # new sessions start read-only
            with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
                await db.probe_write()
            await _pg_admin(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            await db.dispose()
        await db.probe_write()
    finally:
        await db.dispose()
