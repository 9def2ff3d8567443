"""``cancel``: turn a user's cancel intent into ``cancelled``, unless a merge wins the race.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request missing, message younger than 5 min | before | hold 500 ms (``start`` may not have run yet) |
| request missing, older | invalid | raise ``NotFound`` |
| request terminal | beyond | re-publish its terminal log (same id; repairs a crash between write and log; a ``cancelled`` one carries the cancel's reason, as the write's own log did), ack |
| request live | before | conditional write ``cancelling`` (skipped if already); then for each of its batches, oldest first: ``created``/``speculating`` -> ``cancelling``, and a ``cancelling`` batch gets a ``speculate`` wake-up (the batch owns the outcome); ``merging``/terminal -> owned already, nothing to do; ``creating`` -> not owned. With no owning batch, terminate ``cancelled`` at once |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.controllers.common import (
    StageController,
    load_request,
    repair_terminal,
    terminate_request,
)
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain.errors import NotFound
from app.domain.messages import SPECULATE, CancelRequestMsg, EntityMsg
from app.domain.states import BatchState, RequestState
from app.queue import Delivery

MISSING_GRACE_MS = 5 * 60 * 1000


class CancelController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = CancelRequestMsg.model_validate(delivery.payload)
        req = await load_request(self.deps, msg.queue, msg.id)
        if req is None:
            if self.deps.now() - delivery.message.published_at_ms < MISSING_GRACE_MS:
                delivery.hold(500)
                return
            raise NotFound(f"request {msg.id} never started; nothing to cancel")
        if req.state.terminal:
            await repair_terminal(self.deps, req, metadata=_metadata(msg)
                                  if req.state is RequestState.CANCELLED else None)
            return
        if req.state is not RequestState.CANCELLING:
            new = replace(req, state=RequestState.CANCELLING, version=req.version + 1)
            async with self.deps.db.write() as s:
                await request_repo.update(s, old=req, new=new, now_ms=self.deps.now())
        async with self.deps.db.read() as s:
            batches = await batch_repo.for_request(s, queue=msg.queue, request_id=msg.id)
        owned = False
        for batch in batches:
            if batch.state in (BatchState.CREATED, BatchState.SPECULATING):
                async with self.deps.db.write() as s:
                    await batch_repo.update(s, old=batch, new=replace(
                        batch, state=BatchState.CANCELLING, version=batch.version + 1),
                        now_ms=self.deps.now())
            if batch.state in (BatchState.CREATED, BatchState.SPECULATING,
                               BatchState.CANCELLING):
                # Persist, then wake speculation (replayed with the same id).
                await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                        message_id=f"{batch.id}/cancel")
            owned = owned or batch.state is not BatchState.CREATING
        if not owned:
            await terminate_request(self.deps, queue=msg.queue, sqid=msg.id,
                                    target=RequestState.CANCELLED,
                                    last_error=f"cancelled: {msg.reason}" if msg.reason
                                    else "cancelled", metadata=_metadata(msg))


def _metadata(msg: CancelRequestMsg) -> dict[str, Any]:
    """What the ``cancelled`` log carries (its repair too: one id, one payload): the
    reason, and who asked when the gateway knew."""
    return {"reason": msg.reason, "actor": msg.actor} if msg.actor else {"reason": msg.reason}
