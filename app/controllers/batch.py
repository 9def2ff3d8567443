"""``batch``: put a validated request into a new batch and ask for its dependencies.

One request per batch. The batch and the request's association are written in one
transaction, and a redelivery finds the association, so no inert duplicate batches.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request halted | superseded | ack |
| request ``validated``, no ``creating`` batch of it | before | mint ``<queue>/batch/<n>``, create it ``creating`` with its association; log ``batching``; publish ``dependency_analysis`` |
| request ``validated``, a ``creating`` batch of it exists | at | replay the log and the hand-off for that batch |
| request ``batched`` | beyond | ack |
| request ``started`` / missing | invalid | raise ``InvalidState`` / ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import StageController, status_log
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.db.repos.counters import next_number
from app.domain.entities import Batch
from app.domain.errors import InvalidState
from app.domain.ids import batch_id
from app.domain.messages import DEPENDENCY_ANALYSIS, EntityMsg
from app.domain.states import BatchState, RequestState
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
        if creating:
            bid = creating[-1].id
        else:
            async with self.deps.db.write() as s:
                n = await next_number(s, queue=req.queue, domain="batch")
                bid = batch_id(req.queue, n)
                await batch_repo.create(s, batch=Batch(
                    queue=req.queue, id=bid, contains=(req.id,), dependencies=(),
                    state=BatchState.CREATING, version=1,
                ), now_ms=self.deps.now())
        await self.deps.publish_logs([status_log(
            req.queue, req.id, "batching", now=self.deps.now(), version=req.version,
            metadata={"batch_id": bid}, occurrence=bid)])
        await self.deps.publish(DEPENDENCY_ANALYSIS, EntityMsg(id=bid, queue=req.queue),
                                partition_key=req.queue, message_id=bid)
