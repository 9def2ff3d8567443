"""SQLite statements run on the event loop's own thread: an aiosqlite-shaped connection
for SQLAlchemy's aiosqlite dialect (``create_async_engine(..., async_creator=connect)``).

Why: aiosqlite runs every call in a thread of its own and wakes the event loop with the
result, so each statement costs a thread hand-off and a turn of the loop (measured
≈0.47 ms of event-loop time per statement against ≈0.04 ms for the queue's own
backend; the hand-off was 23 % of the process's CPU under load). On SQLite a write
transaction holds this process's write lock (``Database.write``) through every one of
those turns, so the lock's hold time, not SQLite, bounded throughput. A statement here
runs to completion where it is awaited: it never suspends, the loop runs nothing else
in the middle of a transaction, and a write transaction holds the lock only as long as
SQLite works.

What keeps the loop from blocking:

- the connection's ``busy_timeout`` is 0, so a statement that finds the file locked
  (another process's writer; the queue's own backend takes this process's asyncio write
  lock first, so it never does) fails at once; it is then run again in a worker thread
  with the waiting budget SQLAlchemy's ``begin`` hook set (:data:`BUSY_MS`, or the
  writer's remaining budget), and only that statement waits, off the loop;
- in WAL mode readers never wait for writers, and a writer that holds ``BEGIN
  IMMEDIATE`` needs no further lock until it commits (commits do not wait for readers),
  so the fallback is taken only by ``BEGIN IMMEDIATE`` itself in practice.

The cost: a long statement (a big read) holds the loop while SQLite works, as the
Python half of every statement did already; SQLite's part of a statement is microseconds
for the point reads and conditional writes of the pipeline.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

BUSY_MS = 10_000  # a statement's wait in the worker thread unless a writer set its budget


def is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class InlineCursor:
    """The async cursor aiosqlite's adapter expects; every method completes at once."""

    def __init__(self, owner: InlineConnection) -> None:
        self._owner = owner
        self._cur = owner._conn.cursor()

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def description(self) -> Any:
        return self._cur.description

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cur.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cur.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cur.arraysize = value

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> InlineCursor:
        await self._owner._run(lambda: self._cur.execute(sql, parameters))
        return self

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> InlineCursor:
        seq = list(rows)
        await self._owner._run(lambda: self._cur.executemany(sql, seq))
        return self

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cur.fetchmany(self._cur.arraysize if size is None else size)

    async def nextset(self) -> None:
        return None

    async def close(self) -> None:
        self._cur.close()


class _Now:
    """aiosqlite's request queue as the adapter's ``isolation_level`` setter uses it:
    the function runs now and its future is resolved."""

    def put_nowait(self, item: tuple[asyncio.Future[Any], Callable[[], Any]]) -> None:
        future, function = item
        try:
            future.set_result(function())
        except Exception as exc:
            future.set_exception(exc)


class InlineConnection:
    """The aiosqlite ``Connection`` surface SQLAlchemy's adapter uses."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._connection: sqlite3.Connection | None = conn  # the adapter checks it
        self._tx = _Now()
        self.busy_ms = BUSY_MS  # the fallback's wait; the begin hook sets a writer's
        self._waiter: asyncio.Future[Any] | None = None  # a statement in a worker thread

    @property
    def isolation_level(self) -> str | None:
        return self._conn.isolation_level

    @isolation_level.setter
    def isolation_level(self, value: str | None) -> None:
        self._conn.isolation_level = value  # type: ignore[assignment]

    async def _run(self, call: Callable[[], Any]) -> Any:
        await self._settled()
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
        waiting = asyncio.get_running_loop().run_in_executor(None, self._waiting, call)
        self._waiter = waiting
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The caller gave up (a timeout, a shutdown): the statement still runs in
            # its thread, so stop its wait there; nothing else touches the connection
            # until it has returned (``_settled``; a close waits for it too).
            self._conn.interrupt()
            raise

    async def _settled(self) -> None:
        """Wait for a statement still running in a worker thread (interrupted)."""
        waiting = self._waiter
        if waiting is not None and not waiting.done():
            await asyncio.wait([waiting])

    def _waiting(self, call: Callable[[], Any]) -> Any:
        self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_ms)}")
        try:
            return call()
        finally:
            self._conn.execute("PRAGMA busy_timeout = 0")

    def cursor(self) -> InlineCursor:
        return InlineCursor(self)

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> InlineCursor:
        cur = InlineCursor(self)
        return await cur.execute(sql, parameters)

    async def commit(self) -> None:
        await self._run(self._conn.commit)

    async def rollback(self) -> None:
        await self._settled()
        self._conn.rollback()

    async def close(self) -> None:
        self.stop()

    async def create_function(self, *args: Any, **kw: Any) -> None:
        self._conn.create_function(*args, **kw)

    def stop(self) -> None:
        """Close now, or as soon as a statement running in a worker thread returns
        (closing a connection under a running statement crashes the process)."""
        if self._connection is None:
            return
        self._connection = None
        waiting = self._waiter
        if waiting is not None and not waiting.done():
            self._conn.interrupt()
            waiting.add_done_callback(lambda _: self._conn.close())
        else:
            self._conn.close()


def connector(path: str) -> Callable[[], Any]:
    """The ``async_creator`` for a SQLite file at ``path``."""

    async def connect() -> InlineConnection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 0")
        return InlineConnection(conn)

    return connect
