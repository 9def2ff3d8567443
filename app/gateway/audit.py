"""The admin audit trail: every admin action the gateway performed, newest first."""

from __future__ import annotations

from typing import Any

from app.db.engine import Database
from app.db.repos import audit as audit_repo
from app.db.repos.audit import AuditEntry


async def record(db: Database, *, at_ms: int, actor: str, action: str, topic: str,
                 message_ids: list[int] | None = None, reason: str = "",
                 result: dict[str, Any] | None = None) -> int:
    """Record one admin action; returns its id."""
    async with db.write() as s:
        return await audit_repo.append(s, at_ms=at_ms, actor=actor, action=action,
                                       topic=topic, message_ids=message_ids or [],
                                       reason=reason, result=result)


async def entries(db: Database, *, before_id: int | None, limit: int) -> list[AuditEntry]:
    async with db.read() as s:
        return await audit_repo.list_entries(s, before_id=before_id, limit=limit)
