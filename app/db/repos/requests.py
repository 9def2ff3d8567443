"""Land requests (orchestrator-owned): create once, read, conditional update."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.dialect import insert_ignore
from app.db.locking import conditional_update
from app.db.repos._rows import dumps, request_from_row
from app.db.tables import requests as t
from app.domain.entities import LandRequest
from app.domain.errors import NotFound

# The hot reads, built once (``app/db/bound.py``).
_GET = where_bound(sa.select(t), t, "queue", "id")
_GET_MANY = where_bound(sa.select(t), t, "queue", within="id")


async def create(session: AsyncSession, *, request: LandRequest, now_ms: int) -> bool:
    """Insert at version 1; an existing row is left alone (returns False)."""
    stmt = insert_ignore(session, t).values(
        queue=request.queue, id=request.id, change_uris_json=dumps(list(request.change_uris)),
        strategy=request.strategy.value, state=request.state.value, version=request.version,
        last_error=request.last_error, created_at_ms=now_ms, updated_at_ms=now_ms,
        priority=request.priority.value,
    )
    result = await session.execute(stmt)
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def get(session: AsyncSession, *, queue: str, id: str) -> LandRequest:
    row = (await session.execute(_GET, {"queue": queue, "id": id})).first()
    if row is None:
        raise NotFound(f"request {id!r} does not exist in queue {queue!r}")
    return request_from_row(row)


async def get_many(
    session: AsyncSession, *, queue: str, ids: Sequence[str]
) -> dict[str, LandRequest]:
    if not ids:
        return {}
    rows = await session.execute(_GET_MANY, {"queue": queue, "id": list(ids)})
    return {r.id: request_from_row(r) for r in rows}


async def update(
    session: AsyncSession, *, old: LandRequest, new: LandRequest, now_ms: int
) -> None:
    await conditional_update(
        session, t, key={"queue": old.queue, "id": old.id}, old_version=old.version,
        new_version=new.version,
        values={"state": new.state.value, "last_error": new.last_error, "updated_at_ms": now_ms},
    )

