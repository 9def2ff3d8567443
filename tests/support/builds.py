"""Build requests for runner tests, named the way the speculation names real ones."""

from __future__ import annotations

import hashlib

from app.extensions.base import BuildRequest, Service
from app.extensions.builds.command import CommandBuildRunner
from app.scheduler import Scheduler


def build_request(*head: str, base: tuple[str, ...] = (), attempt: int = 1,
                  queue: str = "q", batch_id: str = "q/batch/1") -> BuildRequest:
    """A build of ``head`` on ``base``. Its path id names the combination, as a real
    speculation path's does: runners derive the build id from (queue, path, attempt),
    so two different combinations must not share one."""
    path_id = hashlib.sha256(repr((base, head)).encode()).hexdigest()[:12]
    return BuildRequest(queue=queue, batch_id=batch_id, path_id=path_id, attempt=attempt,
                        base_changes=base, head_changes=head)


class Beating:
    """Runs a started command runner's periodic jobs (its heartbeat) on a scheduler of
    their own, as the runtime's scheduler does in the server: ``async with
    Beating(runner):``, or ``start()``/``stop()`` (stop = the runner stops beating)."""

    def __init__(self, runner: Service) -> None:
        self.scheduler = Scheduler(shutdown_grace_ms=1000)
        for job in runner.periodic_jobs():
            self.scheduler.every(job.name, job.interval_ms, job.run)

    async def start(self) -> None:
        await self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    async def __aenter__(self) -> Beating:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class BeatingRunner(CommandBuildRunner):
    """A command runner that beats while started, as the server's scheduler makes it do
    (for tests that run a runner without the runtime). ``beating.stop()`` silences it."""

    beating: Beating | None = None

    async def start(self) -> None:
        await super().start()
        self.beating = Beating(self)
        await self.beating.start()

    async def stop(self) -> None:
        if self.beating is not None:
            await self.beating.stop()
        await super().stop()
