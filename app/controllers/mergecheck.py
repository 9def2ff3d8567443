"""``mergecheck``: dry-run apply of the request's changes onto the target, via the
queue's merger; the outcome goes to ``mergeconflictsignal``.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request halted | superseded | ack |
| request ``validated`` / ``batched`` | beyond | ack |
| request ``started`` | before | run the check (infrastructure errors propagate and are retried); publish the result (id = sqid) |
| request missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import StageController
from app.db.repos import requests as request_repo
from app.domain.messages import MERGECONFLICTSIGNAL, EntityMsg, ResultMsg
from app.domain.states import RequestState
from app.extensions.base import MergeSpec, MergeStep
from app.queue import Delivery


class MergeCheckController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            req = await request_repo.get(s, queue=msg.queue, id=msg.id)
        if req.state is not RequestState.STARTED:
            return
        spec = MergeSpec(queue=req.queue, id=req.id,
                         steps=(MergeStep(req.id, req.change_uris, req.strategy),))
        outcome = await self.deps.extensions(req.queue).merger.check(spec)
        result = ResultMsg(
            id=req.id, queue=req.queue, outcome="succeeded" if outcome.succeeded else "failed",
            reason=outcome.reason, outputs=list(outcome.outputs),
            conflicting_paths=list(outcome.conflicting_paths),
        )
        await self.deps.publish(MERGECONFLICTSIGNAL, result, message_id=req.id)
