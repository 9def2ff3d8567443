"""The admin audit log (append only): who did what to which messages, when and why."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import admin_audit as t


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at_ms: int
    actor: str
    action: str
    topic: str = ""
    message_ids: list[Any] = field(default_factory=list)
    reason: str = ""
    result: dict[str, Any] = field(default_factory=dict)


async def append(
    session: AsyncSession, *, at_ms: int, actor: str, action: str, topic: str = "",
    message_ids: Sequence[Any] = (), reason: str = "", result: dict[str, Any] | None = None,
) -> int:
    """Record one admin action; returns its id."""
    res = await session.execute(sa.insert(t).values(
        at_ms=at_ms, actor=actor, action=action, topic=topic,
        message_ids_json=json.dumps(list(message_ids), default=str), reason=reason,
        result_json=json.dumps(result or {}, default=str),
    ).returning(t.c.id))
    return int(res.scalar_one())


async def list_entries(
    session: AsyncSession, *, before_id: int | None = None, limit: int = 50
) -> list[AuditEntry]:
    """Newest first; ``before_id`` pages on."""
    stmt = sa.select(t).order_by(t.c.id.desc()).limit(max(1, min(limit, 1000)))
    if before_id is not None:
        stmt = stmt.where(t.c.id < before_id)
    rows = await session.execute(stmt)
    return [AuditEntry(id=int(r.id), at_ms=int(r.at_ms), actor=r.actor, action=r.action,
                       topic=r.topic, message_ids=json.loads(r.message_ids_json or "[]"),
                       reason=r.reason, result=json.loads(r.result_json or "{}"))
            for r in rows]
