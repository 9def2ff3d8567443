"""Async SQLAlchemy engines for SQLite and PostgreSQL, configured the same way.

SQLite: WAL journal, ``synchronous=NORMAL``, ``busy_timeout``, foreign keys on;
transactions begin with ``BEGIN IMMEDIATE`` (so two writers never fail on a
lock upgrade) unless opened read-only through ``Database.read()``, which uses a
deferred ``BEGIN`` and never blocks writers.

**Bounded waits.** A writer gets the SQLite write lock within ``lock_timeout_ms``
(:data:`WRITE_LOCK_TIMEOUT_MS`, 4 s) or not at all: the wait for this process's
writers (the asyncio lock) and SQLite's busy handler (another process or connection
holding the file) share that one budget, and running out raises ``Busy`` before
anything is written (HTTP 503 with ``Retry-After``). Waiting for a pooled connection
is bounded by :data:`POOL_TIMEOUT_S` on both databases. ``probe_write()`` is the
readiness check that the database takes writes at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.db import sqlite_inline
from app.domain.errors import Busy

SQLITE_BUSY_TIMEOUT_MS = 10_000  # readers; a writer's wait is its remaining budget
WRITE_LOCK_TIMEOUT_MS = 4_000
PROBE_TIMEOUT_MS = 2_000
POOL_TIMEOUT_S = 4.0
# Connections kept open, and opened beyond them at a peak (closed again after). A pool
# whose peak connections are overflow closes and reopens them all the time: 5 kept + 10
# on SQLite reconnected ~0.7 times per landed request (each aiosqlite connection is also
# a thread); 20 kept: 0.03 (bench/pipeline_bench.py --burst 200). PostgreSQL keeps its
# 20 (as many as 10 + 10 before, so docs/operating.md's 31 per process holds) and opens
# none beyond them: a 21st session waits (POOL_TIMEOUT_S) rather than reconnect.
POOL_SIZE = 20
SQLITE_OVERFLOW = 10
_BUSY_STEP_MS = 100  # a writer's busy_timeout is set in steps, so most writes skip the PRAGMA


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
        path = make_url(url).database or ""
        inline = {"async_creator": sqlite_inline.connector(path)} \
            if path and path != ":memory:" else {}
        engine = create_async_engine(url, echo=echo, pool_timeout=POOL_TIMEOUT_S,
                                     pool_size=POOL_SIZE, max_overflow=SQLITE_OVERFLOW,
                                     **inline)
        _configure_sqlite(engine)
        return engine
    # No pre-ping (a round trip per checkout): a dropped connection fails its unit of
    # work with a connection error, which the queue classifies as retryable.
    return create_async_engine(url, echo=echo, pool_size=POOL_SIZE, max_overflow=0,
                               pool_recycle=1800, pool_timeout=POOL_TIMEOUT_S)


_KINDS = {"select": "select", "insert": "insert", "update": "update", "delete": "delete",
          "begin": "begin", "commit": "commit", "rollback": "rollback", "with": "select",
          "pragma": "pragma", "savepoint": "savepoint", "release": "savepoint"}


@dataclass
class DbStats:
    """What this process asked of the database through SQLAlchemy, since it started:
    statements by kind (their first word), transactions ended, connections opened.
    Counted by engine events (``count_into``); ``/metrics`` reports them."""

    statements: Counter[str] = field(default_factory=Counter)
    transactions: Counter[str] = field(default_factory=Counter)  # commit | rollback
    connections: int = 0


def count_into(engine: AsyncEngine, stats: DbStats) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "before_cursor_execute")
    def _on_statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        word = statement.lstrip()[:9].split(None, 1)
        stats.statements[_KINDS.get(word[0].lower(), "other") if word else "other"] += 1

    @event.listens_for(sync_engine, "commit")
    def _on_commit(_conn: Any) -> None:
        stats.transactions["commit"] += 1

    @event.listens_for(sync_engine, "rollback")
    def _on_rollback(_conn: Any) -> None:
        stats.transactions["rollback"] += 1

    @event.listens_for(sync_engine, "connect")
    def _on_connect(_dbapi_conn: Any, _record: Any) -> None:
        stats.connections += 1


def _configure_sqlite(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite's own transaction handling is turned off; we emit BEGIN ourselves.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not _inline(dbapi_conn):  # an inline connection waits off the loop instead
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        mode = options.get("sqlite_begin", "IMMEDIATE")
        busy_ms = options.get("sqlite_busy_ms")  # a writer's budget; readers keep what is set
        driver = _inline(conn.connection.dbapi_connection)
        if driver is not None:
            driver.busy_ms = SQLITE_BUSY_TIMEOUT_MS if busy_ms is None else int(busy_ms)
        elif busy_ms is not None and conn.info.get("sq_busy_ms") != busy_ms:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(busy_ms)}")
            conn.info["sq_busy_ms"] = busy_ms
        conn.exec_driver_sql(f"BEGIN {mode}")


def _inline(dbapi_conn: Any) -> sqlite_inline.InlineConnection | None:
    driver = getattr(dbapi_conn, "driver_connection", None)
    return driver if isinstance(driver, sqlite_inline.InlineConnection) else None


def _busy(timeout_ms: int) -> Busy:
    return Busy(f"the database stayed locked by other writers for {timeout_ms / 1000:g} s; "
                "nothing was written")


def is_lock_error(exc: BaseException) -> bool:
    """SQLite's "database is locked" / "busy" (its busy handler gave up)."""
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, sqlite3.OperationalError):
            return sqlite_inline.is_busy(cur)
        cur = cur.__cause__ or cur.__context__
    return False


class Database:
    """The application's database: ``write()`` and ``read()`` give a session in a
    transaction that commits when the block succeeds and rolls back otherwise.

    On SQLite, writers of this process take turns on an asyncio lock before they
    begin: SQLite allows one writer at a time anyway, and waiting here costs nothing
    while waiting in SQLite's busy handler sleeps for up to 100 ms at a time. The
    queue's SQLite backend can share the same lock (``write_lock``). Never publish to
    the queue through the broker inside a ``write()`` block (its SQLite backend waits
    for the lock the block holds); publish through the block's own connection instead
    (the transactional outbox, ``Deps.transaction`` in ``app/controllers/common.py``).

    SQLite statements run on the event loop's thread (``app/db/sqlite_inline.py``): a
    transaction never yields to the loop between statements, so the lock is held only
    while SQLite works.
    """

    def __init__(self, url: str, *, echo: bool = False,
                 lock_timeout_ms: int = WRITE_LOCK_TIMEOUT_MS) -> None:
        self.url = url
        self.engine = create_engine(url, echo=echo)
        self.stats = DbStats()
        count_into(self.engine, self.stats)
        self.dialect = self.engine.dialect.name
        self.write_lock: asyncio.Lock | None = asyncio.Lock() if self.dialect == "sqlite" else None
        self.lock_timeout_ms = lock_timeout_ms
        self._writer = async_sessionmaker(self.engine, expire_on_commit=False)
        # Reads begin deferred: they never wait for SQLite's write lock (WAL).
        self.read_engine = self.engine.execution_options(sqlite_begin="DEFERRED")
        self._reader = async_sessionmaker(self.read_engine, expire_on_commit=False)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        if self.write_lock is None:
            async with self._writer() as session, session.begin():
                yield session
            return
        async with self._write_turn(self.lock_timeout_ms) as budget_ms, \
                self._writer() as session, session.begin():
            try:  # BEGIN IMMEDIATE now, so a busy file fails here, before any write
                await session.connection(execution_options={"sqlite_busy_ms": budget_ms})
            except sa_exc.OperationalError as exc:
                if is_lock_error(exc):
                    raise _busy(self.lock_timeout_ms) from exc
                raise
            yield session

    @asynccontextmanager
    async def _write_turn(self, timeout_ms: int) -> AsyncIterator[int]:
        """This process's SQLite write lock within ``timeout_ms``; yields the milliseconds
        left for SQLite's busy handler (in :data:`_BUSY_STEP_MS` steps)."""
        assert self.write_lock is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.write_lock.acquire()
        except TimeoutError:
            raise _busy(timeout_ms) from None
        try:
            left = timeout_ms - int((loop.time() - started) * 1000)
            yield max(_BUSY_STEP_MS, min(timeout_ms, left + -left % _BUSY_STEP_MS))
        finally:
            self.write_lock.release()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._reader() as session, session.begin():
            yield session

    async def execute_raw(self, session: AsyncSession, sql: str,
                          params: Any) -> list[dict[str, Any]]:
        """Run one statement, in the driver's own parameter style, on ``session``'s
        connection and in its transaction, straight through the driver: SQLAlchemy's
        statement machinery is skipped (it costs more than the statement on these hot,
        already-compiled queue statements). Counted in ``stats`` like any other. Falls
        back to ``exec_driver_sql`` where the driver connection is not one it knows or
        no transaction was begun on it yet."""
        conn = await session.connection()
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        adapter: Any = raw.dbapi_connection
        if isinstance(driver, sqlite_inline.InlineConnection):
            self._count(sql)
            cur = await driver.execute(sql, params)
            cols = [c[0] for c in cur.description] if cur.description else []
            return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()] \
                if cols else []
        mutex = getattr(adapter, "_execute_mutex", None)
        if self.dialect == "postgresql" and mutex is not None and \
                getattr(adapter, "_transaction", None) is not None:
            self._count(sql)
            async with mutex:
                return [dict(r) for r in await driver.fetch(sql, *params)]
        result = await conn.exec_driver_sql(sql, params)  # counted by the engine's event
        return [dict(r._mapping) for r in result] if result.returns_rows else []

    def _count(self, sql: str) -> None:
        word = sql.lstrip()[:9].split(None, 1)
        self.stats.statements[_KINDS.get(word[0].lower(), "other") if word else "other"] += 1

    async def ping(self) -> None:
        """A read: on SQLite it does not wait for another writer's lock."""
        async with self.read_engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")

    async def probe_write(self, *, timeout_ms: int = PROBE_TIMEOUT_MS) -> None:
        """Raise unless the database takes a write now: a write transaction that updates
        no row of ``counters`` and rolls back, within ``timeout_ms``. Fails on a
        read-only database or transaction (PostgreSQL ``default_transaction_read_only``,
        a standby; a SQLite file opened read-only), and on a SQLite file whose write lock
        another writer holds for longer (``Busy``)."""
        if self.write_lock is None:
            async with self.engine.connect() as conn:
                await conn.begin()
                await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(timeout_ms)}")
                await conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
                await _touch(conn)
                await conn.rollback()
            return
        async with self._write_turn(timeout_ms) as budget_ms, self.engine.connect() as conn:
            conn = await conn.execution_options(sqlite_busy_ms=budget_ms)
            try:
                await conn.begin()
            except sa_exc.OperationalError as exc:
                if is_lock_error(exc):
                    raise _busy(timeout_ms) from exc
                raise
            await _touch(conn)
            await conn.rollback()

    async def dispose(self) -> None:
        await self.engine.dispose()


async def _touch(conn: AsyncConnection) -> None:
    # A write statement that matches no row: refused by a read-only database, free otherwise.
    await conn.exec_driver_sql("UPDATE counters SET value = value WHERE 1 = 0")
