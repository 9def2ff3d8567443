"""``batch``: put a validated request into a batch and ask for its dependencies.

With ``batching.max_size`` 1 (the default) one request per batch. With more, a
``normal`` request joins the queue's newest ``creating`` batch when that batch is not
a bisection part, holds fewer than the size limit (``app/domain/batching.py``: fixed,
or AIMD with ``adaptive``), is of the same strategy and priority, and is at most
``max_wait_ms`` old. Serial per merge queue: two requests handled at once on
PostgreSQL would both find no open batch and mint one each (half-empty batches). The
join is a conditional write on that batch's version, so a
join that races its dependency analysis loses (``VersionMismatch``, retried: the retry
mints a new batch). Dependency analysis closes the batch (see there). The batch, the request's association and a claim keyed by
``(request, cause)`` are written in one transaction; the cause is the version of the
validated request (``validated@v<n>``). A run that lost its lease can run alongside
its successor on the same message: both read "no batch yet", but only one claim is
inserted, and the other run's transaction finds that claim and uses its batch, so
no inert duplicate batches. The ``batching`` log is stamped with the batch's creation
time (see ``dependency_analysis`` for why).

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request halted | superseded | ack |
| request ``validated``, no claim and no ``creating`` batch of it, a joinable batch | before | in one transaction: claim the joinable batch for (request, cause), add the request to it (conditional on its version) with its association, log ``batching``, publish ``dependency_analysis`` (the batch's id: deduplicated) |
| request ``validated``, no claim and no ``creating`` batch of it, none joinable | before | in one transaction: mint ``<queue>/batch/<n>``, claim it for (request, cause), create it ``creating`` with its association, log ``batching``, publish ``dependency_analysis`` (the outbox) |
| request ``validated``, a claim for (request, cause) exists (found in that transaction) | at | create nothing; log and hand off the claimed batch in that transaction |
| request ``validated``, a ``creating`` batch of it exists (also batches from before claims) | at | replay the log and the hand-off for that batch |
| request ``batched`` | beyond | ack |
| request ``started`` / missing | invalid | raise ``InvalidState`` / ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncSession

from app.controllers.common import Dispatch, StageController, log_items, status_log
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.db.repos.counters import next_number
from app.domain import batching
from app.domain.entities import Batch, LandRequest
from app.domain.errors import InvalidState
from app.domain.ids import batch_id
from app.domain.messages import DEPENDENCY_ANALYSIS, EntityMsg
from app.domain.states import BatchState, Priority, RequestState
from app.queue import Delivery


class BatchController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            req = await request_repo.get(s, queue=msg.queue, id=msg.id)
            existing = await batch_repo.for_request(s, queue=msg.queue, request_id=msg.id)
        if req.state.halted or req.state is RequestState.BATCHED:
            return
        if req.state is not RequestState.VALIDATED:
            raise InvalidState(f"request {req.id} is {req.state}; batch expects validated")
        creating = [b for b in existing if b.state is BatchState.CREATING]
        if creating:  # a redelivery's repair
            await self.deps.publish_all(self._announcements(req, creating[-1]))
        else:
            await self._create(req)

    def _announcements(self, req: LandRequest, batch: Batch) -> list[Dispatch]:
        # Stamped with the batch's creation time, so a ``batched`` replayed late by
        # dependency_analysis (stamped the same) still sorts after it in the history; a
        # request that joined a batch later is stamped when it joined (its ``validated``
        # may be newer than the batch).
        at = batch.created_at_ms if batch.contains[:1] == (req.id,) else self.deps.now()
        return [*log_items([status_log(
            req.queue, req.id, "batching", now=at, version=req.version,
            metadata={"batch_id": batch.id}, occurrence=batch.id)]),
            (DEPENDENCY_ANALYSIS, EntityMsg(id=batch.id, queue=req.queue), batch.id)]

    async def _create(self, req: LandRequest) -> None:
        """The batch of ``req``'s batching intent, the claimed one or a new one, and its
        announcements, in one transaction."""
        async with self.deps.transaction() as (s, outbox):
            batch = await self._claim(s, req)
            await outbox.publish_many(self._announcements(req, batch))

    async def _claim(self, s: AsyncSession, req: LandRequest) -> Batch:
        cause = f"validated@v{req.version}"
        now = self.deps.now()
        bid = await batch_repo.claimed(s, queue=req.queue, request_id=req.id, cause=cause)
        if bid is None:
            joined = await self._join(s, req, cause=cause, now=now)
            if joined is not None:
                return joined
            minted = Batch(
                queue=req.queue, id=batch_id(req.queue, await next_number(
                    s, queue=req.queue, domain="batch")),
                contains=(req.id,), dependencies=(), state=BatchState.CREATING, version=1,
                created_at_ms=now, updated_at_ms=now, priority=req.priority)
            bid = await batch_repo.claim(s, queue=req.queue, request_id=req.id,
                                         cause=cause, batch_id=minted.id, now_ms=now)
            if bid == minted.id:
                await batch_repo.create(s, batch=minted, now_ms=now)
                return minted
        return await batch_repo.get(s, queue=req.queue, id=bid)

    async def _join(self, s: AsyncSession, req: LandRequest, *, cause: str,
                    now: int) -> Batch | None:
        """``req`` added to the queue's joinable batch, or None when there is none."""
        cfg = self.deps.extensions(req.queue).batching
        if cfg.max_size <= 1 or req.priority is not Priority.NORMAL:
            return None
        open_ = await batch_repo.newest_creating(s, queue=req.queue)
        if (open_ is None or open_.priority is not Priority.NORMAL
                or req.id in open_.contains or now - open_.created_at_ms > cfg.max_wait_ms):
            return None
        recent = await batch_repo.recent_outcomes(
            s, queue=req.queue, limit=batching.RECENT_OUTCOMES) if cfg.adaptive else []
        if len(open_.contains) >= batching.window(cfg.max_size, adaptive=cfg.adaptive,
                                                  recent=recent):
            return None
        causes = await batch_repo.causes_of(s, queue=req.queue, batch_id=open_.id,
                                            request_ids=open_.contains)
        if any(batching.parent_of(req.queue, c) for c in causes):
            return None  # a bisection part takes no new requests
        members = await request_repo.get_many(s, queue=req.queue, ids=open_.contains[:1])
        first = members.get(open_.contains[0]) if open_.contains else None
        if first is None or first.strategy is not req.strategy:
            return None
        bid = await batch_repo.claim(s, queue=req.queue, request_id=req.id, cause=cause,
                                     batch_id=open_.id, now_ms=now)
        if bid != open_.id:  # a concurrent run of this message claimed another batch
            return await batch_repo.get(s, queue=req.queue, id=bid)
        joined = replace(open_, contains=(*open_.contains, req.id), version=open_.version + 1)
        await batch_repo.join(s, old=open_, new=joined, request_id=req.id, now_ms=now)
        return joined
