"""Drivers that run queue operations (``app/queue/ops.py``) against a database.

- ``SqliteBackend``: one ``sqlite3`` connection owned by one thread. Operations
  submitted concurrently are run together in one ``BEGIN IMMEDIATE`` transaction
  (group commit), each inside its own savepoint so one failing operation does not
  undo the others. WAL journal, ``synchronous=NORMAL``, ``busy_timeout``. An
  operation waits at most ``lock_timeout_ms`` (4 s) for the write lock — the shared
  asyncio lock and SQLite's busy handler together — or fails with ``QueueBusy``
  without being run.
- ``PostgresBackend``: an asyncpg pool; each operation runs in its own
  transaction (an operation of one statement runs in autocommit: the same thing in
  one round trip instead of three); a listener connection turns ``NOTIFY`` into
  local wake-ups so a publish in one process wakes consumers in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from app.queue.dialect import POSTGRES, SQLITE, Dialect, Stmt, to_positional
from app.queue.errors import QueueBusy
from app.queue.ops import Op

T = TypeVar("T")
NOTIFY_CHANNEL = "submitqueue_queue"


class Backend(Protocol):
    dialect: Dialect
    ops_run: int  # operations run since start (``/metrics``: submitqueue_queue_operations)

    async def start(self, on_notify: Callable[[str], None]) -> None: ...

    async def close(self) -> None: ...

    async def run(self, op: Op[T]) -> T: ...


def sqlite_path_from_url(url: str) -> str:
    """``sqlite+aiosqlite:///./var/x.db`` -> ``./var/x.db`` (``:memory:`` is refused)."""
    if not url.startswith("sqlite"):
        raise ValueError(f"not a SQLite URL: {url!r}")
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        raise ValueError("the queue needs a SQLite file, not an in-memory database")
    return path


def postgres_dsn_from_url(url: str) -> str:
    """``postgresql+asyncpg://u@h/db`` -> ``postgresql://u@h/db`` for asyncpg."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in {"postgresql", "postgres"}:
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    return parts._replace(scheme="postgresql").geturl()


def _drive_sync(conn: sqlite3.Connection, op: Op[T]) -> T:
    rows: list[dict[str, Any]] | None = None
    try:
        stmt = op.send(None)  # type: ignore[arg-type]
        while True:
            cur = conn.execute(stmt.sql, stmt.params)
            cols = [c[0] for c in cur.description] if cur.description else []
            rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()] if cols else []
            stmt = op.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class SqliteBackend:
    dialect = SQLITE

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int = 10_000,
        max_batch: int = 512,
        write_lock: asyncio.Lock | None = None,
        lock_timeout_ms: int = 4_000,
    ) -> None:
        """``write_lock``: an asyncio lock shared with the process's other writers of the
        same file, so they take turns here instead of in SQLite's sleeping busy handler.
        ``lock_timeout_ms``: how long an operation may wait for its turn (the lock, then
        SQLite's busy handler, at most ``busy_timeout_ms``) from when it was submitted."""
        self.path = path
        self._write_lock = write_lock
        self._busy_timeout_ms = busy_timeout_ms
        self._lock_timeout_ms = lock_timeout_ms
        self._busy_set = busy_timeout_ms
        self._max_batch = max_batch
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._pending: list[tuple[Op[Any], asyncio.Future[Any], float]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._thread_id: int | None = None
        self.ops_run = 0  # operations submitted (each one hop to the queue's thread or less)

    async def start(self, on_notify: Callable[[str], None]) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sq-sqlite")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open)

    def _open(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        self._conn = conn
        self._thread_id = threading.get_ident()

    async def close(self) -> None:
        if self._drainer is not None:
            with contextlib.suppress(Exception):
                await self._drainer
        if self._executor is not None:
            conn = self._conn
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
            self._executor.shutdown(wait=True)
        self._executor = None
        self._conn = None

    async def run(self, op: Op[T]) -> T:
        if self._executor is None:
            op.close()
            raise RuntimeError("the SQLite queue backend is not started")
        self.ops_run += 1
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._pending.append((op, fut, loop.time() + self._lock_timeout_ms / 1000))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            assert self._executor is not None
            deadline = min(d for _, _, d in batch)
            try:
                async with self._turn(deadline - loop.time()):
                    left_ms = max(1, int((deadline - loop.time()) * 1000))
                    busy_ms = min(self._busy_timeout_ms, left_ms + -left_ms % 100)
                    outcomes = await loop.run_in_executor(
                        self._executor, self._run_batch, [op for op, _, _ in batch], busy_ms
                    )
            except BaseException as exc:  # commit failed: every operation failed
                outcomes = [(False, exc)] * len(batch)
            for (_, fut, _), (ok, value) in zip(batch, outcomes, strict=True):
                if fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)

    @contextlib.asynccontextmanager
    async def _turn(self, timeout_s: float) -> AsyncIterator[None]:
        if self._write_lock is None:
            yield
            return
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._write_lock.acquire()
        except TimeoutError:
            raise QueueBusy(f"the database's write lock stayed taken for "
                            f"{self._lock_timeout_ms / 1000:g} s; nothing was stored") from None
        try:
            yield
        finally:
            self._write_lock.release()

    def _run_batch(self, ops: list[Op[Any]], busy_ms: int) -> list[tuple[bool, Any]]:
        conn = self._conn
        assert conn is not None
        out: list[tuple[bool, Any]] = []
        if busy_ms != self._busy_set:  # the rest of the budget; only set when it changed
            conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            self._busy_set = busy_ms
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                conn.execute("SAVEPOINT sq_op")
                try:
                    value = _drive_sync(conn, op)
                except Exception as exc:
                    conn.execute("ROLLBACK TO sq_op")
                    conn.execute("RELEASE sq_op")
                    out.append((False, exc))
                else:
                    conn.execute("RELEASE sq_op")
                    out.append((True, value))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return out


async def _keep_session(_conn: Any) -> None:
    """Reset hook of the pool: the queue leaves no session state behind (no SET,
    LISTEN, cursors or session-level locks; its advisory locks end with their
    transaction), so asyncpg's reset query, a round trip on every release, is skipped.
    asyncpg still rolls back a transaction left open before calling this."""


class PostgresBackend:
    dialect = POSTGRES

    def __init__(self, dsn: str, *, min_size: int = 2, max_size: int = 10) -> None:
        self.dsn = dsn
        self._min, self._max = min_size, max_size
        self._pool: Any = None
        self.ops_run = 0
        self._listener: Any = None
        self._listen_task: asyncio.Task[None] | None = None
        self._on_notify: Callable[[str], None] | None = None
        self._positional: dict[str, tuple[str, list[str]]] = {}
        self._closing = False

    async def start(self, on_notify: Callable[[str], None]) -> None:
        import asyncpg

        self._on_notify = on_notify
        self._pool = await asyncpg.create_pool(
            self.dsn, min_size=self._min, max_size=self._max, reset=_keep_session
        )
        self._listen_task = asyncio.create_task(self._listen_forever())

    async def _listen_forever(self) -> None:
        import asyncpg

        def callback(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            if self._on_notify is not None:
                self._on_notify(payload)

        while not self._closing:
            try:
                self._listener = await asyncpg.connect(self.dsn)
                await self._listener.add_listener(NOTIFY_CHANNEL, callback)
                while not self._closing and not self._listener.is_closed():
                    await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)  # polling keeps working meanwhile
            finally:
                if self._listener is not None and not self._listener.is_closed():
                    with contextlib.suppress(Exception):
                        await self._listener.close()

    async def close(self) -> None:
        self._closing = True
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listen_task
        if self._pool is not None:
            await self._pool.close()
        self._pool = None

    def _prepare(self, stmt: Stmt) -> tuple[str, list[Any]]:
        cached = self._positional.get(stmt.sql)
        if cached is None:
            cached = to_positional(stmt.sql)
            self._positional[stmt.sql] = cached
        sql, order = cached
        return sql, [stmt.params[name] for name in order]

    async def run(self, op: Op[T]) -> T:
        if self._pool is None:
            op.close()
            raise RuntimeError("the PostgreSQL queue backend is not started")
        self.ops_run += 1
        async with self._pool.acquire() as conn:
            try:
                stmt = op.send(None)  # type: ignore[arg-type]
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if stmt.last:  # one statement: a transaction of its own (autocommit)
                sql, args = self._prepare(stmt)
                rows = [dict(r) for r in await conn.fetch(sql, *args)]
                try:
                    op.send(rows)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                op.close()
                raise RuntimeError("a queue operation went on after its last statement")
            async with conn.transaction():
                try:
                    while True:
                        sql, args = self._prepare(stmt)
                        rows = [dict(r) for r in await conn.fetch(sql, *args)]
                        stmt = op.send(rows)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


def backend_for_url(url: str, *, sqlite_write_lock: asyncio.Lock | None = None) -> Backend:
    if url.startswith("sqlite"):
        return SqliteBackend(sqlite_path_from_url(url), write_lock=sqlite_write_lock)
    return PostgresBackend(postgres_dsn_from_url(url))
