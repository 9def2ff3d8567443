"""API tokens (``api_tokens``; access-owned): created and revoked by the admin API's
token routes, read by authentication, which also records when a token was last used
(at most once a minute per token: a conditional update, so concurrent calls write it
once)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import api_tokens as t
from app.domain.access import Scope, TokenRecord

LAST_USED_EVERY_MS = 60_000


def _record(r: Any) -> TokenRecord:
    queues = json.loads(r.queues_json or "null")
    return TokenRecord(
        id=r.id, label=r.label,
        scopes=frozenset(Scope(s) for s in json.loads(r.scopes_json) if s in set(Scope)),
        queues=None if queues is None else frozenset(queues), secret_hash=r.secret_hash,
        created_at_ms=int(r.created_at_ms), created_by=r.created_by or "",
        expires_at_ms=int(r.expires_at_ms), last_used_at_ms=int(r.last_used_at_ms),
        revoked_at_ms=int(r.revoked_at_ms),
    )


async def create(session: AsyncSession, record: TokenRecord) -> None:
    await session.execute(sa.insert(t).values(
        id=record.id, label=record.label,
        scopes_json=json.dumps(sorted(s.value for s in record.scopes)),
        queues_json=json.dumps(None if record.queues is None else sorted(record.queues)),
        secret_hash=record.secret_hash, created_at_ms=record.created_at_ms,
        created_by=record.created_by, expires_at_ms=record.expires_at_ms,
    ))


async def get(session: AsyncSession, token_id: str) -> TokenRecord | None:
    row = (await session.execute(sa.select(t).where(t.c.id == token_id))).first()
    return _record(row) if row is not None else None


async def list_all(session: AsyncSession, *, include_revoked: bool = False) -> list[TokenRecord]:
    """Newest first."""
    stmt = sa.select(t).order_by(t.c.created_at_ms.desc(), t.c.id)
    if not include_revoked:
        stmt = stmt.where(t.c.revoked_at_ms == 0)
    return [_record(r) for r in (await session.execute(stmt)).all()]


async def revoke(session: AsyncSession, token_id: str, *, now_ms: int) -> bool:
    """Revoke once; False if the token is unknown or was revoked already."""
    result = await session.execute(
        sa.update(t).where(t.c.id == token_id, t.c.revoked_at_ms == 0)
        .values(revoked_at_ms=max(now_ms, 1)))
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def touch(session: AsyncSession, token_id: str, *, now_ms: int) -> None:
    """Record a use, unless one was recorded less than a minute ago."""
    await session.execute(
        sa.update(t).where(t.c.id == token_id,
                           t.c.last_used_at_ms <= now_ms - LAST_USED_EVERY_MS)
        .values(last_used_at_ms=now_ms))
