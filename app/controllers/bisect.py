"""Bisection of a failed batch of several requests (``app/domain/batching.py``) and the
second chance of a failed batch of one (``app/domain/second_chance.py``), run by
``conclude``, which owns a terminal batch's members.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| batch ``failed`` of several members, some ``batched``, no part claimed | before | in one transaction: split the ``batched`` members into parts (``max(2, build_budget // 2)`` ways; one part when only one is left: that failure was of a tree with the others in it, not its verdict), mint each part ``<queue>/batch/<n>`` ``creating`` in order with a claim per member (cause ``split:<failed batch's number>``), log ``batching`` per member (metadata ``split_from``, the failure, which part), publish ``dependency_analysis`` per part (the outbox) |
| batch ``cancelled`` of several members, some ``batched`` (not cancelled) | before | the same with one part of those members (a cancel is not their verdict) |
| batch ``failed`` of one ``batched`` member, ``chance`` 0, by its builds, the queue's second chances open (``speculation.second_chance``, its last ended second chances read in that transaction) | before | the same with one part of that member, ``chance`` 1 (its second chance; the log says so) |
| the parts claimed already (found in that transaction) | at | create nothing; replay the logs and hand-offs of the claimed parts (same ids) |
| a member ``cancelling`` | - | not split: ``conclude`` ends it ``cancelled`` |

A part is analysed like a new batch, in the order the parts were minted, so it depends
on the earlier parts it conflicts with and is built on top of them. Its members stay
``batched`` throughout (dependency analysis accepts ``batched`` members of a part and
bumps their versions, which fences a concurrent cancel). A part of one member that
fails ends that member ``error`` with the failure and the bisection that isolated it
(``culprit_reason``), unless it gets its second chance; a second chance that fails ends
it ``error`` naming both failures.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.controllers.common import Deps, Dispatch, log_items, status_log
from app.db.repos import batches as batch_repo
from app.db.repos.counters import next_number
from app.domain import batching, second_chance
from app.domain.entities import Batch, LandRequest
from app.domain.errors import VersionMismatch
from app.domain.ids import batch_id
from app.domain.messages import DEPENDENCY_ANALYSIS, EntityMsg
from app.domain.removals import RemovalReason, classify
from app.domain.states import BatchState, RequestState


def splittable(batch: Batch, members: dict[str, LandRequest]) -> list[str]:
    """The members of ``batch`` that go on in parts (empty: conclude ends them all)."""
    if len(batch.contains) < 2 or batch.state not in (BatchState.FAILED,
                                                      BatchState.CANCELLED):
        return []
    return [m for m in batch.contains
            if m in members and members[m].state is RequestState.BATCHED]


async def split(deps: Deps, batch: Batch, members: dict[str, LandRequest]) -> set[str]:
    """The members of ``batch`` that went on in parts: minted now (``splittable``), or
    found claimed by an earlier run (a replay, whatever they became since); each
    part's logs and hand-off are (re)published."""
    cause = batching.split_cause(batch.id)
    async with deps.transaction() as (s, outbox):
        parts = await _claimed_parts(s, batch, cause)
        if not parts:
            live = splittable(batch, members)
            chance = 0
            if not live and await _second_chance(deps, s, batch, members):
                live, chance = list(batch.contains), 1
            if not live:
                return set()
            if batch.state is BatchState.FAILED and chance == 0:
                ways = max(2, deps.extensions(batch.queue).build_budget // 2)
                groups = batching.split(live, ways=ways)
            else:
                groups = [tuple(live)]
            parts = [await _mint(deps, s, batch, g, cause, chance) for g in groups]
        for i, part in enumerate(parts, start=1):
            await outbox.publish_many(_announce(batch, part, i, len(parts)))
    return {m for p in parts for m in p.contains}


async def _second_chance(deps: Deps, s: AsyncSession, batch: Batch,
                         members: dict[str, LandRequest]) -> bool:
    """``batch``, failed, gives its one ``batched`` member a second chance (read in the
    transaction that would mint it)."""
    if batch.state is not BatchState.FAILED or len(batch.contains) != 1 or \
            not deps.extensions(batch.queue).speculation.second_chance:
        return False
    member = members.get(batch.contains[0])
    if member is None or member.state is not RequestState.BATCHED or batch.chance != 0:
        return False
    build_failed = classify("error", batch.failure_reason) is RemovalReason.BUILD_FAILED
    if not build_failed:
        return False
    outcomes = await batch_repo.recent_outcomes(s, queue=batch.queue, chance=1,
                                                limit=second_chance.WINDOW)
    return second_chance.deserved(members=1, chance=batch.chance, build_failed=True,
                                  outcomes=outcomes, batch_id=batch.id)


async def parted(deps: Deps, batch: Batch) -> set[str]:
    """The members of ``batch`` that went on in parts of it (a repair that ends the
    members of a failed batch leaves these alone: their parts decide them)."""
    async with deps.db.read() as s:
        parts = await _claimed_parts(s, batch, batching.split_cause(batch.id))
    return {m for p in parts for m in p.contains}


async def _claimed_parts(s: AsyncSession, batch: Batch, cause: str) -> list[Batch]:
    ids: list[str] = []
    for m in batch.contains:
        bid = await batch_repo.claimed(s, queue=batch.queue, request_id=m, cause=cause)
        if bid is not None and bid not in ids:
            ids.append(bid)
    found = await batch_repo.get_many(s, queue=batch.queue, ids=ids)
    return [found[b] for b in ids if b in found]


async def _mint(deps: Deps, s: AsyncSession, batch: Batch, group: tuple[str, ...],
                cause: str, chance: int) -> Batch:
    now = deps.now()
    part = Batch(
        queue=batch.queue, id=batch_id(batch.queue, await next_number(
            s, queue=batch.queue, domain="batch")),
        contains=group, dependencies=(), state=BatchState.CREATING, version=1,
        created_at_ms=now, updated_at_ms=now, priority=batch.priority, chance=chance)
    for m in group:
        won = await batch_repo.claim(s, queue=batch.queue, request_id=m, cause=cause,
                                     batch_id=part.id, now_ms=now)
        if won != part.id:  # a concurrent run claimed first: its transaction won
            raise VersionMismatch(f"a part of {batch.id} was claimed concurrently")
    await batch_repo.create(s, batch=part, now_ms=now)
    return part


def _announce(failed: Batch, part: Batch, i: int, n: int) -> list[Dispatch]:
    why = ("it was cancelled for another member" if failed.state is BatchState.CANCELLED
           else f"it failed: {failed.failure_reason}" if failed.failure_reason else "it failed")
    md: dict[str, object] = {
        "batch_id": part.id, "split_from": failed.id, "part": i, "parts": n,
        "reason": f"batch {failed.id} of {len(failed.contains)} requests did not land "
                  f"({why}); its requests are tried again in {n} "
                  f"part{'s' if n != 1 else ''}, this is part {i}"}
    if part.chance:
        md["second_chance"] = True
        md["reason"] = (f"batch {failed.id} did not land ({why}); a build may fail "
                        "spuriously (a flake), so this request gets a second chance at "
                        f"the back of the queue in batch {part.id}: it is removed only if "
                        "that fails too")
    return [*log_items([status_log(part.queue, m, "batching", now=part.created_at_ms,
                                   metadata=md, occurrence=part.id)
                        for m in part.contains]),
            (DEPENDENCY_ANALYSIS, EntityMsg(id=part.id, queue=part.queue), part.id)]


async def culprit_reason(deps: Deps, batch: Batch, reason: str) -> str:
    """``reason`` for the one member of a failed part, naming the bisection."""
    if len(batch.contains) != 1:
        return reason
    async with deps.db.read() as s:
        parents = await _parents(s, batch)
        if batch.chance:
            first = f"in batch {parents[0]}" if parents else "before"
            return (f"{reason} (its second chance: it failed {first} too, so the failure "
                    "is not taken for a flake)")
        if not parents:
            return reason
        parent = await batch_repo.get(s, queue=batch.queue, id=parents[0])
    return (f"{reason} (isolated by bisecting batch {parent.id} of "
            f"{len(parent.contains)} requests: this change failed on its own)")


async def _parents(s: AsyncSession, batch: Batch) -> list[str]:
    """The failed batches ``batch``'s members were split from (by their claims)."""
    causes = await batch_repo.causes_of(s, queue=batch.queue, batch_id=batch.id,
                                        request_ids=batch.contains)
    return [p for c in causes if (p := batching.parent_of(batch.queue, c))]
