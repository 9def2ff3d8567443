"""The scheduler service on its own: periodic runs, errors keep the job alive, and
``stop`` lets a run in progress finish, then fires nothing more."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.scheduler import Scheduler
from tests.support.polls import wait_for


async def test_a_job_runs_every_interval_and_a_failure_does_not_stop_it() -> None:
    calls: list[float] = []

    async def job() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("boom")

    heard: list[tuple[str, bool]] = []
    scheduler = Scheduler(on_run=lambda name, ok, seconds: heard.append((name, ok)))
    scheduler.every("tick", 50, job)
    assert scheduler.jobs == ["tick"] and not scheduler.running
    await scheduler.start()
    try:
        assert scheduler.running
        await wait_for(lambda: len(calls) >= 4, "len(calls) >= 4")
    finally:
        await scheduler.stop()
    assert scheduler.failures["tick"] == 1 and scheduler.runs["tick"] >= 3
    assert not scheduler.running
    # the observer (the metrics) hears every run, the failed one as not ok
    assert heard[:2] == [("tick", True), ("tick", False)] and len(heard) == len(calls)


async def test_stop_waits_for_the_run_in_progress_and_then_nothing_fires() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[bool] = []

    async def slow() -> None:
        started.set()
        await release.wait()
        finished.append(True)

    scheduler = Scheduler(shutdown_grace_ms=5000)
    scheduler.every("slow", 20, slow)
    await scheduler.start()
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.create_task(scheduler.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done()  # waiting for the run
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert finished == [True] and not scheduler.running
    assert scheduler.runs["slow"] == 1  # max_instances=1: no overlapping second run


async def test_stop_cancels_a_run_that_outlives_the_grace() -> None:
    cancelled: list[bool] = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    scheduler = Scheduler(shutdown_grace_ms=50)
    scheduler.every("stuck", 20, stuck)
    await scheduler.start()
    await wait_for(lambda: bool(scheduler._in_progress), "bool(scheduler._in_progress)")
    await asyncio.wait_for(scheduler.stop(), 5)
    assert cancelled == [True]


def test_bad_jobs_are_refused() -> None:
    scheduler = Scheduler()

    async def job() -> None:
        return None

    with pytest.raises(ValueError, match="positive"):
        scheduler.every("x", 0, job)
    scheduler.every("x", 10, job)
    with pytest.raises(ValueError, match="already scheduled"):
        scheduler.every("x", 10, job)
