"""The stall detector: a periodic job (``stall-check``, ``app/scheduler.py``) that flags a
queue whose oldest in-flight request has not moved for longer than
``SQ_STALL_THRESHOLD_MS``. "Moved" means its history grew: a new status or event (a
build started or finished, a batch formed, a merge began) — the request log is the
record of every state change a person can see.

| Loaded state (per configured queue) | Verdict |
|---|---|
| nothing in flight | not stalled, ``request`` None |
| oldest in-flight request, newest history entry at ``t`` | stalled iff ``now - t > threshold`` |
| read failed | keep the previous verdict (the job's error is logged and counted) |

Read-only: the verdicts live in the process that computed them (every role runs the
job, from the same shared database, so every process's pages and ``/metrics`` agree up
to one interval). Running it twice in a row gives the same verdict, and several
processes running it at once write nothing anyone else reads: idempotent by
construction. ``/metrics``: ``submitqueue_queue_stalled{queue}`` and
``submitqueue_queue_unmoved_seconds{queue}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.db.engine import Database
from app.db.repos import views as view_repo


@dataclass(frozen=True, slots=True)
class Stall:
    queue: str
    stalled: bool
    request_id: str | None
    last_moved_at_ms: int | None
    checked_at_ms: int
    threshold_ms: int

    def unmoved_ms(self, now_ms: int) -> int:
        """How long the oldest in-flight request has not moved, as of ``now_ms``."""
        if self.last_moved_at_ms is None:
            return 0
        return max(0, now_ms - self.last_moved_at_ms)

    def text(self, now_ms: int) -> str:
        if self.request_id is None:
            return "nothing in flight"
        minutes = self.unmoved_ms(now_ms) // 60_000
        if self.stalled:
            return (f"stalled: {self.request_id}, the oldest request in flight, has not moved "
                    f"for {minutes} min (threshold {self.threshold_ms // 60_000} min)")
        return f"moving: {self.request_id}, the oldest request in flight, moved {minutes} min ago"


class StallDetector:
    """Checks every configured queue; ``verdicts`` holds the last answer per queue."""

    def __init__(self, db: Database, queues: Sequence[str], *, threshold_ms: int,
                 clock: Callable[[], int]) -> None:
        if threshold_ms <= 0:
            raise ValueError(f"threshold_ms must be positive, got {threshold_ms}")
        self.db = db
        self.queues = tuple(queues)
        self.threshold_ms = threshold_ms
        self.clock = clock
        self.verdicts: dict[str, Stall] = {}

    async def check(self, queue: str) -> Stall:
        now = self.clock()
        async with self.db.read() as s:
            oldest = await view_repo.in_flight(s, queue=queue, limit=1)
            moved = None
            if oldest:
                moved = await view_repo.last_moved_ms(s, queue=queue,
                                                      request_id=oldest[0].request_id)
        if not oldest:
            return Stall(queue, False, None, None, now, self.threshold_ms)
        first = oldest[0]
        last = max(moved or 0, first.status_timestamp_ms, first.received_at_ms)
        return Stall(queue, now - last > self.threshold_ms, first.request_id, last, now,
                     self.threshold_ms)

    async def run(self) -> dict[str, Stall]:
        """Check every queue; the verdicts are replaced together once all were read."""
        fresh = {queue: await self.check(queue) for queue in self.queues}
        self.verdicts = fresh
        return fresh

    def get(self, queue: str) -> Stall | None:
        return self.verdicts.get(queue)

    def gauges(self) -> list[tuple[str, bool, float]]:
        """(queue, stalled, seconds unmoved as of now) per checked queue, for /metrics."""
        now = self.clock()
        return [(q, v.stalled, v.unmoved_ms(now) / 1000)
                for q, v in sorted(self.verdicts.items())]
