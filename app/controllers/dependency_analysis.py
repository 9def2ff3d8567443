"""``dependency_analysis``: enrol a new batch's members and find the earlier in-flight
batches it conflicts with. Serial per merge queue, so batches become ``created`` in
one order and each sees every earlier one.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``creating`` of new requests still forming: ``batching.max_size`` > 1, ``normal``, fewer members than the size limit, younger than ``max_wait_ms``, no newer ``creating`` batch in the queue | before | write nothing; hold the delivery ``min(time left, 250 ms)`` and classify again (requests may still join) |
| batch ``creating``, members ``validated`` (a bisection part's: ``batched``) | before | analyse against ``created``/``speculating``/``merging`` batches; in one transaction claim each member (``batched``, v+1) and move the batch to ``created`` with its direct dependencies and the lower-priority batches it overtakes (``app/speculation/priority.py``) and log ``batched`` per member (the outbox); then publish ``speculate`` |
| batch ``creating`` as above, newer ``creating`` batches behind it | before | the same for each of them (up to ``ENROL_AHEAD``, in number order) on the one read of the batches in flight, each analysed against every batch before it (those just enrolled too), each in its own transaction; then publish ``speculate`` per enrolled batch (its id). One with no member ready is skipped (it never enters the queue); the pass stops at one with a member that left, one still forming, or one whose write loses a race: its own delivery handles it and those after it (a batch enrolled ahead replays, as below) |
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
from dataclasses import dataclass, replace

from app.controllers.common import Deps, StageController, status_log
from app.db.memo import Kept, Memo
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain import batching
from app.domain.entities import Batch, ChangeDetails, LandRequest, RequestLog
from app.domain.errors import VersionMismatch
from app.domain.messages import SPECULATE, EntityMsg
from app.domain.states import BatchState, Priority, RequestState
from app.extensions.base import BatchChanges
from app.queue import Delivery
from app.speculation.priority import place

log = logging.getLogger("submitqueue.controllers")

ENROL_AHEAD = 32  # newer ``creating`` batches enrolled on one read of the batches in flight
IN_FLIGHT = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING)
# Past ``created`` but still live: the ``batched`` logs may never have been published.
REPLAY_ONLY = (BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)
FORMING_RECHECK_MS = 250  # a batch waiting for more requests looks again this often


@dataclass
class _Read:
    """What one enrolment pass read: the candidates' members and this batch's claim
    causes, the batches in flight (grown by each batch the pass enrolled), their files,
    and the change details of the members read."""

    members: dict[str, LandRequest]
    causes: list[str]
    in_flight: list[Batch]
    known: dict[tuple[str, tuple[str, ...]], BatchChanges]
    details: dict[str, list[ChangeDetails]]


class DependencyAnalysisController(StageController):
    """Each analysis reads every batch in flight: whole rows only where they changed
    since this process's previous analysis of the queue (``Kept``: ids and versions
    first), once per pass over a backlog (``_enrol_from``). The files a batch in
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
            enrolled = await self._enrol_from(batch)
            if enrolled:  # their logs went out with their writes
                await self._wake(*enrolled)
            return
        elif batch.state in REPLAY_ONLY:
            await self._log_batched(batch, at_ms=batch.created_at_ms)
            return
        elif batch.state is not BatchState.CREATED:
            return
        await self._log_batched(batch, at_ms=batch.updated_at_ms)
        await self._wake(batch)

    async def _wake(self, *batches: Batch) -> None:
        await self.deps.publish_all([(SPECULATE, EntityMsg(id=b.id, queue=b.queue), b.id)
                                     for b in batches])

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

    async def _enrol_from(self, batch: Batch) -> list[Batch]:
        """Enrol ``batch`` and then, on the same read of the batches in flight, the
        newer ``creating`` batches waiting behind it (up to ``ENROL_AHEAD``, in number
        order, each analysed against everything enrolled before it); the pass stops at
        the first that is still forming or loses a race (its own delivery handles it)."""
        q = batch.queue
        async with self.deps.db.read() as s:
            waiting = await batch_repo.creating_after(s, queue=q, than=batch.id,
                                                      limit=ENROL_AHEAD)
            todo = [batch, *waiting]
            members = await request_repo.get_many(
                s, queue=q, ids=[m for b in todo for m in b.contains])
            causes = {b.id: await batch_repo.causes_of(s, queue=q, batch_id=b.id,
                                                       request_ids=b.contains)
                      for b in todo}
            # Every batch already in flight is ahead of these in the queue.
            kept, details_memo = self._memos(q)
            in_flight = await batch_repo.list_kept(s, queue=q, states=IN_FLIGHT,
                                                   kept=kept)
            known = self._files_in_flight(q, in_flight)
            details = await change_repo.details_for(
                s, queue=q, request_ids=[*(m for b in todo for m in b.contains), *(
                    m for b in in_flight if (b.id, b.contains) not in known
                    for m in b.contains)],
                memo=details_memo)
        enrolled: list[Batch] = []
        for b in todo:
            if b is not batch:
                live = self._live(b, members, causes[b.id])
                if not live:
                    continue  # abandoned (its own delivery says so): never in flight
                if len(live) < len(b.contains) or await self._forming(b):
                    break  # a member left, or it still takes requests: its own delivery
            try:
                created = await self._enrol(b, _Read(members, causes[b.id], in_flight,
                                                     known, details))
            except VersionMismatch:
                if b is batch:
                    raise  # the retry classifies again
                break  # changed since the read (a cancel): left to its own delivery
            if created is not None:
                in_flight.append(created)
                enrolled.append(created)
        return enrolled

    async def _enrol(self, batch: Batch, read: _Read) -> Batch | None:
        q = batch.queue
        members, in_flight, known, details = \
            read.members, read.in_flight, read.known, read.details
        live = self._live(batch, members, read.causes)
        if not live:
            log.info("batch abandoned: no member is ready any more",
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

    @staticmethod
    def _live(batch: Batch, members: dict[str, LandRequest], causes: list[str]
              ) -> tuple[str, ...]:
        """The members ready to enrol: ``validated``, or ``batched`` in a bisection part
        (by the failed batch it splits)."""
        part = any(batching.parent_of(batch.queue, c) for c in causes)
        ready = RequestState.BATCHED if part else RequestState.VALIDATED
        return tuple(m for m in batch.contains
                     if members.get(m) is not None and members[m].state is ready)

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
