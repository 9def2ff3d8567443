"""What the speculate controller asks of a queue's scorer, with the I/O it needs.

* ``probabilities``: P(batch lands) for each unresolved batch, from the change
  details the provider reported for its member requests (cached per batch: a batch's
  changes never change); a batch on its second chance (``chance`` 1) gets at most
  ``second_chance.PROBABILITY``, as it just failed (``app/domain/second_chance.py``).
* ``learn``: feed every build that reached a verdict since the last run to the
  queue's history scorer(s), if it has any (``app.speculation.scoring``). On the first
  run of a queue in this process the scorer is warmed up from the queue's latest
  finished builds, so a restart does not forget what the queue taught it.

State is per process and only a cache: losing it costs accuracy, never correctness.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from app.controllers.common import Deps
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import speculation as spec_repo
from app.domain import second_chance
from app.domain.entities import Batch, ChangeDetails, PathEntry
from app.domain.states import BuildStatus, PathStatus
from app.speculation.generator import DEFAULT_PROBABILITY, sanitize
from app.speculation.scoring import learners, observe_build

log = logging.getLogger("submitqueue.controllers")

WARMUP_BUILDS = 200
MAX_CACHED_BATCHES = 10_000


class QueueScoring:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._details: dict[tuple[str, str], list[ChangeDetails]] = {}
        self._warm: set[str] = set()

    async def details(self, queue: str, batches: Iterable[Batch]) -> dict[str, list[ChangeDetails]]:
        """Change details of each batch (its members' changes, in member order)."""
        wanted = {b.id: b for b in batches}
        missing = [b for bid, b in wanted.items() if (queue, bid) not in self._details]
        if missing:
            if len(self._details) > MAX_CACHED_BATCHES:
                self._details.clear()
            members = [m for b in missing for m in b.contains]
            async with self.deps.db.read() as s:
                found = await change_repo.details_for(s, queue=queue, request_ids=members)
            for b in missing:
                self._details[(queue, b.id)] = [d for m in b.contains for d in found.get(m, [])]
        return {bid: self._details[(queue, bid)] for bid in wanted}

    async def probabilities(self, queue: str, batches: Sequence[Batch]) -> dict[str, float]:
        scorer = self.deps.extensions(queue).scorer
        details = await self.details(queue, batches)
        out: dict[str, float] = {}
        for b in batches:
            try:
                out[b.id] = sanitize(scorer.score(b.id, details[b.id]))
            except Exception:  # a scorer's bug must not stop the queue
                log.warning("scorer failed; using the default", extra={"batch_id": b.id})
                out[b.id] = DEFAULT_PROBABILITY
            if b.chance:  # it just failed: what stands behind it assumes it fails again
                out[b.id] = min(out[b.id], second_chance.PROBABILITY)
        return out

    async def learn(self, queue: str, finished: Sequence[PathEntry],
                    batches: Mapping[str, Batch]) -> None:
        """``finished``: entries that turned passed/failed in this run."""
        scorer = self.deps.extensions(queue).scorer
        if not learners(scorer):
            return
        if queue not in self._warm:
            self._warm.add(queue)
            await self._warm_up(queue, scorer)
            return  # the warm-up read every stored verdict, this run's included
        await self._observe(queue, scorer, finished, batches)

    async def _observe(self, queue: str, scorer: object, finished: Sequence[PathEntry],
                       batches: Mapping[str, Batch]) -> None:
        needed = {b for e in finished for b in (e.path.head, *e.path.base)}
        known = {bid: batches[bid] for bid in needed if bid in batches}
        if len(known) < len(needed):
            async with self.deps.db.read() as s:
                known.update(await batch_repo.get_many(
                    s, queue=queue, ids=needed - set(known)))
        details = await self.details(queue, known.values())
        for e in finished:
            if e.path.head not in details:
                continue
            observe_build(scorer, head=details[e.path.head],
                          base=[d for b in e.path.base for d in details.get(b, [])],
                          passed=e.status is PathStatus.PASSED)

    async def _warm_up(self, queue: str, scorer: object) -> None:
        async with self.deps.db.read() as s:
            builds = await spec_repo.recent_finished_builds(s, queue=queue,
                                                            limit=WARMUP_BUILDS)
            sets = await spec_repo.path_sets(s, queue=queue, heads={b.batch_id for b in builds})
        entries = []
        for b in reversed(builds):  # oldest first, as they happened
            e = sets[b.batch_id].get(b.path_id)
            if e is not None:
                passed = b.status is BuildStatus.SUCCEEDED
                entries.append(PathEntry(path=e.path, status=PathStatus.PASSED if passed
                                         else PathStatus.FAILED, attempt=b.attempt))
        await self._observe(queue, scorer, entries, {})
