"""``start``: persist a new land request and hand it to validation.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request missing | before | in one transaction: create it ``started`` (v1), log ``accepted`` (the gateway's log id, its timestamp) and ``started``, publish ``validate`` (the outbox: published with the write or not at all) |
| request missing when read, present at the create (the ``start_dlq`` reconciler recorded it ``error`` meanwhile) | superseded | the insert leaves that row alone; classify it as loaded (below): terminal, so only its terminal log is re-published |
| request ``started`` | at | skip the write; replay the log and ``validate`` with the same ids |
| request terminal | beyond | re-publish its terminal log, ack. Also how a start requeued after ``start_dlq`` reconciled it ends: that reconciler created the row in ``error`` (the start never persisted it), so the request is not resurrected |
| any other later state | beyond | ack |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import (
    Dispatch,
    StageController,
    load_request,
    log_items,
    repair_terminal,
    status_log,
)
from app.db.repos import requests as request_repo
from app.domain.entities import LandRequest
from app.domain.messages import VALIDATE, EntityMsg, LandRequestMsg, accepted_entry
from app.domain.states import RequestState
from app.queue import Delivery


class StartController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = LandRequestMsg.model_validate(delivery.payload)
        current = await load_request(self.deps, msg.queue, msg.id)
        if current is None:
            request = LandRequest(
                queue=msg.queue, id=msg.id, change_uris=tuple(msg.change_uris),
                strategy=msg.strategy, state=RequestState.STARTED, version=1,
                priority=msg.priority,
            )
            async with self.deps.transaction() as (s, outbox):
                created = await request_repo.create(s, request=request, now_ms=self.deps.now())
                if created:  # announced with the write
                    await outbox.publish_many(self._announcements(msg))
            if created:
                return
            current = await load_request(self.deps, msg.queue, msg.id)  # the start DLQ's
        if current is not None and current.state is not RequestState.STARTED:
            await repair_terminal(self.deps, current)
            return
        await self.deps.publish_all(self._announcements(msg))  # a redelivery's repair

    def _announcements(self, msg: LandRequestMsg) -> list[Dispatch]:
        """``accepted`` under the gateway's own log id (a no-op when the gateway recorded
        it, the repair when the gateway died between publishing ``start`` and that
        write), ``started``, and ``validate``."""
        accepted = accepted_entry(msg, self.deps.now())
        return [*log_items([accepted, status_log(msg.queue, msg.id, "started",
                                                 now=self.deps.now(), version=1)]),
                (VALIDATE, EntityMsg(id=msg.id, queue=msg.queue), msg.id)]
