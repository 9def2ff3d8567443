"""``dependency_analysis``: enrol a new batch's members and find the earlier in-flight
batches it conflicts with. Serial per merge queue, so batches become ``created`` in
one order and each sees every earlier one.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``creating``, members ``validated`` | before | analyse against ``created``/``speculating``/``merging`` batches; log ``batched`` per member (first: once the batch is ``created`` another batch's speculate run may admit it); in one transaction claim each member (``batched``, v+1) and move the batch to ``created`` with its direct dependencies; publish ``speculate`` |
| batch ``creating``, a member halted or not ``validated`` | superseded | abandon: the batch stays ``creating`` and inert; ack |
| batch ``created`` | at | replay the member logs and ``speculate`` with the same ids |
| batch ``speculating`` or later | beyond | ack |
| batch missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from dataclasses import replace

from app.controllers.common import StageController, status_log
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain.entities import Batch
from app.domain.messages import SPECULATE, EntityMsg
from app.domain.states import BatchState, RequestState
from app.extensions.base import BatchChanges
from app.queue import Delivery

log = logging.getLogger("submitqueue.controllers")

IN_FLIGHT = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING)


class DependencyAnalysisController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
        if batch.state is BatchState.CREATING:
            enrolled = await self._enrol(batch)
            if enrolled is None:
                return
            batch = enrolled
        elif batch.state is not BatchState.CREATED:
            return
        await self._announce(batch)

    async def _enrol(self, batch: Batch) -> Batch | None:
        q = batch.queue
        async with self.deps.db.read() as s:
            members = await request_repo.get_many(s, queue=q, ids=batch.contains)
            # Every batch already in flight is ahead of this one in the queue.
            in_flight = await batch_repo.list_by_states(s, queue=q, states=IN_FLIGHT)
            details = await change_repo.details_for(
                s, queue=q, request_ids=[*batch.contains, *(m for b in in_flight
                                                            for m in b.contains)])
        if any(members.get(m) is None or members[m].state is not RequestState.VALIDATED
               for m in batch.contains):
            log.info("batch abandoned: a member is no longer validated",
                     extra={"batch_id": batch.id})
            return None

        def files(b: Batch) -> BatchChanges:
            return BatchChanges(b.id, tuple(f.path for m in b.contains
                                            for d in details.get(m, []) for f in d.changed_files))

        analyzer = self.deps.extensions(q).analyzer
        conflicts = set(analyzer.analyze(files(batch), [files(b) for b in in_flight]))
        deps = tuple(b.id for b in in_flight if b.id in conflicts)
        created = replace(batch, state=BatchState.CREATED, dependencies=deps,
                          version=batch.version + 1)
        # Log first: a crash after the write must not leave the batch moving on (another
        # batch's speculate run admits it) with ``batched`` never logged.
        await self._log_batched(created)
        now = self.deps.now()
        async with self.deps.db.write() as s:
            for m in batch.contains:
                old = members[m]
                await request_repo.update(s, old=old, new=replace(
                    old, state=RequestState.BATCHED, version=old.version + 1), now_ms=now)
            await batch_repo.update(s, old=batch, new=created, now_ms=now)
        return created

    async def _log_batched(self, batch: Batch) -> None:
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "batched", now=now, occurrence=batch.id,
                       metadata={"batch_id": batch.id, "dependencies": list(batch.dependencies)})
            for m in batch.contains
        ])

    async def _announce(self, batch: Batch) -> None:
        await self._log_batched(batch)
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                partition_key=batch.queue, message_id=batch.id)
