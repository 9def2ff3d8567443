"""``conclude``: map a terminal batch onto its member requests.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``failed`` or ``cancelled`` with several members, some ``batched`` | at | bisect (``app/controllers/bisect.py``): the ``batched`` members go on in new batches; the others (``cancelling``) end as below |
| batch ``succeeded`` / ``failed`` / ``cancelled`` (otherwise) | at | terminate each member (``landed`` / ``error`` / ``cancelled``) with the failure reason; ``landed`` carries metadata ``commits`` (the member's landed commit per change, from the batch); a member already there skips the write but republishes its terminal log |
| member already in another terminal state | superseded | leave it |
| member missing | invalid | raise ``NotFound`` |
| batch not terminal | invalid | raise ``InvalidState`` (conclude is only sent for terminal batches) |
| batch missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from typing import Any

from app.controllers import bisect
from app.controllers.common import StageController, terminate_request
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain.errors import InvalidState
from app.domain.messages import ConcludeMsg
from app.domain.states import BATCH_TO_REQUEST_TERMINAL, BatchState, RequestState
from app.queue import Delivery


class ConcludeController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = ConcludeMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
        target = BATCH_TO_REQUEST_TERMINAL.get(batch.state)
        if target is None:
            raise InvalidState(
                f"batch {batch.id} is {batch.state}; conclude needs a terminal batch")
        reason = msg.failure_reason or batch.failure_reason
        async with self.deps.db.read() as s:
            members = await request_repo.get_many(s, queue=batch.queue, ids=batch.contains)
        going_on = await bisect.split(self.deps, batch, members)
        if not going_on and batch.state is BatchState.FAILED:
            reason = await bisect.culprit_reason(self.deps, batch, reason)
        for sqid in batch.contains:
            if sqid in going_on:
                continue
            ends = target
            member = members.get(sqid)
            if going_on and member is not None and member.state is RequestState.CANCELLING:
                ends = RequestState.CANCELLED  # its cancel, not the batch, decided it
            metadata: dict[str, Any] = {"batch_id": batch.id}
            if batch.state is BatchState.SUCCEEDED:
                metadata["commits"] = list(batch.landed.get(sqid, ()))
            await terminate_request(self.deps, queue=batch.queue, sqid=sqid, target=ends,
                                    last_error=reason, metadata=metadata)
