"""pgqueuer and procrastinate behind the benchmark's ``System`` interface.

Written against pgqueuer 1.6 and procrastinate 3.10 (the ``bench`` extra). Each gets its
own fresh database; publishers and each consumer use their own connections, as separate
processes would.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench._queue_workload import OnStart, Workload


class PgQueuerSystem:
    """pgqueuer: no per-partition order; each consumer is a QueueManager on its own
    connection, dequeuing batches of ``batch_size`` (its default, 10)."""

    name = "pgqueuer"
    ordered = False

    def __init__(self, dsn: str, w: Workload, *, batch_size: int = 10) -> None:
        self.dsn, self.w, self.batch_size = dsn, w, batch_size
        self.variant = f"batch {batch_size}, {w.consumers} queue managers"
        self._pool: Any = None
        self._queries: Any = None
        self._conns: list[Any] = []
        self._managers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, on_start: OnStart) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

        conn = await asyncpg.connect(self.dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=self.w.publishers)
        self._queries = Queries.from_asyncpg_pool(self._pool)

        async def handle(job: Job) -> None:
            phase, p, i = (job.payload or b"").decode().split(":")
            on_start(phase, int(p), int(i))

        for _ in range(self.w.consumers):
            conn = await asyncpg.connect(self.dsn)
            self._conns.append(conn)
            manager = QueueManager(Queries(AsyncpgDriver(conn)))
            manager.entrypoint("bench", accepts_context=False)(handle)
            self._managers.append(manager)
            self._tasks.append(asyncio.create_task(manager.run(
                batch_size=self.batch_size, dequeue_timeout=timedelta(seconds=5))))

    async def publish(self, phase: str, p: int, i: int) -> None:
        await self._queries.enqueue("bench", f"{phase}:{p}:{i}".encode())

    async def settled(self, published: int) -> bool:
        # Completed jobs leave the queue table when the worker's status buffer is flushed.
        return int(await self._pool.fetchval("SELECT count(*) FROM pgqueuer")) == 0

    def problems(self) -> str:
        return ""

    async def close(self) -> None:
        for manager in self._managers:
            manager.shutdown.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=15)
        for task in self._tasks:
            task.cancel()
        for conn in self._conns:
            await conn.close()
        if self._pool is not None:
            await self._pool.close()


class ProcrastinateSystem:
    """procrastinate: one worker (App with its own pool) per consumer, LISTEN/NOTIFY on;
    with ``lock`` every job is deferred with ``lock=<partition>`` (serialised, in order)."""

    name = "procrastinate"

    def __init__(self, dsn: str, w: Workload, *, lock: bool) -> None:
        self.dsn, self.w, self.lock = dsn, w, lock
        self.ordered = lock
        self.variant = (
            f"{'lock=<partition>' if lock else 'no lock'}, {w.consumers} workers x "
            f"{w.concurrency}"
        )
        self._apps: list[Any] = []
        self._task: Any = None
        self._workers: list[asyncio.Task[None]] = []

    def _app(self, handler: Any, pool_size: int) -> Any:
        import procrastinate

        connector = procrastinate.PsycopgConnector(conninfo=self.dsn, min_size=1,
                                                   max_size=pool_size)
        app = procrastinate.App(connector=connector)
        task = app.task(name="bench", queue="bench")(handler)
        self._apps.append(app)
        return app, task

    async def start(self, on_start: OnStart) -> None:
        async def deferred_only(phase: str, p: int, i: int) -> None:
            raise AssertionError("the publishers' app runs no worker")

        async def handle(phase: str, p: int, i: int) -> None:
            on_start(phase, p, i)

        publisher, self._task = self._app(deferred_only, self.w.publishers + 1)
        await publisher.open_async()
        await publisher.schema_manager.apply_schema_async()
        for n in range(self.w.consumers):
            app, _ = self._app(handle, self.w.concurrency + 3)
            await app.open_async()
            self._workers.append(asyncio.create_task(app.run_worker_async(
                queues=["bench"], name=f"bench-{n}", concurrency=self.w.concurrency,
                install_signal_handlers=False, fetch_job_polling_interval=5.0)))

    async def publish(self, phase: str, p: int, i: int) -> None:
        deferrer = self._task.configure(lock=f"p{p}") if self.lock else self._task.configure()
        await deferrer.defer_async(phase=phase, p=p, i=i)

    async def settled(self, published: int) -> bool:
        row = await self._apps[0].connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )
        return int(row["n"]) == 0

    def problems(self) -> str:
        return ""

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        for worker in self._workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(worker, 15)
        for app in self._apps:
            with contextlib.suppress(Exception):
                await app.close_async()
