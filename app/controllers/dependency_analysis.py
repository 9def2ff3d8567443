"""``dependency_analysis``: enrol a new batch's members and find the earlier in-flight
batches it conflicts with. Serial per merge queue, so batches become ``created`` in
one order and each sees every earlier one.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``creating`` of new requests still forming: ``batching.max_size`` > 1, ``normal``, fewer members than the size limit, younger than ``max_wait_ms``, no newer ``creating`` batch in the queue | before | write nothing; hold the delivery ``min(time left, 250 ms)`` and classify again (requests may still join) |
| batch ``creating``, members ``validated`` (a bisection part's: ``batched``) | before | analyse against ``created``/``speculating``/``merging`` batches; in one transaction claim each member (``batched``, v+1) and move the batch to ``created`` with its direct dependencies and the lower-priority batches it overtakes (``app/speculation/priority.py``) and log ``batched`` per member (the outbox); then publish ``speculate`` |
| batch ``creating``, some members halted or not ``validated``/``batched`` as above, some ready | before | the same for the ready members; in that transaction the others leave the batch (a cancel ended them; their association is removed) |
| batch ``creating``, the claim loses a race (``VersionMismatch``: a cancel, say) | before | nothing was logged; the retry classifies again (the halted member leaves) |
| batch ``creating``, no member ready | superseded | abandon: the batch stays ``creating`` and inert; ack |
| batch ``created`` | at | replay the member logs and ``speculate`` with the same ids |
| batch ``speculating`` / ``merging`` / ``cancelling`` | beyond | replay the member logs only (same ids; no-ops if they were published). A crash between the write and the logs may let another batch's speculate run admit this one before the redelivery: the logs are still published |
| batch terminal | beyond | ack |
| batch missing | invalid | raise ``NotFound`` |

**Priority.** A batch depends on the conflicting batches in flight that are ``merging``
or of at least its priority; the conflicting ones of a lower priority that are not yet
merging are recorded as its ``overtakes`` (in the same ``created`` write, the only
write of this stage; it never writes another batch). The ``speculate`` run, which owns
``speculating`` batches, turns each overtake into a dependency of the overtaken batch
in its fenced plan write (``app/speculation/priority.py``), so no edge is lost or
written twice under redelivery, and none closes a cycle.

Logs go out with the durable write (in its transaction); replays follow it. The
``batched`` log's timestamp is the time of the ``created`` write (the batch's
``updated_at_ms`` while it is ``created``); replayed from a later state it is the
batch's creation time, which precedes every later status of the batch, so a late
replay never rolls the gateway's projection back (and equals the ``batching`` log's
stamp, so the history still reads batching, batched).
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from dataclasses import replace

from app.controllers.common import Deps, StageController, status_log
from app.db.memo import Kept, Memo
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain import batching
from app.domain.entities import Batch, ChangeDetails, RequestLog
from app.domain.messages import SPECULATE, EntityMsg
from app.domain.states import BatchState, Priority, RequestState
from app.extensions.base import BatchChanges
from app.queue import Delivery
from app.speculation.priority import place

log = logging.getLogger("submitqueue.controllers")

IN_FLIGHT = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING)
# Past ``created`` but still live: the ``batched`` logs may never have been published.
REPLAY_ONLY = (BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)
FORMING_RECHECK_MS = 250  # a batch waiting for more requests looks again this often


class DependencyAnalysisController(StageController):
    """Each analysis reads every batch in flight: whole rows only where they changed
    since this process's previous analysis of the queue (``Kept``: ids and versions
    first). The files a batch in
    flight touches are read once per process: a batch's members are fixed once it is
    ``created`` and a change's details once it is validated, so they are kept by batch
    id and members (``_files``) and only the batches not seen before are read."""

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self._memo: dict[str, tuple[Kept[Batch], Memo[ChangeDetails]]] = {}
        self._files: dict[str, dict[tuple[str, tuple[str, ...]], BatchChanges]] = {}

    def _memos(self, queue: str) -> tuple[Kept[Batch], Memo[ChangeDetails]]:
        kept, details = self._memo.setdefault(queue, (Kept(), Memo()))
        details.fresh()
        return kept, details

    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
        if batch.state is BatchState.CREATING:
            wait = await self._forming(batch)
            if wait:
                delivery.hold(wait)
                return
            enrolled = await self._enrol(batch)
            if enrolled is not None:  # its logs went out with the write
                await self._wake(enrolled)
            return
        elif batch.state in REPLAY_ONLY:
            await self._log_batched(batch, at_ms=batch.created_at_ms)
            return
        elif batch.state is not BatchState.CREATED:
            return
        await self._log_batched(batch, at_ms=batch.updated_at_ms)
        await self._wake(batch)

    async def _wake(self, batch: Batch) -> None:
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                message_id=batch.id)

    async def _forming(self, batch: Batch) -> int:
        """How long a batch of new requests still waits for more (0: close it now)."""
        cfg = self.deps.extensions(batch.queue).batching
        left = batch.created_at_ms + cfg.max_wait_ms - self.deps.now()
        if cfg.max_size <= 1 or left <= 0 or batch.priority is not Priority.NORMAL:
            return 0
        async with self.deps.db.read() as s:
            if await batch_repo.newer_creating(s, queue=batch.queue, than=batch.id):
                return 0  # a later batch exists: this one stops taking requests
            recent = await batch_repo.recent_outcomes(
                s, queue=batch.queue, limit=batching.RECENT_OUTCOMES) if cfg.adaptive else []
            causes = await batch_repo.causes_of(s, queue=batch.queue, batch_id=batch.id,
                                                request_ids=batch.contains)
        full = len(batch.contains) >= batching.window(
            cfg.max_size, adaptive=cfg.adaptive, recent=recent)
        if full or any(batching.parent_of(batch.queue, c) for c in causes):
            return 0
        return min(left, FORMING_RECHECK_MS)

    async def _enrol(self, batch: Batch) -> Batch | None:
        q = batch.queue
        async with self.deps.db.read() as s:
            members = await request_repo.get_many(s, queue=q, ids=batch.contains)
            causes = await batch_repo.causes_of(s, queue=q, batch_id=batch.id,
                                                request_ids=batch.contains)
            # Every batch already in flight is ahead of this one in the queue.
            kept, details_memo = self._memos(q)
            in_flight = await batch_repo.list_kept(s, queue=q, states=IN_FLIGHT,
                                                   kept=kept)
            known = self._files_in_flight(q, in_flight)
            details = await change_repo.details_for(
                s, queue=q, request_ids=[*batch.contains, *(
                    m for b in in_flight if (b.id, b.contains) not in known
                    for m in b.contains)],
                memo=details_memo)
        # A bisection part's members are ``batched`` already (by the failed batch).
        part = any(batching.parent_of(q, c) for c in causes)
        ready = RequestState.BATCHED if part else RequestState.VALIDATED
        live = tuple(m for m in batch.contains
                     if members.get(m) is not None and members[m].state is ready)
        if not live:
            log.info("batch abandoned: no member is %s any more", ready.value,
                     extra={"batch_id": batch.id})
            return None
        dropped = [m for m in batch.contains if m not in live]
        batch = replace(batch, contains=live)

        def files(b: Batch) -> BatchChanges:
            return BatchChanges(b.id, tuple(f.path for m in b.contains
                                            for d in details.get(m, []) for f in d.changed_files))

        for b in in_flight:
            if (b.id, b.contains) not in known:
                known[(b.id, b.contains)] = files(b)
        known[(batch.id, batch.contains)] = mine = files(batch)  # in flight once created
        analyzer = self.deps.extensions(q).analyzer
        conflicts = set(analyzer.analyze(mine, [known[(b.id, b.contains)]
                                                for b in in_flight]))
        deps, overtakes = place(batch, [b for b in in_flight if b.id in conflicts],
                                {b.id: b.dependencies for b in in_flight})
        now = self.deps.now()
        created = replace(batch, state=BatchState.CREATED, dependencies=deps,
                          overtakes=overtakes, version=batch.version + 1, updated_at_ms=now)
        async with self.deps.transaction() as (s, outbox):
            for m in dropped:  # halted since it joined (a cancel): it leaves the batch
                await batch_repo.leave(s, queue=q, batch_id=batch.id, request_id=m)
            for m in batch.contains:
                old = members[m]
                await request_repo.update(s, old=old, new=replace(
                    old, state=RequestState.BATCHED, version=old.version + 1), now_ms=now)
            await batch_repo.update(s, old=batch, new=created, now_ms=now)
            await outbox.logs(self._batched(created, at_ms=created.updated_at_ms))
        return created

    def _files_in_flight(self, queue: str, in_flight: list[Batch]
                         ) -> dict[tuple[str, tuple[str, ...]], BatchChanges]:
        """The queue's kept files, without the batches no longer in flight."""
        live = {(b.id, b.contains) for b in in_flight}
        kept = self._files.get(queue, {})
        self._files[queue] = kept = {k: v for k, v in kept.items() if k in live}
        return kept

    async def _log_batched(self, batch: Batch, *, at_ms: int) -> None:
        await self.deps.publish_logs(self._batched(batch, at_ms=at_ms))

    @staticmethod
    def _batched(batch: Batch, *, at_ms: int) -> list[RequestLog]:
        md: dict[str, object] = {"batch_id": batch.id,
                                 "dependencies": list(batch.dependencies)}
        if batch.overtakes:  # a higher priority batch went ahead of these
            md["overtakes"] = list(batch.overtakes)
        return [status_log(batch.queue, m, "batched", now=at_ms, occurrence=batch.id,
                           metadata=md)
                for m in batch.contains]
