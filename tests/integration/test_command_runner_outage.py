"""The command runner when its build system is down: a command exiting with an
infrastructure code (75) gives no verdict; the build stays live and runs again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.db.repos.build_runs import SqlBuildStore
from app.domain.states import BuildStatus
from app.extensions.base import BuildSystemUnavailable
from app.extensions.builds.command import INFRA_DETAIL, CommandBuildRunner
from tests.support.commandrunner import (
    Remote,
    RunnerFactory,
    finished,
    request,
)

pytestmark = pytest.mark.timeout(60)


async def parked(runner: CommandBuildRunner, build_id: str) -> None:
    """Wait (reading the store, not ``status()``, which would run it again) until the
    build waits for its build system."""
    deadline = time.monotonic() + 20
    while True:
        # ``waiting()`` first: the runner writes the detail before it marks the build
        # waiting, so a store read after a true ``waiting()`` must show it (read before,
        # it could be older than the mark: the race that once failed CI here)
        waiting = runner.waiting(build_id)
        run = await runner.store.get(build_id)
        assert run is not None and not run.status.terminal, run
        if waiting:
            assert run.detail.startswith(INFRA_DETAIL) and runner.down, run
            return
        assert time.monotonic() < deadline, "the build never waited for its build system"
        await asyncio.sleep(0.05)


async def test_an_infrastructure_exit_waits_and_runs_again(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore,
) -> None:
    flag = tmp_path / "ci-down"
    flag.touch()
    runner = make_runner(command=["sh", "-c", f"if [ -e '{flag}' ]; then exit 75; fi; exit 0"])
    head = remote.change("one", {"one.txt": "1\n"})
    build_id = await runner.trigger(request(head))
    await parked(runner, build_id)  # no verdict, not errored: it waits
    # while a build waits for the build system, new builds are not started
    other = remote.change("two", {"two.txt": "2\n"})
    with pytest.raises(BuildSystemUnavailable):
        await runner.trigger(request(other))
    with pytest.raises(BuildSystemUnavailable) as exc:  # the poll that finds it waiting
        await runner.status(build_id)                    # runs it again...
    assert exc.value.dependency_kind == "builds" and "exited 75" in str(exc.value)
    await parked(runner, build_id)  # ...and it failed again
    flag.unlink()  # the build system is back: the next status() runs it again, it passes
    with pytest.raises(BuildSystemUnavailable):
        await runner.status(build_id)
    report = await finished(runner, build_id)
    assert not runner.down
    assert await runner.trigger(request(other))
    assert report.status is BuildStatus.SUCCEEDED, report
    assert "running it again" in (await store.get_log(build_id) or "")


async def test_a_waiting_build_can_be_cancelled_and_stop_ends_it(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory,
) -> None:
    runner = make_runner(command=["sh", "-c", "exit 75"])
    first = await runner.trigger(request(remote.change("a", {"a1.txt": "1\n"})))
    await parked(runner, first)
    await runner.cancel(first)
    assert (await runner.status(first)).status is BuildStatus.CANCELLED
    runner.down = ""  # (as if another build had passed meanwhile)
    second = await runner.trigger(request(remote.change("b", {"b1.txt": "1\n"})))
    await parked(runner, second)
    await runner.stop()
    assert (await runner.status(second)).status is BuildStatus.ERRORED


async def test_an_own_build_that_left_the_live_set_waiting_is_lost_not_waiting_forever(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory,
) -> None:
    """A build of this instance that is no longer live while the store still says it
    waits for its build system (its final write failed, e.g. the database was busy) is
    reported lost; it used to raise BuildSystemUnavailable on every poll, for ever."""
    runner = make_runner(command=["sh", "-c", "exit 75"])
    build_id = await runner.trigger(request(remote.change("a", {"a1.txt": "1\n"})))
    await parked(runner, build_id)
    runner._live.pop(build_id)  # as _end() does when its final store write raised
    report = await runner.status(build_id)
    assert report.status is BuildStatus.ERRORED and report.detail.startswith("lost"), report
