"""Change claims and idempotency keys of land requests (gateway-owned):
``change_claims`` and ``idempotency_keys``.

A claim is the row ``(queue, change identity) -> owner sqid``; its primary key makes
"one live or landed request per change per queue" a unique constraint, taken with
``INSERT ... ON CONFLICT DO NOTHING`` (no read-then-write; on PostgreSQL a concurrent
insert of the same key waits for the other transaction and then sees its row).

| Claim event | Where | Effect |
|---|---|---|
| land accepted | ``claim_stack`` in the land transaction (with the summary) | one row per change of the stack, all or nothing: any change already held -> ``ClaimHeld`` and the caller rolls everything back |
| owner ends ``error`` / ``cancelled`` | ``settle`` in ``persist_log``'s fold transaction | the owner's rows are deleted (the change may be landed again) |
| owner ends ``landed`` | same | the owner's rows become ``landed`` with the commit each change landed as (kept for good) |
| ``start`` could not be published | ``release`` (with ``forget_key``) | the hidden receipt gives its claims and its key back |

``settle`` only ever touches the rows of the request it is told about, so redelivered
and reordered terminal statuses are harmless: a release is a delete by owner (a
second one deletes nothing, and never a newer owner's claim), a landing sets the
same values again and never clears a known commit.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import insert_ignore
from app.db.tables import change_claims as claim_t
from app.db.tables import idempotency_keys as key_t
from app.domain.entities import RequestSummary
from app.domain.errors import VersionMismatch
from app.domain.states import PublicStatus

LIVE = "live"
LANDED = "landed"
_RELEASING = frozenset({PublicStatus.ERROR.value, PublicStatus.CANCELLED.value})


@dataclass(frozen=True, slots=True)
class Claim:
    queue: str
    change_key: str
    request_id: str
    change_uri: str
    state: str
    landed_commit: str
    claimed_at_ms: int


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    queue: str
    key: str
    request_id: str
    body_sha256: str
    created_at_ms: int


class ClaimHeld(Exception):
    """A change of the stack is held by ``claim`` (another request's): a signal to roll
    the land's transaction back."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(claim.change_key)
        self.claim = claim


def _claim(r: Any) -> Claim:
    return Claim(queue=r.queue, change_key=r.change_key, request_id=r.request_id,
                 change_uri=r.change_uri, state=r.state, landed_commit=r.landed_commit or "",
                 claimed_at_ms=r.claimed_at_ms)


async def find_claim(session: AsyncSession, *, queue: str, change_key: str) -> Claim | None:
    row = (await session.execute(sa.select(claim_t).where(
        claim_t.c.queue == queue, claim_t.c.change_key == change_key))).first()
    return _claim(row) if row is not None else None


async def claims_of(session: AsyncSession, *, queue: str, request_id: str) -> list[Claim]:
    rows = await session.execute(sa.select(claim_t).where(
        claim_t.c.queue == queue, claim_t.c.request_id == request_id
    ).order_by(claim_t.c.change_key))
    return [_claim(r) for r in rows]


async def claim_stack(
    session: AsyncSession, *, queue: str, request_id: str,
    changes: Sequence[tuple[str, str]], now_ms: int,
) -> None:
    """Claim every ``(identity, uri)`` of a stack for ``request_id``. Raises ``ClaimHeld``
    naming the first change another request holds (the caller's transaction must then
    roll back, so a stack is claimed all or nothing), or ``VersionMismatch`` (retry)
    when the holder let go between our insert and our read."""
    for key, uri in changes:
        inserted = await session.execute(insert_ignore(session, claim_t).values(
            queue=queue, change_key=key, request_id=request_id, change_uri=uri,
            state=LIVE, landed_commit="", claimed_at_ms=now_ms))
        if inserted.rowcount:  # type: ignore[attr-defined]
            continue
        holder = await find_claim(session, queue=queue, change_key=key)
        if holder is None:
            raise VersionMismatch(f"the claim on {key} was released while {request_id} "
                                  "asked for it; try again")
        raise ClaimHeld(holder)


async def release(session: AsyncSession, *, queue: str, request_id: str) -> int:
    """Delete every claim ``request_id`` holds; returns how many there were."""
    result = await session.execute(sa.delete(claim_t).where(
        claim_t.c.queue == queue, claim_t.c.request_id == request_id))
    return int(result.rowcount)  # type: ignore[attr-defined]


async def settle(session: AsyncSession, *, summary: RequestSummary) -> None:
    """Apply a terminal summary to its request's claims (in the fold's transaction):
    ``error``/``cancelled`` release them; ``landed`` keeps them as landed, each with
    the commit its change landed as (``metadata["commits"]``, one per change URI in
    stack order; an unknown commit stays as it was)."""
    if summary.status in _RELEASING:
        await release(session, queue=summary.queue, request_id=summary.request_id)
        return
    if summary.status != PublicStatus.LANDED.value:
        return
    commits = summary.metadata.get("commits")
    by_uri: dict[str, str] = {}
    if isinstance(commits, list) and len(commits) == len(summary.change_uris):
        by_uri = {u: str(c) for u, c in zip(summary.change_uris, commits, strict=True) if c}
    for claim in await claims_of(session, queue=summary.queue, request_id=summary.request_id):
        commit = by_uri.get(claim.change_uri) or claim.landed_commit
        if claim.state == LANDED and commit == claim.landed_commit:
            continue
        await session.execute(sa.update(claim_t).where(
            claim_t.c.queue == claim.queue, claim_t.c.change_key == claim.change_key,
            claim_t.c.request_id == claim.request_id,
        ).values(state=LANDED, landed_commit=commit))


# --- idempotency keys ------------------------------------------------------------


def _key(r: Any) -> IdempotencyRecord:
    return IdempotencyRecord(queue=r.queue, key=r.key, request_id=r.request_id,
                             body_sha256=r.body_sha256, created_at_ms=r.created_at_ms)


async def find_key(session: AsyncSession, *, queue: str, key: str) -> IdempotencyRecord | None:
    row = (await session.execute(sa.select(key_t).where(
        key_t.c.queue == queue, key_t.c.key == key))).first()
    return _key(row) if row is not None else None


async def reserve_key(
    session: AsyncSession, *, queue: str, key: str, request_id: str, body_sha256: str,
    now_ms: int,
) -> IdempotencyRecord | None:
    """Bind ``key`` to ``request_id``; None when it was free, else the record it is
    already bound to (``VersionMismatch``, retry, if that vanished meanwhile)."""
    inserted = await session.execute(insert_ignore(session, key_t).values(
        queue=queue, key=key, request_id=request_id, body_sha256=body_sha256,
        created_at_ms=now_ms))
    if inserted.rowcount:  # type: ignore[attr-defined]
        return None
    existing = await find_key(session, queue=queue, key=key)
    if existing is None:
        raise VersionMismatch(f"idempotency key {key!r} was released meanwhile; try again")
    return existing


async def forget_key(session: AsyncSession, *, queue: str, key: str, request_id: str) -> None:
    """Unbind ``key`` if it is still bound to ``request_id``."""
    await session.execute(sa.delete(key_t).where(
        key_t.c.queue == queue, key_t.c.key == key, key_t.c.request_id == request_id))
