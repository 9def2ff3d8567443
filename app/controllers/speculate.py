"""``speculate``: one run per merge queue at a time (a serial partition) that reloads the
whole queue, folds build results into path sets, asks the pure planner
(``app.speculation.planner.plan``) what the facts decide and which paths to fund
within the build budget, checks the plan, writes it in one transaction, and
dispatches.

Dirty signals coalesce on the queue's sequence numbers, never on clocks: before a run
reads its snapshot it notes the highest message number stored (``latest_seq``); once
the run completes, a message of that queue numbered at or below it only gets the cheap
pre-step. Why that drops nothing: every ``speculate`` publisher writes first and
publishes after its commit (never through the outbox), and a number at or below the
mark was assigned before the mark was read, so the write it announces committed before
the snapshot. The mark is
this process's own and only grows from runs that completed; another process (or a
restart) starts without one and runs. A resync job (``app/controllers/resync.py``)
wakes every queue with active batches periodically, so a lost wake-up cannot stall one.

Pre-step on the message's batch:

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch terminal for less than ``CONCLUSION_GRACE_MS``, some member not terminal | at | nothing: its conclusion is in flight (the stage that wrote it published ``conclude`` with it; the wake-up after a merge usually arrives first) |
| batch terminal for longer, some member not terminal | at | re-publish ``conclude`` (repair, a unique id: whichever stage concluded it, its conclusion did not finish) |
| batch terminal, every member terminal | beyond | nothing |
| batch ``created`` | before | admit: log ``speculating`` per member, conditional write ``speculating`` |
| batch ``merging`` | at | re-dispatch the merge (``speculated`` logs + ``merge``, same ids). The replayed log names only the batch: which path the run merged on (and a bypass's details) is not stored, so it is missing from the history when a crash lost the run's own log; else the queue keeps the run's |
| batch ``creating`` / ``speculating`` / ``cancelling`` | - | nothing; the run decides |
| batch missing | invalid | raise ``NotFound`` |

The run, over every active batch (``created``/``speculating``/``merging``/``cancelling``):

| Loaded state | Action |
|---|---|
| ``created`` | admit (as above) |
| ``cancelling`` | stop its live paths; when none is live, write ``cancelled`` and publish ``conclude`` |
| ``speculating``, a path passed or building in an older trunk epoch (its build ran on a tip the target no longer has: it moved outside the queue) | refuted before the planner sees it: a new attempt (``pending``, attempt + 1; not an errored attempt, so it spends none of the errored-build budget), counted on the move's ``rebuilt`` in the plan's transaction; an epoch the batch's own merge started (the tip another batch landed, which its builds lacked) refutes that batch's paths alone |
| ``speculating`` | the planner's verdict: **merge** on a passed path whose assumptions all came true, or on full coverage when the queue allows it (then each overtaken dependency gains the head as a dependency and its old paths are cancelled); **fail** when every dependency settled and every valid path failed (its text leads with the runner's ``no_ci_started`` detail when that ended each failed path's last build); else fund paths within the budget (a live path that relies on a dependency's path that already failed can never land and is cancelled, never funded again, ``app/speculation/doom.py``). A build that ended ``errored`` gives its path a new attempt (up to ``core.MAX_BUILD_ATTEMPTS``, ``core.fold``), and so does one that ended ``failed`` while the path was retried fewer than the queue's ``speculation.retries`` times; with ``speculation.vindication_depth`` N, a failed path that a passed path of one of the head's first N dependents contains (it assumes the head lands and agrees with the failed path on every batch both name) is built once more, and a head whose paths all failed is not failed while such a containing path is still pending or building (``app/speculation/vindication.py``) |
| ``merging`` | nothing (its outcome arrives through ``mergesignal``); its live paths hold budget |
| any, the queue frozen with ``allow_builds`` false (``app/controllers/freeze.py``) | as above, but the planner gets no budget (it funds nothing new, cancels nothing to make room) and no build is dispatched, not even a retry of an errored one (pending entries wait, unlinked, and are dispatched by the first run after the freeze ends: the unfreeze wakes the queue, the ``freeze-thaw`` job wakes it when ``until`` or a window ends); running builds finish and are folded in |

Writes: the whole plan (changed path sets, ``merging``/``failed`` transitions, grown
dependency lists) and its dispatch (``speculated`` logs and ``merge`` per merge,
``conclude`` per failure, ``build`` per new path, the passed paths' ``waiting`` /
``invalidated`` news; stable ids) are one transaction (conditional writes, and the
messages through the outbox): a run that stops after its plan committed has dispatched
it too, so no recovery wake-up is needed. A run that writes nothing still dispatches
builds written but not dispatched (pending, not linked). News and builds this process
already published and committed are not published again (``_news``); another
process or a restart replays them with the same ids. Rows unchanged since the previous
snapshot of the queue are not read whole again (``app/db/memo.py``).

The transaction is fenced by the queue's plan version, read first in the snapshot and
advanced by every plan written: a run whose snapshot predates another run's plan (a
stale holder beside its successor after a lost lease) loses even when it would write
only rows the other did not touch, so two runs never spend one build budget twice. A
lost race raises ``VersionMismatch`` and the whole run is retried from a fresh snapshot.
A plan that breaks an invariant (a build for a head that is not speculating, a terminal
path rebuilt, a passed path cancelled without its head merging, the budget exceeded) is
rejected: nothing is written, and the ``PlanRejected`` / ``PlanInvariantError`` (not
retryable: the same snapshot plans the same way) names the offending heads and this
queue, so the ``speculate`` DLQ reconciler fails those batches only and the message's
own batch is left alone.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy.ext.asyncio import AsyncSession

from app.controllers.common import (
    Deps,
    Dispatch,
    Outbox,
    event_log,
    log_items,
    status_log,
    unique_id,
)
from app.controllers.freeze import freeze_of
from app.controllers.plan_check import check_plan
from app.controllers.scoring import QueueScoring
from app.db.memo import Kept, Memo
from app.db.repos import batches as batch_repo
from app.db.repos import counters as counter_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, Build, PathEntry, PathSet
from app.domain.errors import PlanError
from app.domain.messages import (
    BUILD,
    CONCLUDE,
    MERGE,
    BuildMsg,
    ConcludeMsg,
    EntityMsg,
    LogMsg,
    log_id,
)
from app.domain.removals import NO_CI_STARTED_PREFIX
from app.domain.states import BatchState, BuildStatus, PathStatus
from app.queue import Delivery
from app.speculation import core, vindication
from app.speculation.core import Resolution
from app.speculation.planner import CoveragePolicy, Plan, PlanInput, plan

log = logging.getLogger("submitqueue.controllers")

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)
# A terminal batch's members are concluded by the ``conclude`` its stage published with
# it; the pre-step repairs that conclusion only when it is older than this, so the
# wake-up that follows every merge does not send a second ``conclude`` beside the first.
CONCLUSION_GRACE_MS = 60_000
DEFAULT_MEAN_BUILD_MS = 600_000.0  # until this process has seen a build of the queue end
DURATION_WEIGHT = 0.2  # weight of the newest build in the running mean


@dataclass
class Snapshot:
    queue: str
    batches: dict[str, Batch]  # active ones and every dependency they name
    sets: dict[str, PathSet]  # as stored
    entries: dict[str, list[PathEntry]]  # as folded in this run
    links: dict[tuple[str, int], str]
    builds: dict[str, Build]
    plan_version: int = 0  # the queue's, read before anything else (the plan's fence)
    epoch: int = 0  # the queue's newest move outside the queue
    rebuilt: int = 0  # entries refuted in this fold because of such a move
    builds_frozen: bool = False  # the queue is frozen with allow_builds false
    _res: dict[str, Resolution] | None = None

    def active(self, *states: BatchState) -> list[Batch]:
        return sorted((b for b in self.batches.values() if b.state in states),
                      key=lambda b: (b.created_at_ms, b.id))

    def res(self) -> dict[str, Resolution]:
        """How every known batch resolved; kept up to date by ``put`` (``core.Facts``: a
        deep queue's path is checked against the settled outcomes, not along its length)."""
        if self._res is None:
            self._res = core.Facts({bid: core.resolution(b.state)
                                    for bid, b in self.batches.items()})
        return self._res

    def put(self, batch: Batch) -> None:
        self.batches[batch.id] = batch
        if self._res is not None:
            self._res[batch.id] = core.resolution(batch.state)

    def linked(self, e: PathEntry) -> bool:
        return (e.id, e.attempt) in self.links

    def changed(self, head: str) -> bool:
        return tuple(self.entries.get(head, [])) != self.sets[head].entries

    def dirty(self, heads: Iterable[str]) -> list[str]:
        """Heads whose entries differ from their stored path set."""
        return [h for h in heads if h in self.sets and self.changed(h)]


class SpeculateController:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.scoring = QueueScoring(deps)
        self._read_up_to: dict[str, int] = {}  # queue -> latest_seq before its last run
        self._mean_build_ms: dict[str, float] = {}
        self._memos: dict[str, tuple[Kept[Batch], Memo[Batch], Kept[PathSet]]] = {}
        self._sent: dict[str, dict[str, set[str]]] = {}  # queue -> head -> message ids

    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        await self._pre_step(msg)
        if delivery.message.seq <= self._read_up_to.get(msg.queue, 0):
            return  # a completed run read everything this message announces
        mark = await self.deps.broker.latest_seq()
        try:
            await self.deps.timed("speculation", msg.queue, self._run(msg.queue))
        except PlanError as exc:
            exc.queue = exc.queue or msg.queue
            raise
        self._read_up_to[msg.queue] = max(mark, self._read_up_to.get(msg.queue, 0))

    # -- pre-step --------------------------------------------------------------
    async def _pre_step(self, msg: EntityMsg) -> None:
        async with self.deps.db.read() as s:
            batch = await batch_repo.get(s, queue=msg.queue, id=msg.id)
            members = await request_repo.get_many(s, queue=msg.queue, ids=batch.contains)
        if batch.state.terminal:
            settled = self.deps.now() - batch.updated_at_ms >= CONCLUSION_GRACE_MS
            if settled and any(not m.state.terminal for m in members.values()):
                await self._conclude(batch, message_id=unique_id(f"{batch.id}/conclude/repair"))
        elif batch.state is BatchState.CREATED:
            await self._admit(batch)
        elif batch.state is BatchState.MERGING:
            await self._dispatch_merge(batch)

    async def _admit(self, batch: Batch) -> Batch:
        now = self.deps.now()
        new = replace(batch, state=BatchState.SPECULATING, version=batch.version + 1)
        async with self.deps.transaction() as (s, outbox):
            await batch_repo.update(s, old=batch, new=new, now_ms=now)
            await outbox.logs([
                status_log(batch.queue, m, "speculating", now=now, occurrence=batch.id,
                           metadata={"batch_id": batch.id,
                                     "dependencies": list(batch.dependencies)})
                for m in batch.contains])
        return new

    # -- the run ---------------------------------------------------------------
    async def _run(self, queue: str) -> None:
        snap = await self._snapshot(queue)
        freeze = await freeze_of(self.deps, queue)
        snap.builds_frozen = freeze is not None and not freeze.allow_builds
        for batch in snap.active(BatchState.CREATED):
            snap.put(await self._admit(batch))
        for batch in snap.active(BatchState.CANCELLING):
            await self._finish_cancelling(snap, batch)
        finished = self._finished(snap)
        await self.scoring.learn(queue, finished, snap.batches)
        result = await self._plan(snap)
        check_plan(snap.batches, snap.sets, snap.entries, result,
                   budget=0 if snap.builds_frozen else self.deps.extensions(queue).build_budget,
                   queue=queue)
        await self._write_plan(snap, result)

    def _finished(self, snap: Snapshot) -> list[PathEntry]:
        """Entries that reached a verdict in this fold; their builds update the mean."""
        out = []
        for head, entries in snap.entries.items():
            stored = {e.id: e for e in snap.sets[head].entries}
            for e in entries:
                before = stored.get(e.id)
                if e.status in (PathStatus.PASSED, PathStatus.FAILED) and before is not None \
                        and before.status.live:
                    out.append(e)
                    build = snap.builds.get(snap.links.get((e.id, before.attempt), ""))
                    if build is not None and build.updated_at_ms >= build.created_at_ms:
                        self._observe_duration(snap.queue,
                                               build.updated_at_ms - build.created_at_ms)
        return out

    def _observe_duration(self, queue: str, ms: int) -> None:
        mean = self._mean_build_ms.get(queue)
        self._mean_build_ms[queue] = float(ms) if mean is None else \
            mean + DURATION_WEIGHT * (ms - mean)

    async def _plan(self, snap: Snapshot) -> Plan:
        ext = self.deps.extensions(snap.queue)
        spec = ext.speculation
        unsettled = [b for b in snap.batches.values() if not b.state.terminal]
        probs = await self.scoring.probabilities(snap.queue, unsettled)
        coverage = CoveragePolicy(
            max_unsettled=spec.coverage_max_unsettled,
            min_remaining=spec.coverage_min_remaining,
            complements=spec.coverage_complements,
            complement_slots=spec.complement_slots) if spec.coverage else None
        given = PlanInput(
            batches=snap.batches, entries=snap.entries, probs=probs,
            budget=0 if snap.builds_frozen else ext.build_budget,
            allocator=spec.allocator, coverage=coverage, now_ms=self.deps.now(),
            mean_build_ms=self._mean_build_ms.get(snap.queue, DEFAULT_MEAN_BUILD_MS),
            min_probability=spec.min_probability, hedge_by_time=spec.hedge_by_time,
            vindication_depth=spec.vindication_depth)
        started = time.perf_counter()
        ok = False
        try:
            result = plan(given, linked=snap.linked)
            ok = True
            return result
        finally:
            self.deps.metrics.timed("planner", snap.queue, time.perf_counter() - started, ok)

    async def _snapshot(self, queue: str) -> Snapshot:
        """The queue as stored. The active batches and their path sets are read whole
        only where they changed since this process's previous snapshot of the queue
        (``Kept``: their ids and versions first, then the changed rows); the settled
        dependencies' rows that did not change are not decoded again (``Memo``)."""
        kept_batches, dep_memo, kept_sets = self._memos.setdefault(
            queue, (Kept(), Memo(), Kept()))
        dep_memo.fresh()
        async with self.deps.db.read() as s:
            plan_version = await counter_repo.plan_version(s, queue=queue)
            active = await batch_repo.list_kept(s, queue=queue, states=ACTIVE,
                                                kept=kept_batches)
            batches = {b.id: b for b in active}
            dep_ids = {d for b in active for d in (*b.dependencies, *b.overtakes)} - \
                set(batches)
            batches.update(await batch_repo.get_many(s, queue=queue, ids=dep_ids,
                                                     memo=dep_memo))
            sets = await spec_repo.path_sets_kept(s, queue=queue,
                                                  heads=[b.id for b in active],
                                                  kept=kept_sets)
            keys = [(e.id, e.attempt) for ps in sets.values() for e in ps.entries
                    if e.status.live]
            links = await spec_repo.links(s, queue=queue, keys=keys)
            builds = await spec_repo.builds_by_id(s, queue=queue, ids=links.values())
            epochs = await epoch_repo.refuting(s, queue=queue)
            passed = await self._passed_builds(s, queue, sets, epochs.outside or
                                               bool(epochs.own))
        now = self.deps.now()
        retries = self.deps.extensions(queue).speculation.retries
        entries = {
            h: [core.fold(e, builds.get(links.get((e.id, e.attempt), "")),
                          (e.id, e.attempt) in links, now, retries) for e in ps.entries]
            for h, ps in sets.items()
        }
        rebuilt = 0
        for h, es in entries.items():
            if batches[h].state is not BatchState.SPECULATING:
                continue
            for i, e in enumerate(es):
                key = (e.id, e.attempt)
                build = builds.get(links.get(key, "")) or passed.get(key)
                if core.outdated(e, build, epochs.of(h)):
                    es[i] = core.rebuild(e, now)
                    rebuilt += core.outdated(e, build, epochs.outside)  # an outside move's
        snap = Snapshot(queue, batches, sets, entries, links, builds, plan_version,
                        epochs.outside, rebuilt)
        depth = self.deps.extensions(queue).speculation.vindication_depth
        if depth:  # a failed path a dependent's passed build cleared: built once more
            snap.entries.update(vindication.vindicate(
                [b.id for b in snap.active(BatchState.SPECULATING)],
                {bid: b.dependencies for bid, b in batches.items()}, snap.entries,
                snap.res(), depth, now))
        return snap

    @staticmethod
    async def _passed_builds(s: AsyncSession, queue: str, sets: dict[str, PathSet],
                             epoch: int | bool) -> dict[tuple[str, int], Build]:
        """The builds of passed entries (read only once an epoch was started)."""
        keys = [(e.id, e.attempt) for ps in sets.values() for e in ps.entries
                if e.status is PathStatus.PASSED]
        if not epoch or not keys:
            return {}
        links = await spec_repo.links(s, queue=queue, keys=keys)
        builds = await spec_repo.builds_by_id(s, queue=queue, ids=links.values())
        return {k: builds[b] for k, b in links.items() if b in builds}

    async def _finish_cancelling(self, snap: Snapshot, batch: Batch) -> None:
        now = self.deps.now()
        snap.entries[batch.id] = [core.cancel(e, linked=snap.linked(e), now=now)
                                  for e in snap.entries.get(batch.id, [])]
        if core.live(snap.entries.get(batch.id, [])):
            await self._save_sets(snap, [batch.id])
            return
        new = replace(batch, state=BatchState.CANCELLED, failure_reason="cancelled by request",
                      version=batch.version + 1)
        async with self.deps.transaction() as (s, outbox):
            await self._write_set(s, snap, batch.id)
            await batch_repo.update(s, old=batch, new=new, now_ms=now)
            await outbox.publish_many([self._conclude_message(
                new, message_id=f"{batch.id}/conclude/speculate")])
        snap.put(new)

    # -- writing the plan --------------------------------------------------------
    async def _write_plan(self, snap: Snapshot, result: Plan) -> None:
        """Path sets, transitions, grown dependency lists and what they dispatch
        (``merge``/``conclude`` per decision, new builds, their logs) in one transaction:
        a run that stops after its plan committed has dispatched it too."""
        for head, entries in result.entries.items():
            snap.entries[head] = list(entries)
            snap.sets.setdefault(head, PathSet(queue=snap.queue, head=head))
        changed: dict[str, Batch] = {}
        for d in result.decisions:
            old = snap.batches[d.head]
            state = BatchState.MERGING if d.kind == "merge" else BatchState.FAILED
            reason = self._fail_reason(snap, d.head, d.reason) if d.kind == "fail" else ""
            changed[d.head] = replace(old, state=state, failure_reason=reason,
                                      version=old.version + 1)
        for bid, deps in result.dependencies.items():
            old = snap.batches[bid]
            base = changed.get(bid, replace(old, version=old.version + 1))
            changed[bid] = replace(base, dependencies=deps)
        now = self.deps.now()
        dirty = snap.dirty(snap.entries)
        if not dirty and not changed:
            await self._dispatch_unwritten(snap)
            return
        async with self.deps.transaction() as (s, outbox):
            await counter_repo.advance_plan(s, queue=snap.queue, seen=snap.plan_version)
            for h in dirty:
                await self._write_set(s, snap, h)
            for bid, new in changed.items():
                await batch_repo.update(s, old=snap.batches[bid], new=new, now_ms=now)
            await epoch_repo.add_rebuilt(s, queue=snap.queue, epoch=snap.epoch,
                                         count=snap.rebuilt)
            for new in changed.values():
                snap.put(new)
            news = await self._dispatch(s, outbox, snap, result)
        self._mark_sent(snap.queue, news)
        self.deps.metrics.rebuilt_after_move(snap.queue, snap.rebuilt)
        snap.plan_version += 1
        if result.rebuilds or any(d.bypass for d in result.decisions):
            log.info("merged on coverage", extra={
                "queue": snap.queue, "rebuilds": result.rebuilds,
                "heads": [d.head for d in result.decisions if d.bypass]})

    @staticmethod
    def _fail_reason(snap: Snapshot, head: str, reason: str) -> str:
        """The planner's reason plus the builds this run saw end it (status and log);
        ``errored`` means the path's last attempt was lost too, not that a test failed.
        When no CI started for any of them (each last build errored ``no_ci_started``),
        the runner's words come first: the removal is ``no_ci_started``, not a failure
        of the change."""
        seen, no_ci = [], []
        for e in snap.entries.get(head, []):
            build = snap.builds.get(snap.links.get((e.id, e.attempt), ""))
            if e.status is PathStatus.FAILED and build is not None:
                where = f", {build.log_url}" if build.log_url else ""
                lost = f" after {e.attempt} attempts" \
                    if build.status is BuildStatus.ERRORED else ""
                seen.append(f"{build.id} ({build.status.value}{lost}{where})")
                if build.status is BuildStatus.ERRORED and \
                        build.detail.startswith(NO_CI_STARTED_PREFIX):
                    no_ci.append(build.detail)
        text = f"{reason}; last builds: {', '.join(seen[:3])}" if seen else reason
        return f"{no_ci[-1]}; {text}" if no_ci and len(no_ci) == len(seen) else text

    async def _write_set(self, s: AsyncSession, snap: Snapshot, head: str) -> None:
        if not snap.changed(head):
            return
        old = snap.sets[head]
        new = replace(old, entries=tuple(snap.entries[head]), version=old.version + 1)
        await spec_repo.save_path_set(s, old=old, new=new)
        snap.sets[head] = new

    async def _save_sets(self, snap: Snapshot, heads: Sequence[str]) -> None:
        dirty = snap.dirty(heads)
        if dirty:
            async with self.deps.db.write() as s:
                for h in dirty:
                    await self._write_set(s, snap, h)

    # -- dispatch --------------------------------------------------------------
    async def _dispatch(self, s: AsyncSession, outbox: Outbox, snap: Snapshot,
                        result: Plan) -> list[Dispatch]:
        """What the plan decided, published in its transaction; returns the builds and
        news published (``_mark_sent`` once committed)."""
        for d in result.decisions:
            batch = snap.batches[d.head]
            if d.kind == "merge":
                extra: dict[str, object] = {"path_id": d.path_id}
                if d.bypass:
                    extra |= {"bypass": True, "overtaken": list(d.overtaken),
                              "rebuilds": result.rebuilds}
                round_ = await epoch_repo.rounds(s, queue=batch.queue, batch_id=batch.id)
                await outbox.publish_many(self._merge_messages(batch, round_, extra))
            else:
                await outbox.publish_many([self._conclude_message(
                    batch, message_id=f"{batch.id}/conclude/speculate")])
        news = self._news(snap)
        await outbox.publish_many(news)
        return news

    async def _dispatch_unwritten(self, snap: Snapshot) -> None:
        """A run that wrote nothing still dispatches builds a stopped run wrote but did
        not dispatch (pending, not linked; the same message ids) and the passed paths'
        news."""
        news = self._news(snap)
        await self.deps.publish_all(news)
        self._mark_sent(snap.queue, news)

    def _news(self, snap: Snapshot) -> list[Dispatch]:
        """The passed paths' news and the builds to dispatch, but those this process
        already published (and committed) in an earlier run: the same ids, which the
        queue would store nothing for. A passed path waiting on a deep queue is
        otherwise announced again by every run. What heads no longer active held is
        forgotten."""
        sent = self._sent.setdefault(snap.queue, {})
        for head in [h for h in sent if h not in snap.batches or
                     snap.batches[h].state.terminal]:
            del sent[head]
        return self._passed_logs(snap, sent) + [
            x for x in self._builds(snap) if x[2] not in sent.get(_head_of(x), ())]

    def _mark_sent(self, queue: str, items: list[Dispatch]) -> None:
        sent = self._sent.setdefault(queue, {})
        for x in items:
            sent.setdefault(_head_of(x), set()).add(x[2])

    def _builds(self, snap: Snapshot) -> list[Dispatch]:
        if snap.builds_frozen:
            return []  # frozen with allow_builds false: they wait, unlinked
        return [(BUILD, BuildMsg(id=head.id, queue=head.queue, path_id=e.id,
                                 attempt=e.attempt), f"{head.id}/build/{e.id}/{e.attempt}")
                for head in snap.active(BatchState.SPECULATING)
                for e in snap.entries.get(head.id, [])
                if e.status is PathStatus.PENDING and not snap.linked(e)]

    def _passed_logs(self, snap: Snapshot, sent: dict[str, set[str]]) -> list[Dispatch]:
        """``waiting`` for a passed path whose dependencies have not settled;
        ``invalidated`` for a passed path a settled dependency contradicted; none that
        ``sent`` (per head, message ids) holds, and those are not even built."""
        now = self.deps.now()
        res = snap.res()
        logs = []
        for head in snap.active(BatchState.SPECULATING):
            done = sent.get(head.id, set())
            for e in snap.entries.get(head.id, []):
                if e.status is not PathStatus.PASSED or core.settled(e.path, res):
                    continue
                event = "invalidated" if core.broken(e.path, res) or \
                    e.path.names != head.dependencies else "waiting"
                members = [m for m in head.contains if log_id(m, event, e.id) not in done]
                if not members:
                    continue
                md = {"batch_id": head.id, "path_id": e.id,
                      "assumptions": {d: a.value for d, a in e.path.dependencies}}
                logs += [event_log(head.queue, m, event, now=now, occurrence=e.id, metadata=md)
                         for m in members]
        return log_items(logs)

    def _merge_messages(self, batch: Batch, round_: int, extra: dict[str, object] | None
                        ) -> list[Dispatch]:
        """The ``speculated`` logs and the ``merge`` of ``batch``'s round ``round_``."""
        suffix = epoch_repo.round_suffix(round_)
        now = self.deps.now()
        md: dict[str, object] = {"batch_id": batch.id, **(extra or {})}
        return [*log_items([status_log(batch.queue, m, "speculated", now=now,
                                       occurrence=batch.id + suffix, metadata=md)
                            for m in batch.contains]),
                (MERGE, EntityMsg(id=batch.id, queue=batch.queue),
                 f"{batch.id}/merge-dispatch{suffix}")]

    async def _dispatch_merge(self, batch: Batch,
                              extra: dict[str, object] | None = None) -> None:
        """Dispatch the merge of ``batch``'s current round, if it is still ``merging``.

        The round is read before the batch is read again: a move of the target records
        its epoch and writes the batch back to ``speculating`` in one transaction, so a
        batch still ``merging`` after the round was read is in that round. Without the
        second read, a holder of an old ``merging`` row could take the next round's
        message id (``merge-dispatch/r<n>``) and that round's real merge would be dropped
        as its duplicate."""
        async with self.deps.db.read() as s:
            round_ = await epoch_repo.rounds(s, queue=batch.queue, batch_id=batch.id)
            current = await batch_repo.get(s, queue=batch.queue, id=batch.id)
        if current.state is not BatchState.MERGING:
            return  # it moved on; whoever wrote its newer state dispatches what follows
        await self.deps.publish_all(self._merge_messages(batch, round_, extra))

    async def _conclude(self, batch: Batch, *, message_id: str) -> None:
        topic, msg, mid = self._conclude_message(batch, message_id=message_id)
        await self.deps.publish(topic, msg, message_id=mid)

    @staticmethod
    def _conclude_message(batch: Batch, *, message_id: str) -> Dispatch:
        return (CONCLUDE, ConcludeMsg(id=batch.id, queue=batch.queue,
                                      failure_reason=batch.failure_reason), message_id)


def _head_of(item: Dispatch) -> str:
    """The batch a build or passed-path news is about."""
    msg = item[1]
    if isinstance(msg, BuildMsg):
        return msg.id
    return str(msg.metadata.get("batch_id", "")) if isinstance(msg, LogMsg) else ""
