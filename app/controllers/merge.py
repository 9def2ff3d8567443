"""``merge``: land a batch whose exact combination passed, through the queue's merger.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``merging``, every member live, the queue frozen (``app/controllers/freeze.py``: a manual freeze or a ``freeze_windows`` window), unless the freeze has ``allow_hotfix`` and every member is a ``hotfix`` | before (waiting) | hold the message until the freeze ends or ``freeze_recheck_ms``, whichever is first (no attempt spent, nothing logged, nothing merged); the batch stays ``merging`` |
| batch ``merging``, every member live | before | log ``landing`` per member; check the delivery still holds its lease (``ensure_held``: a stale holder raises ``LeaseLost`` and never pushes; its successor merges); merge the members' changes in order as one update, handing the merger the trees of the batch's passed builds whose assumptions came true (``MergeSpec.tested``: it lands only one of those, else fails ``untested_tree``; infrastructure errors propagate and are retried; the merger recognises changes already landed); publish the result, with each member's landed commits or the typed failure, to ``mergesignal`` (id = batch id, plus ``/r<n>`` for the n-th round after moves of the target sent the batch back to speculation) ; the freeze is asked again as the merger's ``gate`` right before the ref update (the git mergers: after fetch, apply and the exact-trees guard; the fake ones: right before their call), and a freeze found there holds the message as above with nothing pushed (its ``landing`` logs stay: they were true until then) |
| batch ``merging``, a member terminal or missing | superseded | refuse: nothing is merged or pushed, no ``landing`` log; publish a ``failed`` result naming the members and their states to ``mergesignal`` (the round's id and ``round``, as below), which fails the batch with that reason (the members keep their terminal states; the queue re-plans without the batch) |
| batch terminal or halted | beyond | ack |
| batch ``speculating`` after a move of the target sent it back (a trunk epoch names it) | superseded | ack (that round's merge is over; the next round has its own message id) |
| batch ``creating`` / ``created``, or ``speculating`` with no move on record | invalid | raise ``InvalidState`` |
| batch missing | invalid | raise ``NotFound`` |

The race with a freeze that starts while a merge is under way: the freeze is checked
as late as possible, from the database (never a cache), right before the ref update;
a merge that passed that check finishes (its push is a single ref update and cannot be
half undone), so a freeze's commit stops every merge that had not reached the ref
update by then and none after it.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import StageController, status_log
from app.controllers.freeze import freeze_of, hold_ms
from app.db.repos import batches as batch_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch
from app.domain.errors import InvalidState
from app.domain.freeze import hotfix_passes
from app.domain.freeze import text as freeze_text
from app.domain.messages import MERGESIGNAL, EntityMsg, ResultMsg
from app.domain.states import Assumption, BatchState, PathStatus
from app.extensions.base import HELD, MergeSpec, MergeStep, TestedTree
from app.queue import Delivery


class MergeController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        async with self.deps.db.read() as s:
            # The round first: a move records its epoch and writes the batch back to
            # ``speculating`` in one transaction, so a batch read ``merging`` after it
            # is in that round (see ``SpeculateController._dispatch_merge``).
            round_ = await epoch_repo.rounds(s, queue=msg.queue, batch_id=msg.id)
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
            members = await request_repo.get_many(s, queue=msg.queue, ids=batch.contains)
        if batch.state.halted:
            return
        if batch.state is BatchState.SPECULATING and round_:
            return  # a move sent it back to speculation: that round's merge is over
        if batch.state is not BatchState.MERGING:
            raise InvalidState(f"batch {batch.id} is {batch.state}; merge needs merging")
        # A member that already ended (say ``error``) must not have its change land:
        # its reported outcome would be a lie. Any such member refuses the whole batch,
        # since what passed the build is the combination of all of them.
        ended = [f"{m} is {members[m].state}" if m in members else f"{m} is missing"
                 for m in batch.contains if m not in members or members[m].state.terminal]
        suffix = epoch_repo.round_suffix(round_)
        if ended:
            await self.deps.publish(MERGESIGNAL, ResultMsg(
                id=batch.id, queue=batch.queue, outcome="failed",
                reason=f"refused to land: {', '.join(ended)}; a batch lands only while "
                       "every member is live", round=round_), message_id=batch.id + suffix)
            return
        hotfix = tuple(members[m].priority.value for m in batch.contains)
        if await self._frozen(batch.queue, hotfix):
            await self._hold(delivery, batch.queue)
            return
        now = self.deps.now()
        await self.deps.publish_logs([
            status_log(batch.queue, m, "landing", now=now, occurrence=batch.id + suffix,
                       metadata={"batch_id": batch.id}) for m in batch.contains])
        spec = MergeSpec(queue=batch.queue, id=batch.id, steps=tuple(
            MergeStep(m, members[m].change_uris, members[m].strategy) for m in batch.contains),
            tested=await self._tested(batch), gate=lambda: self._frozen(batch.queue, hotfix))
        merger = self.deps.extensions(batch.queue).merger
        await delivery.ensure_held()  # a holder whose lease lapsed must not push
        if await self._frozen(batch.queue, hotfix):  # for mergers that never ask the gate
            await self._hold(delivery, batch.queue)
            return
        outcome = await self.deps.timed("merge", batch.queue, merger.merge(spec))
        if outcome.code == HELD:  # the gate found the queue frozen: nothing was updated
            await self._hold(delivery, batch.queue)
            return
        await self.deps.publish(MERGESIGNAL, ResultMsg(
            id=batch.id, queue=batch.queue,
            outcome="succeeded" if outcome.succeeded else "failed", reason=outcome.reason,
            outputs=list(outcome.outputs), conflicting_paths=list(outcome.conflicting_paths),
            commits={m: list(outcome.commits.get(m, ())) for m in batch.contains
                     if outcome.succeeded},
            code=outcome.code, tip=outcome.tip, moved=outcome.moved, round=round_,
        ), message_id=batch.id + suffix)

    async def _frozen(self, queue: str, priorities: tuple[str, ...]) -> str:
        """Why ``queue`` may not land a batch whose members have ``priorities`` now (its
        freeze's text), or "" when it may: not frozen, or an ``allow_hotfix`` freeze and
        every member a ``hotfix``."""
        freeze = await freeze_of(self.deps, queue)
        if freeze is None or hotfix_passes(freeze, priorities=priorities):
            return ""
        return freeze_text(freeze)

    async def _hold(self, delivery: Delivery, queue: str) -> None:
        now = self.deps.now()
        freeze = await freeze_of(self.deps, queue, now_ms=now)
        delivery.hold(self.deps.freeze_recheck_ms if freeze is None
                      else hold_ms(freeze, now, self.deps.freeze_recheck_ms))

    async def _tested(self, batch: Batch) -> tuple[TestedTree, ...] | None:
        """The trees of the batch's passed builds whose assumptions match the trunk as it
        is (each dependency that landed assumed to succeed, every other to fail), or None
        when none of its passed builds recorded a tree (a runner that records none: the
        fake ones)."""
        q = batch.queue
        async with self.deps.db.read() as s:
            path_set = (await spec_repo.path_sets(s, queue=q, heads=[batch.id]))[batch.id]
            passed = [e for e in path_set.entries if e.status is PathStatus.PASSED]
            links = await spec_repo.links(s, queue=q, keys=[(e.id, e.attempt) for e in passed])
            builds = await spec_repo.builds_by_id(s, queue=q, ids=links.values())
            found = [builds[links[(e.id, e.attempt)]] for e in passed
                     if links.get((e.id, e.attempt)) in builds]
            if not any(b.tree_sha for b in found):
                return None
            states = await batch_repo.states_of(s, queue=q, ids=batch.dependencies)
        landed = {d for d, state in states.items() if state is BatchState.SUCCEEDED}
        # What the trunk holds now: the dependencies that landed, and no other (one
        # still unsettled, overtaken on full coverage, is not on the trunk yet).
        now = {e.id for e in passed if all(
            (a is Assumption.SUCCEEDS) == (d in landed) for d, a in e.path.dependencies)}
        return tuple(TestedTree(base=b.base_sha, commit=b.commit_sha, tree=b.tree_sha,
                                changes=b.changes, build_id=b.id)
                     for b in found if b.tree_sha and b.path_id in now)
