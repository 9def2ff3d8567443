"""``build``: start the build of one funded speculation path.

Partitioned by batch id. The path entry's status is owned by ``speculate``; this
controller only creates the ``Build`` row and the write-once (path, attempt) link.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch halted | superseded | ack (nothing is started for a cancelled or finished batch) |
| no path set, no entry, or another attempt | superseded | ack |
| entry ``pending``, no link | before | trigger the build (base = the path's ``succeeds`` dependencies' changes, then the head's, also as merge steps with each member's strategy); store it ``accepted`` with the queue's trunk epoch read before the trigger; link it (a concurrent trigger that linked first wins: both builds are signalled, the loser is cancelled as unwanted); publish ``buildsignal`` |
| entry ``pending``, no link, trigger already sent (a redelivery after a lost reply, a retryable error, or a crash before the link) | before | the same: the request names the same (queue, path, attempt, batch creation time), so a runner with external builds (webhook) derives the same build id, resends the same ``Idempotency-Key`` (or nothing, once CI reported) and starts no second job; the create and the link are insert-if-absent |
| entry live, link exists | at | re-signal the linked build (same id), then every live build of the same (path, attempt) the link does not hold (a race's loser whose signal a crash lost: else nothing would poll or cancel it) |
| entry ``building`` / ``cancelling``, no link | superseded | ack (only a ``pending`` entry is triggered; ``speculate`` moved this one on) |
| entry terminal | beyond | ack |
| batch missing | invalid | raise ``NotFound`` |

Right before the trigger, ``delivery.ensure_held()``: a holder whose lease was lost
(its successor may be triggering) raises ``LeaseLost`` and triggers nothing.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import StageController
from app.db.repos import batches as batch_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, Build
from app.domain.messages import BUILDSIGNAL, BuildMsg, EntityMsg
from app.domain.states import BuildStatus, PathStatus
from app.extensions.base import BuildRequest, MergeStep
from app.queue import Delivery


class BuildController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = BuildMsg.model_validate(delivery.payload)
        q = msg.queue
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=q, id=msg.id)
            path_set = (await spec_repo.path_sets(s, queue=q, heads=[batch.id]))[batch.id]
            linked = await spec_repo.get_link(s, queue=q, path_id=msg.path_id,
                                              attempt=msg.attempt)
        entry = path_set.get(msg.path_id)
        if batch.state.halted or entry is None or entry.attempt != msg.attempt:
            return
        if entry.status.terminal:
            return
        if linked is not None:
            await self._signal(q, linked)
            await self._signal_losers(q, batch.id, msg, linked)
            return
        if entry.status is not PathStatus.PENDING:
            return
        request = await self._request(batch, entry.path.base, msg)
        await delivery.ensure_held()  # a holder whose lease lapsed must not trigger
        async with self.deps.db.read() as s:
            epoch = await epoch_repo.current(s, queue=q)  # read before the tree is made
        build_id = await self.deps.extensions(q).runner.trigger(request)
        now = self.deps.now()
        async with self.deps.db.write() as s:
            await spec_repo.create_build(s, build=Build(
                queue=q, id=build_id, batch_id=batch.id, path_id=msg.path_id,
                attempt=msg.attempt, status=BuildStatus.ACCEPTED, version=1, epoch=epoch),
                now_ms=now)
            holder = await spec_repo.link(s, queue=q, path_id=msg.path_id, attempt=msg.attempt,
                                          build_id=build_id)
        await self._signal(q, build_id)
        if holder != build_id:
            await self._signal(q, holder)

    async def _request(self, batch: Batch, base: tuple[str, ...], msg: BuildMsg) -> BuildRequest:
        async with self.deps.db.read() as s:
            base_members = await batch_repo.members_of(s, queue=batch.queue, ids=base)
            member_ids = [m for b in base for m in base_members[b]] + list(batch.contains)
            members = await request_repo.get_many(s, queue=batch.queue, ids=member_ids)
        base_changes = tuple(u for b in base for m in base_members[b]
                             for u in members[m].change_uris)
        head_changes = tuple(u for m in batch.contains for u in members[m].change_uris)
        order = [m for b in base for m in base_members[b]] + list(batch.contains)
        steps = tuple(MergeStep(m, members[m].change_uris, members[m].strategy) for m in order)
        return BuildRequest(queue=batch.queue, batch_id=batch.id, path_id=msg.path_id,
                            attempt=msg.attempt, base_changes=base_changes,
                            head_changes=head_changes, batch_created_at_ms=batch.created_at_ms,
                            steps=steps)

    async def _signal_losers(self, queue: str, batch_id: str, msg: BuildMsg,
                             holder: str) -> None:
        async with self.deps.db.read() as s:
            builds = await spec_repo.builds_of(s, queue=queue, batch_id=batch_id,
                                               path_id=msg.path_id, attempt=msg.attempt)
        for b in builds:
            if b.id != holder and not b.status.terminal:
                await self._signal(queue, b.id)

    async def _signal(self, queue: str, build_id: str) -> None:
        await self.deps.publish(BUILDSIGNAL, EntityMsg(id=build_id, queue=queue),
                                message_id=build_id)
