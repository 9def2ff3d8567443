"""``mergesignal``: record a merge's outcome on the batch and fan it out.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``merging`` | before | conditional write ``succeeded`` (with each member's landed commits) / ``failed`` (with the reason); publish ``conclude`` then a ``speculate`` wake-up for the rest of the queue |
| batch ``succeeded`` / ``failed`` | at | replay ``conclude`` and the wake-up with the same ids |
| batch ``cancelled`` / ``cancelling`` | superseded | ack |
| batch ``creating`` / ``created`` / ``speculating`` | invalid | raise ``InvalidState`` |
| batch missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import replace

from app.controllers.common import StageController
from app.db.repos import batches as batch_repo
from app.domain.errors import InvalidState
from app.domain.messages import CONCLUDE, SPECULATE, ConcludeMsg, EntityMsg, ResultMsg
from app.domain.states import BatchState
from app.queue import Delivery


class MergeSignalController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = ResultMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
        if batch.state in (BatchState.CANCELLED, BatchState.CANCELLING):
            return
        if batch.state is BatchState.MERGING:
            ok = msg.outcome == "succeeded"
            reason = "" if ok else f"merge failed: {msg.reason or 'the merger gave no reason'}"
            landed = {m: tuple(msg.commits.get(m, ())) for m in batch.contains} if ok else {}
            new = replace(batch, state=BatchState.SUCCEEDED if ok else BatchState.FAILED,
                          failure_reason=reason, landed=landed, version=batch.version + 1)
            async with self.deps.db.write() as s:
                await batch_repo.update(s, old=batch, new=new, now_ms=self.deps.now())
            self.deps.metrics.merge_finished(batch.queue, msg.outcome)
            batch = new
        elif not batch.state.terminal:
            raise InvalidState(f"batch {batch.id} is {batch.state}; no merge was dispatched")
        await self.deps.publish(
            CONCLUDE, ConcludeMsg(id=batch.id, queue=batch.queue,
                                  failure_reason=batch.failure_reason),
            message_id=f"{batch.id}/conclude/merged")
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                message_id=f"{batch.id}/merged")
