"""``speculate``: one run per merge queue at a time (a serial partition) that reloads the
whole queue, folds build results into path sets, finalises what the facts decide, funds
new paths within the build budget, and dispatches.

Dirty signals coalesce: a message published before the start of the last completed
run of its queue (in this process) carries nothing that run did not already read, so
it only gets the cheap pre-step.

Pre-step on the message's batch:

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch terminal, some member not terminal | at | re-publish ``conclude`` (repair) |
| batch ``created`` | before | admit: log ``speculating`` per member, conditional write ``speculating`` |
| batch ``merging`` | at | re-dispatch the merge (``speculated`` logs + ``merge``, same ids) |
| batch missing | invalid | raise ``NotFound`` |

The run, over every active batch (``created``/``speculating``/``merging``/``cancelling``):

| Loaded state | Action |
|---|---|
| ``created`` | admit (as above) |
| ``cancelling`` | stop its live paths; when none is live, write ``cancelled`` and publish ``conclude`` |
| ``speculating`` | stop live paths a settled dependency contradicts; **merge** when a passed path's assumptions all came true (stop the siblings, write ``merging``, log ``speculated``, publish ``merge``); **fail** when every dependency settled and every unbroken path failed (write ``failed``, publish ``conclude``); else fund the likely path if the budget allows |
| ``merging`` | nothing (its outcome arrives through ``mergesignal``) |

Every write is conditional; path sets and the batch transition of a decided head are
written in one transaction, after a recovery ``speculate`` message for that batch, and
the dispatch follows the write. A lost race raises ``VersionMismatch`` and the whole
run is retried.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncSession

from app.controllers.common import Deps, event_log, status_log, unique_id
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, Build, PathEntry, PathSet
from app.domain.messages import BUILD, CONCLUDE, MERGE, SPECULATE, BuildMsg, ConcludeMsg, EntityMsg
from app.domain.states import BatchState, PathStatus
from app.queue import Delivery
from app.speculation import core
from app.speculation.core import Resolution

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)
COALESCE_MARGIN_MS = 50


@dataclass
class Snapshot:
    queue: str
    batches: dict[str, Batch]  # active ones and every dependency they name
    sets: dict[str, PathSet]  # as stored
    entries: dict[str, list[PathEntry]]  # as folded in this run
    links: dict[tuple[str, int], str]
    builds: dict[str, Build]
    decided: set[str] = field(default_factory=set)
    _res: dict[str, Resolution] | None = None

    def active(self, *states: BatchState) -> list[Batch]:
        return sorted((b for b in self.batches.values() if b.state in states),
                      key=lambda b: (b.created_at_ms, b.id))

    def res(self) -> dict[str, Resolution]:
        """How every known batch resolved; kept up to date by ``put``."""
        if self._res is None:
            self._res = {bid: core.resolution(b.state) for bid, b in self.batches.items()}
        return self._res

    def put(self, batch: Batch) -> None:
        self.batches[batch.id] = batch
        if self._res is not None:
            self._res[batch.id] = core.resolution(batch.state)

    def linked(self, e: PathEntry) -> bool:
        return (e.id, e.attempt) in self.links

    def changed(self, head: str) -> bool:
        return tuple(self.entries.get(head, [])) != self.sets[head].entries


class SpeculateController:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._last_run_started: dict[str, int] = {}

    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        await self._pre_step(msg)
        last = self._last_run_started.get(msg.queue)
        if last is not None and delivery.message.published_at_ms + COALESCE_MARGIN_MS < last:
            return
        started = self.deps.now()
        await self._run(msg.queue)
        self._last_run_started[msg.queue] = started

    # -- pre-step --------------------------------------------------------------
    async def _pre_step(self, msg: EntityMsg) -> None:
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
            members = await request_repo.get_many(s, queue=msg.queue, ids=batch.contains)
        if batch.state.terminal:
            if any(not m.state.terminal for m in members.values()):
                await self._conclude(batch, message_id=unique_id(f"{batch.id}/conclude/repair"))
        elif batch.state is BatchState.CREATED:
            await self._admit(batch)
        elif batch.state is BatchState.MERGING:
            await self._dispatch_merge(batch)

    async def _admit(self, batch: Batch) -> Batch:
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "speculating", now=now, occurrence=batch.id,
                       metadata={"batch_id": batch.id, "dependencies": list(batch.dependencies)})
            for m in batch.contains])
        new = replace(batch, state=BatchState.SPECULATING, version=batch.version + 1)
        async with self.deps.db.write() as s:
            await batch_repo.update(s, old=batch, new=new, now_ms=now)
        return new

    # -- the run ---------------------------------------------------------------
    async def _run(self, queue: str) -> None:
        snap = await self._snapshot(queue)
        for batch in snap.active(BatchState.CREATED):
            snap.put(await self._admit(batch))
        for batch in snap.active(BatchState.CANCELLING):
            await self._finish_cancelling(snap, batch)
        progress = True
        while progress:  # a failed head settles its dependents: decide again
            progress = False
            for head in snap.active(BatchState.SPECULATING):
                if head.id not in snap.decided:
                    progress = await self._finalize(snap, head) or progress
        await self._fund_and_dispatch(snap)

    async def _snapshot(self, queue: str) -> Snapshot:
        async with self.deps.db.read() as s:
            active = await batch_repo.list_by_states(s, queue=queue, states=ACTIVE)
            batches = {b.id: b for b in active}
            dep_ids = {d for b in active for d in b.dependencies} - set(batches)
            batches.update(await batch_repo.get_many(s, queue=queue, ids=dep_ids))
            sets = await spec_repo.path_sets(s, queue=queue, heads=[b.id for b in active])
            keys = [(e.id, e.attempt) for ps in sets.values() for e in ps.entries
                    if e.status.live]
            links = await spec_repo.links(s, queue=queue, keys=keys)
            builds = await spec_repo.builds_by_id(s, queue=queue, ids=links.values())
        now = self.deps.now()
        entries = {
            h: [core.fold(e, builds.get(links.get((e.id, e.attempt), "")),
                          (e.id, e.attempt) in links, now) for e in ps.entries]
            for h, ps in sets.items()
        }
        return Snapshot(queue, batches, sets, entries, links, builds)

    def _stop(self, snap: Snapshot, head: str, keep: str | None = None) -> None:
        now = self.deps.now()
        snap.entries[head] = [
            e if e.id == keep else core.cancel(e, linked=snap.linked(e), now=now)
            for e in snap.entries.get(head, [])]

    async def _finish_cancelling(self, snap: Snapshot, batch: Batch) -> None:
        self._stop(snap, batch.id)
        if core.live(snap.entries.get(batch.id, [])):
            await self._save_sets(snap, [batch.id])
            return
        reason = "cancelled by request"
        await self._commit(snap, batch, BatchState.CANCELLED, reason)
        await self._conclude(snap.batches[batch.id], message_id=f"{batch.id}/conclude/speculate")

    async def _finalize(self, snap: Snapshot, head: Batch) -> bool:
        res = snap.res()
        now = self.deps.now()
        entries = snap.entries.setdefault(head.id, [])
        snap.entries[head.id] = [
            core.cancel(e, linked=snap.linked(e), now=now) if core.broken(e.path, res) else e
            for e in entries]
        await self._announce_passed(head, snap.entries[head.id], res)
        verdict = core.decide(head, snap.entries[head.id], res)
        if verdict.kind == "wait":
            return False
        snap.decided.add(head.id)
        if verdict.kind == "merge":
            self._stop(snap, head.id, keep=verdict.path_id)
            await self._commit(snap, head, BatchState.MERGING, "")
            await self._dispatch_merge(snap.batches[head.id])
            return False
        await self._commit(snap, head, BatchState.FAILED, verdict.reason)
        await self._conclude(snap.batches[head.id], message_id=f"{head.id}/conclude/speculate")
        return True

    async def _announce_passed(self, head: Batch, entries: Sequence[PathEntry],
                               res: dict[str, Resolution]) -> None:
        """``waiting`` for a passed path whose dependencies have not settled;
        ``invalidated`` for a passed path a settled dependency contradicted."""
        now = self.deps.now()
        logs = []
        for e in entries:
            if e.status is not PathStatus.PASSED or core.settled(e.path, res):
                continue
            event = "invalidated" if core.broken(e.path, res) else "waiting"
            md = {"batch_id": head.id, "path_id": e.id,
                  "assumptions": {d: a.value for d, a in e.path.dependencies}}
            logs += [event_log(head.queue, m, event, now=now, occurrence=e.id, metadata=md)
                     for m in head.contains]
        await self.deps.publish_logs(logs)

    async def _commit(self, snap: Snapshot, batch: Batch, state: BatchState,
                      reason: str) -> None:
        """Path set and transition in one transaction, after a recovery wake-up."""
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                partition_key=batch.queue,
                                message_id=unique_id(f"{batch.id}/recover"))
        new = replace(batch, state=state, failure_reason=reason, version=batch.version + 1)
        now = self.deps.now()
        async with self.deps.db.write() as s:
            await self._write_set(s, snap, batch.id)
            await batch_repo.update(s, old=batch, new=new, now_ms=now)
        snap.put(new)

    async def _write_set(self, s: AsyncSession, snap: Snapshot, head: str) -> None:
        if not snap.changed(head):
            return
        old = snap.sets[head]
        new = replace(old, entries=tuple(snap.entries[head]), version=old.version + 1)
        await spec_repo.save_path_set(s, old=old, new=new)
        snap.sets[head] = new

    async def _save_sets(self, snap: Snapshot, heads: Sequence[str]) -> None:
        dirty = [h for h in heads if h in snap.sets and snap.changed(h)]
        if dirty:
            async with self.deps.db.write() as s:
                for h in dirty:
                    await self._write_set(s, snap, h)

    async def _fund_and_dispatch(self, snap: Snapshot) -> None:
        heads = [b for b in snap.active(BatchState.SPECULATING) if b.id not in snap.decided]
        budget = self.deps.extensions(snap.queue).build_budget
        now = self.deps.now()
        for path in core.sticky_fund(heads, snap.entries, snap.res(), budget):
            snap.entries.setdefault(path.head, []).append(
                PathEntry(path=path, status=PathStatus.PENDING, attempt=1, created_at_ms=now,
                          updated_at_ms=now))
            snap.sets.setdefault(path.head, PathSet(queue=snap.queue, head=path.head))
        await self._save_sets(snap, list(snap.entries))
        for head in heads:
            for e in snap.entries.get(head.id, []):
                if e.status is PathStatus.PENDING and not snap.linked(e):
                    await self.deps.publish(
                        BUILD, BuildMsg(id=head.id, queue=head.queue, path_id=e.id,
                                        attempt=e.attempt),
                        partition_key=head.id, message_id=f"{head.id}/build/{e.id}/{e.attempt}")

    # -- dispatch --------------------------------------------------------------
    async def _dispatch_merge(self, batch: Batch) -> None:
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "speculated", now=now, occurrence=batch.id,
                       metadata={"batch_id": batch.id}) for m in batch.contains])
        await self.deps.publish(MERGE, EntityMsg(id=batch.id, queue=batch.queue),
                                partition_key=batch.queue, message_id=f"{batch.id}/merge-dispatch")

    async def _conclude(self, batch: Batch, *, message_id: str) -> None:
        await self.deps.publish(
            CONCLUDE, ConcludeMsg(id=batch.id, queue=batch.queue,
                                  failure_reason=batch.failure_reason),
            partition_key=batch.queue, message_id=message_id)
