"""Start-up and shut-down of the runtime's services (an ``AsyncExitStack``): a service
that fails to start leaves none running, and ``stop()`` is safe after any start."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.main import Runtime
from app.settings import Settings
from tests.e2e.harness import ROOT
from tests.support.races import until

SERVICES = {  # the attribute whose start() is made to fail
    "broker": ("broker", "start"),
    "command runners": ("extensions", "start"),
    "consumers": ("consumers", "start"),
    "scheduler": ("scheduler", "start"),
}


def _runtime(tmp_path: Path, **kw: Any) -> Runtime:
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    settings = Settings(_env_file=None,  # type: ignore[call-arg]
                        database_url=f"sqlite+aiosqlite:///{tmp_path / 'sq.db'}",
                        queues_file=tmp_path / "queues.yaml", speculate_resync_ms=1000, **kw)
    return Runtime(settings)


def _running(rt: Runtime) -> dict[str, object]:
    """Everything that would still be alive after a stop, by service."""
    return {
        "consumers": rt.consumers.running,
        "scheduler": rt.scheduler.running,
        "broker": rt.broker._started,
        "command runners": len(rt.extensions._started),
        "tasks": sorted(t.get_name() for t in asyncio.all_tasks()
                        if t is not asyncio.current_task() and not t.done()),
    }


NOTHING = {"consumers": 0, "scheduler": False, "broker": False, "command runners": 0,
           "tasks": []}


@pytest.mark.parametrize("failing", list(SERVICES))
async def test_a_service_that_fails_to_start_leaves_none_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    rt = _runtime(tmp_path)
    attr, method = SERVICES[failing]

    async def refuse() -> None:
        raise OSError(f"{failing} cannot start")

    monkeypatch.setattr(getattr(rt, attr), method, refuse)
    with pytest.raises(OSError, match=f"{failing} cannot start"):
        await rt.start()
    await asyncio.sleep(0)  # let cancelled tasks finish
    assert _running(rt) == NOTHING
    assert rt.started is False
    await rt.stop()  # a second stop is harmless
    assert _running(rt) == NOTHING


async def test_a_full_start_runs_everything_and_stop_ends_it(tmp_path: Path) -> None:
    """The control case: without a failure every service runs (so the check above can
    tell running from stopped), and stop() ends them all."""
    rt = _runtime(tmp_path)
    await rt.start()
    try:
        alive = _running(rt)
        assert alive["consumers"] == len(rt.consumers.consumers) > 0
        assert alive["scheduler"] is True and alive["broker"] is True
        assert alive["command runners"] >= 1  # the example's sandbox queue
        assert alive["tasks"]
    finally:
        await rt.stop()
    await asyncio.sleep(0)
    assert _running(rt) == NOTHING


async def test_the_periodic_jobs_run_on_the_one_scheduler_and_show_in_metrics(
    tmp_path: Path,
) -> None:
    """Queue GC, the resync, each command runner's heartbeat and the metrics refresh are
    jobs of the runtime's scheduler (no service runs a loop of its own), and each run is
    counted in /metrics."""
    rt = _runtime(tmp_path, metrics_refresh_ms=100, queue_gc_interval_ms=1000,
                  stall_check_ms=500)
    assert rt.scheduler.jobs == ["metrics-refresh", "stall-check", "speculate-resync",
                                 "outage-notify", "queue-gc", "build-heartbeat:sandbox",
                                 "freeze-thaw"]
    await rt.start()
    try:
        await until("every job ran", lambda: _all_ran(rt), timeout=20)
        text = rt.metrics.render(None)[0].decode()
    finally:
        await rt.stop()
    for job in rt.scheduler.jobs:
        assert f'submitqueue_scheduler_job_runs_total{{job="{job}",outcome="ok"}}' in text
        assert f'submitqueue_scheduler_job_last_success_timestamp_seconds{{job="{job}"}}' \
            in text


async def _all_ran(rt: Runtime) -> bool:
    return all(rt.scheduler.runs.get(job) for job in rt.scheduler.jobs)
