"""``merge``: land a batch whose exact combination passed, through the queue's merger.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``merging``, every member live | before | log ``landing`` per member; check the delivery still holds its lease (``ensure_held``: a stale holder raises ``LeaseLost`` and never pushes; its successor merges); merge the members' changes in order as one update (infrastructure errors propagate and are retried; the merger recognises changes already landed); publish the result, with each member's landed commits, to ``mergesignal`` (id = batch id) |
| batch ``merging``, a member terminal or missing | superseded | refuse: nothing is merged or pushed, no ``landing`` log; publish a ``failed`` result naming the members and their states to ``mergesignal``, which fails the batch with that reason (the members keep their terminal states; the queue re-plans without the batch) |
| batch terminal or halted | beyond | ack |
| batch ``creating`` / ``created`` / ``speculating`` | invalid | raise ``InvalidState`` |
| batch missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import StageController, status_log
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain.errors import InvalidState
from app.domain.messages import MERGESIGNAL, EntityMsg, ResultMsg
from app.domain.states import BatchState
from app.extensions.base import MergeSpec, MergeStep
from app.queue import Delivery


class MergeController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
            members = await request_repo.get_many(s, queue=msg.queue, ids=batch.contains)
        if batch.state.halted:
            return
        if batch.state is not BatchState.MERGING:
            raise InvalidState(f"batch {batch.id} is {batch.state}; merge needs merging")
        # A member that already ended (say ``error``) must not have its change land:
        # its reported outcome would be a lie. Any such member refuses the whole batch,
        # since what passed the build is the combination of all of them.
        ended = [f"{m} is {members[m].state}" if m in members else f"{m} is missing"
                 for m in batch.contains if m not in members or members[m].state.terminal]
        if ended:
            await self.deps.publish(MERGESIGNAL, ResultMsg(
                id=batch.id, queue=batch.queue, outcome="failed",
                reason=f"refused to land: {', '.join(ended)}; a batch lands only while "
                       "every member is live"), message_id=batch.id)
            return
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "landing", now=now, occurrence=batch.id,
                       metadata={"batch_id": batch.id}) for m in batch.contains])
        spec = MergeSpec(queue=batch.queue, id=batch.id, steps=tuple(
            MergeStep(m, members[m].change_uris, members[m].strategy) for m in batch.contains))
        merger = self.deps.extensions(batch.queue).merger
        await delivery.ensure_held()  # a holder whose lease lapsed must not push
        outcome = await self.deps.timed("merge", batch.queue, merger.merge(spec))
        await self.deps.publish(MERGESIGNAL, ResultMsg(
            id=batch.id, queue=batch.queue,
            outcome="succeeded" if outcome.succeeded else "failed", reason=outcome.reason,
            outputs=list(outcome.outputs), conflicting_paths=list(outcome.conflicting_paths),
            commits={m: list(outcome.commits.get(m, ())) for m in batch.contains
                     if outcome.succeeded},
        ), message_id=batch.id)
