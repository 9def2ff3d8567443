"""The trunk epochs of a queue (table ``trunk_epochs``, orchestrator-owned).

A new epoch is a new fact: the merger found the target at a tip that none of a batch's
passed builds started from. Either the target moved outside the queue (``outside``:
every path built before it is refuted and rebuilt), or the tip is one the queue landed
itself for another batch that the builds of this one did not include (only that
batch's paths are rebuilt). Builds carry the epoch they were triggered in. Epoch 0 is
the queue's start (no row).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.tables import batches as bt
from app.db.tables import trunk_epochs as t


@dataclass(frozen=True, slots=True)
class Epoch:
    queue: str
    epoch: int
    tip_sha: str
    batch_id: str = ""
    rebuilt: int = 0
    detected_at_ms: int = 0
    outside: bool = True


@dataclass(frozen=True, slots=True)
class Epochs:
    """What refutes a build: the newest outside move, and per batch its own newest."""

    outside: int = 0
    own: dict[str, int] | None = None

    def of(self, batch_id: str) -> int:
        return max(self.outside, (self.own or {}).get(batch_id, 0))


async def latest(session: AsyncSession, *, queue: str) -> Epoch | None:
    """The newest move outside the queue (None: none was found)."""
    row = (await session.execute(sa.select(t).where(t.c.queue == queue, t.c.outside.is_(True))
                                 .order_by(t.c.epoch.desc()).limit(1))).first()
    if row is None:
        return None
    return Epoch(queue=row.queue, epoch=int(row.epoch), tip_sha=row.tip_sha,
                 batch_id=row.batch_id, rebuilt=int(row.rebuilt),
                 detected_at_ms=int(row.detected_at_ms), outside=True)


async def current(session: AsyncSession, *, queue: str) -> int:
    """The queue's epoch now (0 before any was started): what a new build is stamped."""
    value = (await session.execute(sa.select(sa.func.max(t.c.epoch))
                                   .where(t.c.queue == queue))).scalar_one_or_none()
    return int(value) if value is not None else 0


async def refuting(session: AsyncSession, *, queue: str) -> Epochs:
    rows = (await session.execute(sa.select(t.c.epoch, t.c.batch_id, t.c.outside)
                                  .where(t.c.queue == queue))).all()
    outside = max((int(r.epoch) for r in rows if r.outside), default=0)
    own: dict[str, int] = {}
    for r in rows:
        if not r.outside:
            own[r.batch_id] = max(own.get(r.batch_id, 0), int(r.epoch))
    return Epochs(outside=outside, own=own)


async def landed_by_queue(session: AsyncSession, *, queue: str, sha: str) -> bool:
    """Whether ``sha`` is a commit some batch of the queue landed."""
    found = (await session.execute(sa.select(bt.c.id).where(
        bt.c.queue == queue, bt.c.state == "succeeded",
        bt.c.landed_json.contains(sha)).limit(1))).first()
    return found is not None


async def record(session: AsyncSession, *, queue: str, tip_sha: str, batch_id: str,
                 now_ms: int, outside: bool = True) -> int:
    """Start a new epoch at ``tip_sha``; returns its number. (Inside the caller's
    conditional write of the batch: a concurrent duplicate rolls back with it.)"""
    epoch = await current(session, queue=queue) + 1
    await session.execute(sa.insert(t).values(
        queue=queue, epoch=epoch, tip_sha=tip_sha, batch_id=batch_id, rebuilt=0,
        outside=outside, detected_at_ms=now_ms))
    return epoch


async def add_rebuilt(session: AsyncSession, *, queue: str, epoch: int, count: int) -> None:
    if count:
        await session.execute(sa.update(t).where(t.c.queue == queue, t.c.epoch == epoch)
                              .values(rebuilt=t.c.rebuilt + count))


_ROUNDS = where_bound(sa.select(sa.func.count()).select_from(t), t, "queue", "batch_id")


async def rounds(session: AsyncSession, *, queue: str, batch_id: str) -> int:
    """How many new tips the merges of ``batch_id`` found: each sent the batch back to
    speculation, so its next merge is a new round (with message ids of its own)."""
    value = (await session.execute(_ROUNDS, {"queue": queue, "batch_id": batch_id})).scalar_one()
    return int(value)


def round_suffix(round_: int) -> str:
    """The suffix of a merge round's message ids ("" for the first: ids as before)."""
    return f"/r{round_}" if round_ else ""
