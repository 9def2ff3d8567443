"""Read-only counts behind the ``/metrics`` gauges (nothing here writes).

Requests by status come from ``request_log.counts_by_status`` (the gateway's
summaries); this module holds the orchestrator-side counts.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import builds as bt
from app.domain.states import BuildStatus

LIVE_BUILD_STATUSES = tuple(s.value for s in BuildStatus if not s.terminal)


async def live_builds(session: AsyncSession) -> dict[str, int]:
    """``{queue: n}`` of builds not yet terminal (queues without any are absent).

    The ``builds`` table has no index on ``status``, so this scans it; it runs at most
    once per ``SQ_METRICS_REFRESH_MS`` per process (only when ``/metrics`` is scraped).
    """
    rows = await session.execute(
        sa.select(bt.c.queue, sa.func.count())
        .where(bt.c.status.in_(LIVE_BUILD_STATUSES))
        .group_by(bt.c.queue)
    )
    return {queue: int(n) for queue, n in rows.all()}
