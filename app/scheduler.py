"""Periodic jobs: one apscheduler ``AsyncIOScheduler`` (3.x) run as a lifespan service.

A job is a coroutine function run on the server's own event loop every ``interval``.
It never overlaps itself (``max_instances=1``), runs that fell behind are coalesced
into one and are never dropped as "missed", and an error is logged and leaves the job
scheduled for its next tick. Jobs must be idempotent and safe when several processes
run them at once: the scheduler is per process and does not coordinate.

Jobs the runtime registers (``app/main.py``; worker and ``all`` roles):

| Job | Interval | What |
|---|---|---|
| ``speculate-resync`` | ``SQ_SPECULATE_RESYNC_MS`` (0 = off) | a ``speculate`` wake-up per merge queue with active batches, one message id per queue per interval (``app/controllers/resync.py``) |
| ``queue-gc`` | ``SQ_QUEUE_GC_INTERVAL_MS`` | delete settled queue messages older than ``SQ_QUEUE_RETENTION_MS`` (``Broker.collect_garbage``; a delete of old rows, harmless when several processes run it) |
| ``freeze-thaw`` | ``SQ_FREEZE_RECHECK_MS`` | a ``speculate`` wake-up for a queue whose freeze without ``allow_builds`` ended by itself (``until``, a window's end), one message id per end across processes (``app/controllers/freeze.py``) |
| ``build-heartbeat:<queue>`` | the command runner's ``heartbeat_ms`` (2 s) | a command runner's heartbeat for its own unfinished builds, their logs so far, and cancels asked by other processes (``CommandBuildRunner.beat``; each process beats only for its own builds) |

Every role also runs ``metrics-refresh`` (``SQ_METRICS_REFRESH_MS``): the database state
behind ``/metrics`` is read in the background, so a scrape does not wait on it (a scrape
still reads it itself when the snapshot is older than the interval); and ``stall-check``
(``SQ_STALL_CHECK_MS``, off with ``SQ_STALL_THRESHOLD_MS=0``): the stall detector
(``app/views/stalls.py``) looks at each queue's oldest in-flight request, for the pages
and ``submitqueue_queue_stalled``; and, when a queue has a ``github`` change provider,
``github-resync`` (``SQ_GITHUB_RESYNC_MS``, 0 = off): each such queue lands the labelled
open pull requests a lost webhook delivery left out (``app/gateway/github.py``; the
change claims make it harmless when several processes run it).

Every run is counted in ``/metrics``: ``submitqueue_scheduler_job_runs_total{job,outcome}``,
``submitqueue_scheduler_job_duration_seconds{job}`` and
``submitqueue_scheduler_job_last_success_timestamp_seconds{job}``.

``start()`` begins firing (first run one interval after it); ``stop()`` stops firing,
waits up to ``shutdown_grace_ms`` for runs in progress, cancels the rest and shuts
the scheduler down. ``runs`` counts completed runs per job.
"""  # noqa: E501 - job tables read best unwrapped

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("submitqueue.scheduler")

Job = Callable[[], Awaitable[Any]]


JobObserver = Callable[[str, bool, float], None]  # job name, ok, seconds


class Scheduler:
    def __init__(self, *, shutdown_grace_ms: int = 5000,
                 on_run: JobObserver | None = None) -> None:
        """``on_run`` hears of every finished run (the metrics: runs, duration, last ok)."""
        self.shutdown_grace_ms = shutdown_grace_ms
        self.on_run = on_run
        self.runs: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._in_progress: set[asyncio.Task[Any]] = set()
        self._names: list[str] = []

    @property
    def jobs(self) -> list[str]:
        return list(self._names)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def every(self, name: str, interval_ms: int, job: Job) -> None:
        """Run ``job`` every ``interval_ms`` once started (``name`` is its unique id)."""
        if interval_ms <= 0:
            raise ValueError(f"interval of job {name!r} must be positive, got {interval_ms}")
        if name in self._names:
            raise ValueError(f"a job named {name!r} is already scheduled")
        self._scheduler.add_job(
            self._wrap(name, job), IntervalTrigger(seconds=interval_ms / 1000), id=name,
            name=name, max_instances=1, coalesce=True, misfire_grace_time=None)
        self._names.append(name)

    def _wrap(self, name: str, job: Job) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            task = asyncio.current_task()
            if task is not None:
                self._in_progress.add(task)
            began, ok = time.monotonic(), False
            try:
                await job()
                ok = True
                self.runs[name] = self.runs.get(name, 0) + 1
            except Exception:
                self.failures[name] = self.failures.get(name, 0) + 1
                log.exception("scheduled job failed; it runs again at its next tick",
                              extra={"job": name})
            finally:
                if task is not None:
                    self._in_progress.discard(task)
                if self.on_run is not None:
                    self.on_run(name, ok, time.monotonic() - began)
        return run

    async def start(self) -> None:
        if not self._scheduler.running:
            self._scheduler.start()

    async def stop(self) -> None:
        if not self._scheduler.running:
            return
        self._scheduler.pause()  # no new runs from here on
        running = set(self._in_progress)
        if running:
            _, late = await asyncio.wait(running, timeout=self.shutdown_grace_ms / 1000)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        self._scheduler.shutdown(wait=False)  # takes effect on the loop's next turn
        for _ in range(1000):
            if not self._scheduler.running:
                return
            await asyncio.sleep(0.001)
        log.warning("the scheduler did not confirm its shutdown")
