"""``speculate`` resync: a periodic wake-up for every merge queue with active batches, so
no queue can sit with a decidable state and no pending wake-up (one lost to a bug, an
operator's discard, a crash window nobody has found yet). A scheduler job
(``app/scheduler.py``), not a consumer; it writes nothing but messages.

| Loaded state (per configured queue) | Action |
|---|---|
| active batches (``created`` / ``speculating`` / ``merging`` / ``cancelling``) | publish ``speculate`` naming the oldest one, message id ``<queue>/resync/<bucket>``, ``bucket = now // interval`` |
| no active batch | nothing |

The id is the same in every process that runs the job within one interval, so several
processes on one PostgreSQL store one wake-up per queue per interval (two where their
clocks straddle a bucket boundary), never one per process. The run it causes coalesces
like any wake-up (``app/controllers/speculate.py``): if a run that began after the
resync message was stored has completed, it only gets the pre-step.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.controllers.common import Deps
from app.controllers.speculate import ACTIVE
from app.db.repos import batches as batch_repo
from app.domain.messages import SPECULATE, EntityMsg

log = logging.getLogger("submitqueue.controllers")


class SpeculateResync:
    def __init__(self, deps: Deps, queues: Sequence[str], *, interval_ms: int) -> None:
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be positive, got {interval_ms}")
        self.deps = deps
        self.queues = tuple(queues)
        self.interval_ms = interval_ms
        self.published = 0  # wake-ups this process stored
        self.duplicates = 0  # wake-ups another process (or an earlier run) had stored

    def message_id(self, queue: str, now_ms: int) -> str:
        return f"{queue}/resync/{now_ms // self.interval_ms}"

    async def run(self) -> int:
        """Publish this interval's wake-ups; returns how many this call stored."""
        now = self.deps.now()
        async with self.deps.db.read() as s:
            oldest = {}
            for queue in self.queues:
                active = await batch_repo.list_by_states(s, queue=queue, states=ACTIVE)
                if active:
                    oldest[queue] = active[0].id
        stored = 0
        for queue, batch_id in oldest.items():
            result = await self.deps.publish(SPECULATE, EntityMsg(id=batch_id, queue=queue),
                                             message_id=self.message_id(queue, now))
            stored += result.created
        self.published += stored
        self.duplicates += len(oldest) - stored
        if stored:
            log.debug("speculate resync", extra={"queues": sorted(oldest), "stored": stored})
        return stored
