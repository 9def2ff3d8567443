"""Change claims (orchestrator-owned): which request claimed which change URI."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import insert_ignore
from app.db.memo import Memo
from app.db.repos._rows import dumps
from app.db.tables import changes as t
from app.domain.entities import ChangeDetails


async def claim(
    session: AsyncSession, *, queue: str, request_id: str, details: Sequence[ChangeDetails],
    now_ms: int,
) -> None:
    """Record the request's claim on each change (immutable; a repeat is ignored)."""
    for d in details:
        await session.execute(insert_ignore(session, t).values(
            queue=queue, uri=d.uri, request_id=request_id, details_json=dumps(d.to_json()),
            created_at_ms=now_ms,
        ))


async def claimants(session: AsyncSession, *, queue: str, uris: Sequence[str]) -> list[str]:
    """Every request id that claimed any of the URIs (the caller filters liveness)."""
    if not uris:
        return []
    rows = await session.execute(
        sa.select(t.c.request_id).where(t.c.queue == queue, t.c.uri.in_(list(uris))).distinct()
    )
    return sorted(r.request_id for r in rows)


async def details_for(
    session: AsyncSession, *, queue: str, request_ids: Sequence[str],
    memo: Memo[ChangeDetails] | None = None,
) -> dict[str, list[ChangeDetails]]:
    """The changes' details by request. ``memo``: rows unchanged since the memo
    decoded them are not parsed again."""
    if not request_ids:
        return {}
    rows = await session.execute(
        sa.select(t).where(t.c.queue == queue, t.c.request_id.in_(list(request_ids)))
    )
    out: dict[str, list[ChangeDetails]] = defaultdict(list)
    for r in rows:
        out[r.request_id].append(_details(r) if memo is None else
                                 memo.get((r.queue, r.request_id, r.uri), r, _details))
    return dict(out)


def _details(r: Any) -> ChangeDetails:
    return ChangeDetails.from_json(r.uri, json.loads(r.details_json))
