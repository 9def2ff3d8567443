"""GitHub webhook deliveries taken (``github_deliveries``; the gateway owns it).

A delivery is *claimed* before it is acted on (one insert that adds nothing when the
id is there already: the conditional write), *settled* with what it did, or
*released* when acting on it failed, so that GitHub's "Redeliver" can try again.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import insert_ignore
from app.db.tables import github_deliveries as t


async def claim(session: AsyncSession, *, delivery_id: str, event: str, now_ms: int) -> bool:
    """Record the delivery; False when it was recorded before (a redelivery)."""
    res = await session.execute(insert_ignore(session, t).values(
        delivery_id=delivery_id, event=event, received_at_ms=now_ms, outcome=""))
    return bool(res.rowcount)  # type: ignore[attr-defined]


async def settle(session: AsyncSession, *, delivery_id: str, outcome: str) -> bool:
    """Write what the delivery did, only while it is unsettled; False otherwise."""
    res = await session.execute(sa.update(t).where(
        t.c.delivery_id == delivery_id, t.c.outcome == "").values(outcome=outcome[:2000]))
    return bool(res.rowcount)  # type: ignore[attr-defined]


async def release(session: AsyncSession, *, delivery_id: str) -> bool:
    """Forget an unsettled delivery (acting on it failed); False if it was settled."""
    res = await session.execute(sa.delete(t).where(
        t.c.delivery_id == delivery_id, t.c.outcome == ""))
    return bool(res.rowcount)  # type: ignore[attr-defined]
