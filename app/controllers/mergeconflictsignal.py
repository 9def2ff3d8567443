"""``mergeconflictsignal``: the dry-run result decides between ``validated`` and ``error``.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request halted | superseded | ack (a cancel or an earlier verdict owns it; terminal: re-publish its terminal log first) |
| request ``started``, check succeeded | before | in one transaction: conditional write ``validated`` (v+1), log ``validated``, publish ``batch`` |
| request ``started``, check failed | before | terminate ``error`` with the conflict reason, conditional on the version read (a cancel that got there first wins: ``VersionMismatch``, retried, then halted) |
| request ``validated`` | at | replay the log and ``batch`` with the same ids |
| request ``batched`` | beyond | ack (never regress) |
| request missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import replace

from app.controllers.common import (
    Dispatch,
    StageController,
    log_items,
    repair_terminal,
    status_log,
    terminate_request,
)
from app.db.repos import requests as request_repo
from app.domain.entities import LandRequest
from app.domain.messages import BATCH, EntityMsg, ResultMsg
from app.domain.states import RequestState
from app.queue import Delivery


class MergeConflictSignalController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = ResultMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            req = await request_repo.get(s, queue=msg.queue, id=msg.id)
        if req.state.halted or req.state is RequestState.BATCHED:
            await repair_terminal(self.deps, req)
            return
        if req.state is RequestState.STARTED:
            if msg.outcome != "succeeded":
                paths = f" (conflicting paths: {', '.join(msg.conflicting_paths)})" \
                    if msg.conflicting_paths else ""
                reason = f"merge conflict: {msg.reason or 'the changes do not apply'}{paths}"
                await terminate_request(self.deps, queue=req.queue, sqid=req.id,
                                        target=RequestState.ERROR, last_error=reason,
                                        expected=req)
                return
            new = replace(req, state=RequestState.VALIDATED, version=req.version + 1)
            async with self.deps.transaction() as (s, outbox):
                await request_repo.update(s, old=req, new=new, now_ms=self.deps.now())
                await outbox.publish_many(self._announcements(new))
            return
        await self.deps.publish_all(self._announcements(req))  # a redelivery's repair

    def _announcements(self, req: LandRequest) -> list[Dispatch]:
        return [*log_items([status_log(req.queue, req.id, "validated", now=self.deps.now(),
                                       version=req.version)]),
                (BATCH, EntityMsg(id=req.id, queue=req.queue), req.id)]
