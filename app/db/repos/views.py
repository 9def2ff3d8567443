"""Read-only queries behind the status pages (``app/api/views.py``, ``app/api/events.py``).

Nothing here writes. Every query is bounded by a ``limit`` or by a primary-key
lookup, so a page view costs the same on a queue with a year of history as on a new
one. The gateway's own tables are read through the projections; the orchestrator's
(batches, path sets, builds) are read through their repositories elsewhere
(``batches.py``, ``speculation.py``) — the pages are a read model over both.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.repos.request_log import _log_from_row, _summary_from_row
from app.db.tables import builds as build_t
from app.db.tables import change_uri_requests as uri_t
from app.db.tables import request_log as log_t
from app.db.tables import request_summaries as sum_t
from app.domain.entities import RequestLog, RequestSummary
from app.domain.states import PublicStatus

ACCEPTING = PublicStatus.ACCEPTING.value
TERMINAL = tuple(s.value for s in PublicStatus if s.terminal)
IN_FLIGHT = tuple(s.value for s in PublicStatus
                  if not s.terminal and s is not PublicStatus.ACCEPTING)


async def in_flight(session: AsyncSession, *, queue: str, limit: int) -> list[RequestSummary]:
    """Visible requests that are not terminal yet, oldest received first."""
    stmt = (
        sa.select(sum_t)
        .where(sum_t.c.queue == queue, sum_t.c.status.in_(IN_FLIGHT))
        .order_by(sum_t.c.received_at_ms, sum_t.c.request_id)
        .limit(limit)
    )
    return [_summary_from_row(r) for r in (await session.execute(stmt)).all()]


async def recent_terminal(
    session: AsyncSession, *, queue: str, limit: int
) -> list[RequestSummary]:
    """Landed, failed and cancelled requests, newest received first."""
    stmt = (
        sa.select(sum_t)
        .where(sum_t.c.queue == queue, sum_t.c.status.in_(TERMINAL))
        .order_by(sum_t.c.received_at_ms.desc(), sum_t.c.request_id.desc())
        .limit(limit)
    )
    return [_summary_from_row(r) for r in (await session.execute(stmt)).all()]


async def summaries(
    session: AsyncSession, *, queue: str, request_ids: Collection[str]
) -> dict[str, RequestSummary]:
    """Visible summaries by id (missing and ``accepting`` ones are absent)."""
    wanted = sorted(set(request_ids))
    if not wanted:
        return {}
    rows = await session.execute(sa.select(sum_t).where(
        sum_t.c.queue == queue, sum_t.c.request_id.in_(wanted), sum_t.c.status != ACCEPTING))
    return {r.request_id: _summary_from_row(r) for r in rows}


async def requests_of_change_uri(
    session: AsyncSession, *, queues: Collection[str], change_uri: str, limit: int
) -> list[tuple[str, str]]:
    """``(queue, request_id)`` of requests that carried ``change_uri`` in any of
    ``queues`` (a unique-key lookup per queue), newest first."""
    stmt = (
        sa.select(uri_t.c.queue, uri_t.c.request_id)
        .where(uri_t.c.queue.in_(sorted(queues)), uri_t.c.change_uri == change_uri)
        .order_by(uri_t.c.received_at_ms.desc(), uri_t.c.request_id.desc())
        .limit(limit)
    )
    return [(r.queue, r.request_id) for r in (await session.execute(stmt)).all()]


# --- the log, newest rows first ---------------------------------------------------


async def recent_log(session: AsyncSession, *, queue: str, limit: int) -> list[RequestLog]:
    """The queue's last ``limit`` log rows by arrival (newest first)."""
    stmt = sa.select(log_t).where(log_t.c.queue == queue).order_by(log_t.c.id.desc()).limit(limit)
    return [_log_from_row(r) for r in (await session.execute(stmt)).all()]


async def history_of(
    session: AsyncSession, *, queue: str, request_ids: Sequence[str], limit: int
) -> list[RequestLog]:
    """Entries of several requests, oldest first, at most ``limit``."""
    if not request_ids:
        return []
    stmt = (
        sa.select(log_t)
        .where(log_t.c.queue == queue, log_t.c.request_id.in_(list(request_ids)))
        .order_by(log_t.c.timestamp_ms, log_t.c.id)
        .limit(limit)
    )
    return [_log_from_row(r) for r in (await session.execute(stmt)).all()]


async def has_log(session: AsyncSession, *, queue: str, request_id: str, log_id: str) -> bool:
    """Whether the request's history holds the entry ``log_id`` (a unique-key lookup)."""
    stmt = sa.select(log_t.c.id).where(log_t.c.queue == queue,
                                       log_t.c.request_id == request_id,
                                       log_t.c.log_id == log_id).limit(1)
    return (await session.execute(stmt)).first() is not None


async def last_moved_ms(session: AsyncSession, *, queue: str, request_id: str) -> int | None:
    """When the request's history last grew (its newest status or event), or ``None``."""
    stmt = sa.select(sa.func.max(log_t.c.timestamp_ms)).where(
        log_t.c.queue == queue, log_t.c.request_id == request_id)
    value = (await session.execute(stmt)).scalar()
    return int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class LogMark:
    """Where a log row sits: its arrival id, queue and request."""

    id: int
    queue: str
    request_id: str


async def last_log_id(session: AsyncSession) -> int:
    return int((await session.execute(sa.select(sa.func.max(log_t.c.id)))).scalar() or 0)


async def log_marks(session: AsyncSession, *, after_id: int, limit: int) -> list[LogMark]:
    """Rows of every queue that arrived after ``after_id``, by arrival id."""
    stmt = (
        sa.select(log_t.c.id, log_t.c.queue, log_t.c.request_id)
        .where(log_t.c.id > after_id)
        .order_by(log_t.c.id)
        .limit(limit)
    )
    return [LogMark(int(r.id), r.queue, r.request_id)
            for r in (await session.execute(stmt)).all()]


# --- builds -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuildTiming:
    id: str
    status: str
    created_at_ms: int
    updated_at_ms: int


async def build_timings(
    session: AsyncSession, *, queue: str, build_ids: Collection[str]
) -> list[BuildTiming]:
    wanted = sorted(set(build_ids))
    if not wanted:
        return []
    rows = await session.execute(
        sa.select(build_t.c.id, build_t.c.status, build_t.c.created_at_ms,
                  build_t.c.updated_at_ms)
        .where(build_t.c.queue == queue, build_t.c.id.in_(wanted)))
    return [BuildTiming(r.id, r.status, int(r.created_at_ms), int(r.updated_at_ms))
            for r in rows]


@dataclass(frozen=True, slots=True)
class FinishedCount:
    """Terminal requests of one status whose status was reached in one bucket."""

    bucket: int
    status: str
    count: int
    wait_sum_ms: int
    wait_max_ms: int


async def finished_by_bucket(
    session: AsyncSession, *, queue: str, since_ms: int, until_ms: int, bucket_ms: int,
    received_after_ms: int,
) -> list[FinishedCount]:
    """Terminal requests whose status was reached in ``[since_ms, until_ms)``, counted per
    ``bucket_ms`` bucket (0 = the one starting at ``since_ms``) and status, with the sum
    and maximum of their receipt-to-status times. Only requests received after
    ``received_after_ms`` count (it bounds the scan to the status index)."""
    bucket = ((sum_t.c.status_timestamp_ms - since_ms) // bucket_ms).label("bucket")
    wait = sum_t.c.status_timestamp_ms - sum_t.c.received_at_ms
    rows = await session.execute(
        sa.select(bucket, sum_t.c.status, sa.func.count().label("n"),
                  sa.func.sum(wait).label("wait_sum"), sa.func.max(wait).label("wait_max"))
        .where(sum_t.c.queue == queue, sum_t.c.status.in_(TERMINAL),
               sum_t.c.received_at_ms >= received_after_ms,
               sum_t.c.status_timestamp_ms >= since_ms, sum_t.c.status_timestamp_ms < until_ms)
        .group_by(bucket, sum_t.c.status))
    return [FinishedCount(int(r.bucket), str(r.status), int(r.n), int(r.wait_sum or 0),
                          int(r.wait_max or 0)) for r in rows]
