"""The runner-side log of a build that runs elsewhere (external CI over webhooks,
GitHub checks): our own ``[sq]`` lines appended to the stored log, and the one way
such a build ends — a terminal status written once, with its line in the log."""

from __future__ import annotations

from app.domain.build_run import BuildRun
from app.domain.states import BuildStatus
from app.extensions.base import BuildStore


async def say(store: BuildStore, build_id: str, line: str) -> None:
    """Append ``[sq] <line>`` to the build's stored log."""
    text = await store.get_log(build_id) or ""
    await store.set_log(build_id, f"{text}[sq] {line}\n")


async def end(store: BuildStore, build_id: str, status: BuildStatus, detail: str, *,
              now_ms: int) -> BuildRun | None:
    """End the build with ``status`` unless it already ended (then it is returned as it
    is; None when it does not exist)."""
    run = await store.get(build_id)
    if run is None or run.status.terminal:
        return run
    await say(store, build_id, f"{status.value}: {detail}")
    return await store.update(build_id, now_ms=now_ms, status=status, detail=detail)
