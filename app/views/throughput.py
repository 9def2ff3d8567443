"""A queue's last 24 hours for the queue page's chart: per hour, how many requests
landed, failed and were cancelled, and how long those that landed waited (receipt to
``landed``: mean and longest).

Hours are aligned to the clock (UTC): the window ends with the hour under way, so the
chart has :data:`BUCKETS` bars, the last one still filling. A request counts in the
hour its terminal status was reached. Requests received more than
:data:`RECEIVED_BOUND_MS` before the window are left out, so the read stays on the
summaries' status index however long the history (a request that waited over a week
is rare enough not to matter to a throughput chart).

One grouped query per queue (at most ``BUCKETS x 3`` rows back), cached for
:data:`THROUGHPUT_TTL_S` seconds next to the timing (``data.TimingCache``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.repos import views as view_repo
from app.db.repos.views import FinishedCount
from app.views.schemas import ThroughputBucketOut, ThroughputOut

BUCKET_MS = 3_600_000
BUCKETS = 24
RECEIVED_BOUND_MS = 7 * 24 * BUCKET_MS
THROUGHPUT_TTL_S = 30.0


def window(now_ms: int) -> tuple[int, int]:
    """``(since_ms, until_ms)``: the 24 clock hours ending with the one under way."""
    until = (now_ms // BUCKET_MS + 1) * BUCKET_MS
    return until - BUCKETS * BUCKET_MS, until


def fold(counts: Sequence[FinishedCount], *, since_ms: int, until_ms: int) -> ThroughputOut:
    """The chart's data from the grouped counts (pure)."""
    per: list[dict[str, FinishedCount]] = [{} for _ in range(BUCKETS)]
    for c in counts:
        if 0 <= c.bucket < BUCKETS:
            per[c.bucket][c.status] = c
    buckets = []
    for i, by_status in enumerate(per):
        landed = by_status.get("landed")
        buckets.append(ThroughputBucketOut(
            start_ms=since_ms + i * BUCKET_MS,
            landed=landed.count if landed else 0,
            failed=by_status["error"].count if "error" in by_status else 0,
            cancelled=by_status["cancelled"].count if "cancelled" in by_status else 0,
            mean_wait_ms=round(landed.wait_sum_ms / landed.count) if landed else None,
            max_wait_ms=landed.wait_max_ms if landed else None))
    landed_all = [c for c in counts if c.status == "landed" and 0 <= c.bucket < BUCKETS]
    n_landed = sum(c.count for c in landed_all)
    return ThroughputOut(
        window_ms=BUCKETS * BUCKET_MS, bucket_ms=BUCKET_MS, until_ms=until_ms, buckets=buckets,
        landed=n_landed, failed=sum(b.failed for b in buckets),
        cancelled=sum(b.cancelled for b in buckets),
        mean_wait_ms=round(sum(c.wait_sum_ms for c in landed_all) / n_landed)
        if n_landed else None)


async def load(session: AsyncSession, *, queue: str, now_ms: int) -> ThroughputOut:
    since, until = window(now_ms)
    counts = await view_repo.finished_by_bucket(
        session, queue=queue, since_ms=since, until_ms=until, bucket_ms=BUCKET_MS,
        received_after_ms=since - RECEIVED_BOUND_MS)
    return fold(counts, since_ms=since, until_ms=until)
