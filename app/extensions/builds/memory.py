"""A ``BuildStore`` in this process's memory: for a registry built without a database
(tools, unit tests). Runs and logs are lost with the process, and another process
cannot see them; the server uses the SQL store (``app/db/repos/build_runs.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.domain.build_run import BuildRun, TestedTree
from app.domain.states import BuildStatus


class MemoryBuildStore:
    def __init__(self) -> None:
        self._runs: dict[str, BuildRun] = {}
        self._logs: dict[str, str] = {}

    async def create(self, run: BuildRun) -> None:
        self._runs.setdefault(run.id, run)
        self._logs.setdefault(run.id, "")

    async def get(self, build_id: str) -> BuildRun | None:
        return self._runs.get(build_id)

    async def update(
        self, build_id: str, *, now_ms: int, status: BuildStatus | None = None,
        detail: str | None = None, exit_code: int | None = None, log_url: str | None = None,
        pid: int | None = None, tested: TestedTree | None = None,
        heartbeat_ms: int | None = None,
    ) -> BuildRun | None:
        run = self._runs.get(build_id)
        if run is None or run.status.terminal:
            return run
        run = replace(
            run,
            status=run.status if status is None else status,
            detail=run.detail if detail is None else detail,
            exit_code=run.exit_code if exit_code is None else exit_code,
            log_url=run.log_url if log_url is None else log_url,
            pid=run.pid if pid is None else pid,
            tested=run.tested if tested is None else tested,
            heartbeat_ms=run.heartbeat_ms if heartbeat_ms is None else heartbeat_ms,
            updated_at_ms=now_ms,
        )
        self._runs[build_id] = run
        return run

    async def nudge(self, queue: str, path_id: str, attempt: int) -> int:
        hit = [r for r in self._runs.values() if (r.queue, r.path_id, r.attempt) ==
               (queue, path_id, attempt) and not r.status.terminal]
        for run in hit:
            self._runs[run.id] = replace(run, heartbeat_ms=0)
        return len(hit)

    async def set_log(self, build_id: str, text: str) -> None:
        if build_id in self._runs:
            self._logs[build_id] = text

    async def get_log(self, build_id: str) -> str | None:
        return self._logs.get(build_id)

    async def heartbeat(self, owner: str, now_ms: int, live: Sequence[str]) -> list[str]:
        for run in list(self._runs.values()):
            if run.owner == owner and not run.status.terminal:
                self._runs[run.id] = replace(run, heartbeat_ms=now_ms)
        wanted = (self._runs.get(build_id) for build_id in live)
        return sorted(r.id for r in wanted
                      if r is not None and (r.cancel_requested or r.status.terminal))

    async def request_cancel(self, build_id: str) -> None:
        run = self._runs.get(build_id)
        if run is not None and not run.status.terminal:
            self._runs[build_id] = replace(run, cancel_requested=True)

    async def unfinished(self, owner_group: str) -> list[BuildRun]:
        return [r for r in self._runs.values()
                if r.owner_group == owner_group and not r.status.terminal]
