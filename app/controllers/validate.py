"""``validate``: reject duplicates and unreadable changes, claim the changes, ask for a
dry-run merge. Serial per merge queue, so the duplicate check and the claim cannot race.
The gateway already refuses a land of a change another live or landed request holds
(its unique change claim, ``app/gateway/landing.py``); this check is the second line of
defence, for requests that reach ``start`` some other way.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| request halted (terminal or cancelling) | superseded | ack (terminal: re-publish its terminal log first) |
| request ``validated`` / ``batched`` | beyond | ack |
| request ``started`` | before | log ``validating``; a change claimed by another live request, or one the provider rejects, ends the request ``error`` with the reason (a write conditional on the version read here); else claim the changes and publish ``mergecheck`` in one transaction |
| request ``started`` when read, ``cancelling`` by the time of the ``error`` write | superseded | the write loses (``VersionMismatch``, retried); the retry finds it halted and acks: the cancel decides |
| request missing | invalid | raise ``NotFound`` (start always persists first) |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import (
    StageController,
    repair_terminal,
    status_log,
    terminate_request,
)
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain.messages import MERGECHECK, EntityMsg
from app.domain.states import RequestState
from app.extensions.base import ChangeRejected
from app.queue import Delivery


class ValidateController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            req = await request_repo.get(s, queue=msg.queue, id=msg.id)
        if req.state.halted or req.state is not RequestState.STARTED:
            await repair_terminal(self.deps, req)
            return
        await self.deps.publish_logs(
            [status_log(req.queue, req.id, "validating", now=self.deps.now())])
        reason = await self._duplicate_of(req.queue, req.id, req.change_uris)
        details = []
        if reason is None:
            try:
                details = await self.deps.extensions(req.queue).provider.get(
                    req.queue, req.change_uris)
            except ChangeRejected as exc:
                reason = str(exc)
        if reason is not None:
            # Conditional on the version classified above: a cancel that made the
            # request ``cancelling`` meanwhile owns it (VersionMismatch, retried: halted).
            await terminate_request(self.deps, queue=req.queue, sqid=req.id,
                                    target=RequestState.ERROR, last_error=reason, expected=req)
            return
        async with self.deps.transaction() as (s, outbox):
            await change_repo.claim(s, queue=req.queue, request_id=req.id, details=details,
                                    now_ms=self.deps.now())
            await outbox.publish(MERGECHECK, EntityMsg(id=req.id, queue=req.queue),
                                 message_id=req.id)

    async def _duplicate_of(self, queue: str, sqid: str, uris: tuple[str, ...]) -> str | None:
        async with self.deps.db.read() as s:
            others = [r for r in await change_repo.claimants(s, queue=queue, uris=uris)
                      if r != sqid]
            live = await request_repo.get_many(s, queue=queue, ids=others)
        for other in others:
            owner = live.get(other)
            if owner is not None and not owner.state.terminal:
                return f"duplicate of in-flight request {other}: it already claims " + ", ".join(
                    sorted(set(uris) & set(owner.change_uris)))
        return None
