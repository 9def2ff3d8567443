"""``mergesignal``: record a merge's outcome on the batch and fan it out.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``merging``, result of an earlier round (``round`` below the batch's) | superseded | ack |
| batch ``merging``, failed ``untested_tree`` with ``moved`` (the target is at a tip no passed build started from: it moved outside the queue) | before | a new fact, not a failure: log ``untested_tree`` (reason, tip) and ``speculating`` per member; in one transaction start a new trunk epoch at that tip (``outside`` unless the tip is a commit another batch of the queue landed: then the epoch is this batch's own) and write the batch back to ``speculating``; publish a ``speculate`` wake-up (id names the epoch), which refutes and rebuilds the paths built in an older epoch (every batch's for an outside move, else this batch's) |
| batch ``merging``, otherwise | before | log ``untested_tree`` per member when that is the failure; conditional write ``succeeded`` (with each member's landed commits) / ``failed`` (with the reason); publish ``conclude`` then a ``speculate`` wake-up for the rest of the queue |
| batch ``speculating``, a move its merge found on record (an ``untested_tree`` result already applied) | at | replay the wake-up of the newest epoch this batch found (same id) |
| batch ``succeeded`` / ``failed`` | at | replay ``conclude`` and the wake-up with the same ids |
| batch ``cancelled`` / ``cancelling`` | superseded | ack |
| batch ``creating`` / ``created``, or ``speculating`` with no move on record | invalid | raise ``InvalidState`` |
| batch missing | invalid | raise ``NotFound`` |
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import replace

from app.controllers.common import StageController, event_log, status_log
from app.db.repos import batches as batch_repo
from app.db.repos import epochs as epoch_repo
from app.domain.entities import Batch
from app.domain.errors import InvalidState
from app.domain.messages import CONCLUDE, SPECULATE, ConcludeMsg, EntityMsg, ResultMsg
from app.domain.states import BatchState
from app.queue import Delivery

UNTESTED_TREE = "untested_tree"


class MergeSignalController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = ResultMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
            round_ = await epoch_repo.rounds(s, queue=msg.queue, batch_id=msg.id)
        if batch.state in (BatchState.CANCELLED, BatchState.CANCELLING):
            return
        if batch.state is BatchState.SPECULATING and round_:
            await self._wake_moved(batch, round_)
            return
        if batch.state is BatchState.MERGING:
            if msg.round < round_:
                return
            if msg.code == UNTESTED_TREE:
                await self._log_untested(batch, msg)
                if msg.moved and msg.tip:
                    await self._moved(batch, msg, round_)
                    return
                self.deps.metrics.untested_tree(batch.queue, moved=False)
            batch = await self._finish(batch, msg)
        elif not batch.state.terminal:
            raise InvalidState(f"batch {batch.id} is {batch.state}; no merge was dispatched")
        await self.deps.publish(
            CONCLUDE, ConcludeMsg(id=batch.id, queue=batch.queue,
                                  failure_reason=batch.failure_reason),
            message_id=f"{batch.id}/conclude/merged")
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                message_id=f"{batch.id}/merged")

    async def _finish(self, batch: Batch, msg: ResultMsg) -> Batch:
        ok = msg.outcome == "succeeded"
        reason = "" if ok else f"merge failed: {msg.reason or 'the merger gave no reason'}"
        landed = {m: tuple(msg.commits.get(m, ())) for m in batch.contains} if ok else {}
        new = replace(batch, state=BatchState.SUCCEEDED if ok else BatchState.FAILED,
                      failure_reason=reason, landed=landed, version=batch.version + 1)
        async with self.deps.db.write() as s:
            await batch_repo.update(s, old=batch, new=new, now_ms=self.deps.now())
        self.deps.metrics.merge_finished(batch.queue, msg.outcome)
        return new

    async def _log_untested(self, batch: Batch, msg: ResultMsg) -> None:
        now = self.deps.now()
        md = {"batch_id": batch.id, "reason": UNTESTED_TREE, "detail": msg.reason[:2000],
              "tip": msg.tip, "moved": msg.moved}
        await self.deps.publish_logs([
            event_log(batch.queue, m, UNTESTED_TREE, now=now,
                      occurrence=f"{batch.id}/r{msg.round}", metadata=md)
            for m in batch.contains])

    async def _moved(self, batch: Batch, msg: ResultMsg, round_: int) -> None:
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "speculating", now=now,
                       occurrence=f"{batch.id}/moved/{round_ + 1}",
                       metadata={"batch_id": batch.id, "moved_to": msg.tip})
            for m in batch.contains])
        new = replace(batch, state=BatchState.SPECULATING, version=batch.version + 1)
        async with self.deps.db.write() as s:
            ours = await epoch_repo.landed_by_queue(s, queue=batch.queue, sha=msg.tip)
            await epoch_repo.record(s, queue=batch.queue, tip_sha=msg.tip, batch_id=batch.id,
                                    now_ms=now, outside=not ours)
            await batch_repo.update(s, old=batch, new=new, now_ms=now)
        self.deps.metrics.untested_tree(batch.queue, moved=not ours)
        await self._wake_moved(new, round_ + 1)

    async def _wake_moved(self, batch: Batch, round_: int) -> None:
        await self.deps.publish(SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                                message_id=f"{batch.id}/moved/{round_}")
