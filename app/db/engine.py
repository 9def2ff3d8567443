"""Async SQLAlchemy engines for SQLite and PostgreSQL, configured the same way.

SQLite: WAL journal, ``synchronous=NORMAL``, ``busy_timeout``, foreign keys on;
transactions begin with ``BEGIN IMMEDIATE`` (so two writers never fail on a
lock upgrade) unless opened read-only through ``Database.read()``, which uses a
deferred ``BEGIN`` and never blocks writers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SQLITE_BUSY_TIMEOUT_MS = 10_000


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def ensure_sqlite_dir(url: str) -> None:
    """Create the folder of a SQLite file (``./var`` by default) if it is missing."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    if is_sqlite(url):
        ensure_sqlite_dir(url)
        engine = create_async_engine(url, echo=echo)
        _configure_sqlite(engine)
        return engine
    # No pre-ping (a round trip per checkout): a dropped connection fails its unit of
    # work with a connection error, which the queue classifies as retryable.
    return create_async_engine(url, echo=echo, pool_size=10, max_overflow=10, pool_recycle=1800)


def _configure_sqlite(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite's own transaction handling is turned off; we emit BEGIN ourselves.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


class Database:
    """The application's database: ``write()`` and ``read()`` give a session in a
    transaction that commits when the block succeeds and rolls back otherwise.

    On SQLite, writers of this process take turns on an asyncio lock before they
    begin: SQLite allows one writer at a time anyway, and waiting here costs nothing
    while waiting in SQLite's busy handler sleeps for up to 100 ms at a time. The
    queue's SQLite backend can share the same lock (``write_lock``). Never publish to
    the queue inside a ``write()`` block.
    """

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine = create_engine(url, echo=echo)
        self.dialect = self.engine.dialect.name
        self.write_lock: asyncio.Lock | None = asyncio.Lock() if self.dialect == "sqlite" else None
        self._writer = async_sessionmaker(self.engine, expire_on_commit=False)
        reader_bind = self.engine.execution_options(sqlite_begin="DEFERRED")
        self._reader = async_sessionmaker(reader_bind, expire_on_commit=False)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        if self.write_lock is None:
            async with self._writer() as session, session.begin():
                yield session
            return
        async with self.write_lock, self._writer() as session, session.begin():
            yield session

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._reader() as session, session.begin():
            yield session

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")

    async def dispose(self) -> None:
        await self.engine.dispose()
