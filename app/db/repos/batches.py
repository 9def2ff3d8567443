"""Batches, request-batch associations and batch claims (orchestrator-owned)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.dialect import insert_ignore
from app.db.locking import conditional_update
from app.db.memo import Kept, Memo
from app.db.repos._rows import batch_from_row, dumps
from app.db.tables import batch_claims as bc
from app.db.tables import batches as t
from app.db.tables import request_batches as rb
from app.domain.entities import Batch
from app.domain.errors import NotFound
from app.domain.ids import batch_number
from app.domain.states import BatchState

# The hot reads, built once (``app/db/bound.py``).
_GET = where_bound(sa.select(t), t, "queue", "id")
_GET_MANY = where_bound(sa.select(t), t, "queue", within="id")
_STATES_OF = where_bound(sa.select(t.c.id, t.c.state), t, "queue", within="id")
_BY_STATES = where_bound(sa.select(t), t, "queue", within="state")
_STAMPS_BY_STATES = where_bound(sa.select(t.c.id, t.c.version, t.c.updated_at_ms), t,
                                "queue", within="state")
_CLAIMED = where_bound(sa.select(bc.c.batch_id), bc, "queue", "request_id", "cause")


async def create(session: AsyncSession, *, batch: Batch, now_ms: int) -> None:
    """Insert a new batch (version 1) and associate each member request with it."""
    await session.execute(sa.insert(t).values(
        queue=batch.queue, id=batch.id, contains_json=dumps(list(batch.contains)),
        dependencies_json=dumps(list(batch.dependencies)), state=batch.state.value,
        version=batch.version, failure_reason=batch.failure_reason,
        landed_json=dumps({k: list(v) for k, v in batch.landed.items()}),
        priority=batch.priority.value, overtakes_json=dumps(list(batch.overtakes)),
        chance=batch.chance, created_at_ms=now_ms, updated_at_ms=now_ms,
    ))
    for request_id in batch.contains:
        await session.execute(insert_ignore(session, rb).values(
            queue=batch.queue, request_id=request_id, batch_id=batch.id))


async def get(session: AsyncSession, *, queue: str, id: str) -> Batch:
    row = (await session.execute(_GET, {"queue": queue, "id": id})).first()
    if row is None:
        raise NotFound(f"batch {id!r} does not exist in queue {queue!r}")
    return batch_from_row(row)


async def get_many(session: AsyncSession, *, queue: str, ids: Iterable[str],
                   memo: Memo[Batch] | None = None) -> dict[str, Batch]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await session.execute(_GET_MANY, {"queue": queue, "id": wanted})
    return {r.id: _decode(r, memo) for r in rows}


async def states_of(session: AsyncSession, *, queue: str,
                    ids: Iterable[str]) -> dict[str, BatchState]:
    """The states of the named batches (missing ones left out), without decoding the
    rest of their rows: a deep queue's dependency lists are as long as the queue."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await session.execute(_STATES_OF, {"queue": queue, "id": wanted})
    return {r.id: BatchState(r.state) for r in rows}


async def members_of(session: AsyncSession, *, queue: str,
                     ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The member requests of the named batches (missing ones left out), without
    decoding their dependency lists."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await session.execute(sa.select(t.c.id, t.c.contains_json).where(
        t.c.queue == queue, t.c.id.in_(wanted)))
    return {r.id: tuple(json.loads(r.contains_json)) for r in rows}


async def list_by_states(
    session: AsyncSession, *, queue: str, states: Sequence[BatchState],
    memo: Memo[Batch] | None = None,
) -> list[Batch]:
    """Batches in any of the states, oldest (lowest number) first. ``memo``: rows
    unchanged since the memo decoded them are not parsed again."""
    rows = await session.execute(
        _BY_STATES, {"queue": queue, "state": [s.value for s in states]})
    return sorted((_decode(r, memo) for r in rows), key=lambda b: batch_number(b.id))


async def list_kept(session: AsyncSession, *, queue: str, states: Sequence[BatchState],
                    kept: Kept[Batch]) -> list[Batch]:
    """``list_by_states`` that reads whole rows only where ``kept`` lacks the row's
    current version: the ids and stamps first, then the rows that changed (every write
    of a batch raises its version and sets ``updated_at_ms``). A row that left the
    states between the two reads is left out; one that changed within them is read as
    it is now."""
    wanted = [s.value for s in states]
    rows = await session.execute(_STAMPS_BY_STATES, {"queue": queue, "state": wanted})
    stamps = {bid: (version, at) for bid, version, at in rows}
    stale = kept.stale(stamps)
    found: Iterable[Any] = []
    if 2 * len(stale) > len(stamps):  # most changed (a first read): read them all at once
        found = await session.execute(_BY_STATES, {"queue": queue, "state": wanted})
    elif stale:
        found = await session.execute(_GET_MANY, {"queue": queue, "id": stale})
    fetched = {r.id: ((r.version, r.updated_at_ms), batch_from_row(r)) for r in found
               if r.state in wanted}
    return sorted(kept.keep(stamps, fetched).values(), key=lambda b: batch_number(b.id))


def _decode(row: sa.Row[Any], memo: Memo[Batch] | None) -> Batch:
    return batch_from_row(row) if memo is None else \
        memo.get((row.queue, row.id), row, batch_from_row)


async def for_request(session: AsyncSession, *, queue: str, request_id: str) -> list[Batch]:
    """Every batch the request was associated with, oldest first."""
    rows = await session.execute(
        sa.select(t).join(rb, sa.and_(rb.c.queue == t.c.queue, rb.c.batch_id == t.c.id))
        .where(rb.c.queue == queue, rb.c.request_id == request_id)
    )
    return sorted((batch_from_row(r) for r in rows), key=lambda b: batch_number(b.id))


async def update(session: AsyncSession, *, old: Batch, new: Batch, now_ms: int) -> None:
    await conditional_update(
        session, t, key={"queue": old.queue, "id": old.id}, old_version=old.version,
        new_version=new.version,
        values={
            "state": new.state.value,
            "dependencies_json": dumps(list(new.dependencies)),
            "contains_json": dumps(list(new.contains)),
            "failure_reason": new.failure_reason,
            "landed_json": dumps({k: list(v) for k, v in new.landed.items()}),
            "overtakes_json": dumps(list(new.overtakes)),
            "updated_at_ms": now_ms,
        },
    )


async def claimed(
    session: AsyncSession, *, queue: str, request_id: str, cause: str
) -> str | None:
    """The batch id claimed for ``(request, cause)``, if any."""
    return (await session.execute(_CLAIMED, {"queue": queue, "request_id": request_id,
                                             "cause": cause})).scalar_one_or_none()


async def claim(
    session: AsyncSession, *, queue: str, request_id: str, cause: str, batch_id: str,
    now_ms: int,
) -> str:
    """Claim ``batch_id`` for ``(request, cause)`` unless a claim exists; returns the
    winning batch id (``batch_id`` itself when this call claimed). On PostgreSQL a
    concurrent uncommitted claim makes the insert wait for it, then lose to it."""
    inserted = await session.execute(insert_ignore(session, bc).values(
        queue=queue, request_id=request_id, cause=cause, batch_id=batch_id,
        created_at_ms=now_ms))
    if inserted.rowcount:  # type: ignore[attr-defined]
        return batch_id
    winner = await claimed(session, queue=queue, request_id=request_id, cause=cause)
    if winner is None:  # cannot happen: the conflicting row is committed
        raise AssertionError(f"claim of {request_id} ({cause}) conflicted but is missing")
    return winner


async def join(session: AsyncSession, *, old: Batch, new: Batch, request_id: str,
               now_ms: int) -> None:
    """Add ``request_id`` to a ``creating`` batch: conditional on ``old``'s version
    (``VersionMismatch`` once dependency analysis moved it on), with its association."""
    await update(session, old=old, new=new, now_ms=now_ms)
    await session.execute(insert_ignore(session, rb).values(
        queue=old.queue, request_id=request_id, batch_id=old.id))


async def newest_creating(session: AsyncSession, *, queue: str) -> Batch | None:
    """The queue's newest ``creating`` batch (the one new requests may join)."""
    rows = await session.execute(sa.select(t).where(
        t.c.queue == queue, t.c.state == BatchState.CREATING.value))
    found = sorted((batch_from_row(r) for r in rows), key=lambda b: batch_number(b.id))
    return found[-1] if found else None


async def creating_after(session: AsyncSession, *, queue: str, than: str,
                         limit: int) -> list[Batch]:
    """Up to ``limit`` of the queue's ``creating`` batches numbered above ``than``,
    lowest first."""
    n = batch_number(than)
    rows = await session.execute(_BY_STATES, {"queue": queue,
                                              "state": [BatchState.CREATING.value]})
    newer = sorted((batch_from_row(r) for r in rows if batch_number(r.id) > n),
                   key=lambda b: batch_number(b.id))
    return newer[:limit]


async def newer_creating(session: AsyncSession, *, queue: str, than: str) -> bool:
    """Whether a ``creating`` batch newer than ``than`` exists in the queue."""
    rows = await session.execute(sa.select(t.c.id).where(
        t.c.queue == queue, t.c.state == BatchState.CREATING.value))
    n = batch_number(than)
    return any(batch_number(r.id) > n for r in rows)


async def causes_of(session: AsyncSession, *, queue: str, batch_id: str,
                    request_ids: Iterable[str]) -> list[str]:
    """The claim causes with which ``request_ids`` minted or joined ``batch_id``
    (read by the claims' key: the requests)."""
    wanted = sorted(set(request_ids))
    if not wanted:
        return []
    rows = await session.execute(sa.select(bc.c.cause).where(
        bc.c.queue == queue, bc.c.request_id.in_(wanted), bc.c.batch_id == batch_id))
    return sorted({r.cause for r in rows})


async def recent_outcomes(session: AsyncSession, *, queue: str, limit: int,
                          chance: int | None = None) -> list[bool]:
    """Whether each of the queue's ``limit`` most recently concluded batches landed
    (succeeded vs failed; cancelled ones are left out), oldest first; only those of
    that ``chance`` when one is given (1: the second chances)."""
    where = [t.c.queue == queue,
             t.c.state.in_([BatchState.SUCCEEDED.value, BatchState.FAILED.value])]
    if chance is not None:
        where.append(t.c.chance == chance)
    rows = (await session.execute(
        sa.select(t.c.state).where(*where)
        .order_by(t.c.updated_at_ms.desc(), t.c.id.desc()).limit(limit))).all()
    return [r.state == BatchState.SUCCEEDED.value for r in reversed(rows)]


async def leave(session: AsyncSession, *, queue: str, batch_id: str, request_id: str) -> None:
    """Drop the association of a request that left a ``creating`` batch."""
    await session.execute(sa.delete(rb).where(
        rb.c.queue == queue, rb.c.batch_id == batch_id, rb.c.request_id == request_id))
