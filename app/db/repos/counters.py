"""Per-queue counters that mint ids (``domain`` = ``request`` for the gateway,
``batch`` for the orchestrator), and the plan version of each queue's speculation
(domain :data:`PLAN_DOMAIN`), which fences a speculate run's plan write.

One statement, ``INSERT ... ON CONFLICT (queue, domain) DO UPDATE SET value = value + 1
RETURNING value``, on both SQLite (3.35+) and PostgreSQL: atomic without a
read-modify-write, so two concurrent callers never get the same number. The
first number of a (queue, domain) is 1. The increment belongs to the caller's
transaction: if that rolls back, the number is handed out again.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import dialect_name, insert_ignore
from app.db.tables import counters as t
from app.domain.errors import VersionMismatch

PLAN_DOMAIN = "speculation_plan"


def _upsert_increment(session: AsyncSession, *, queue: str, domain: str) -> sa.Executable:
    values = {"queue": queue, "domain": domain, "value": 1}
    if dialect_name(session) == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        pg = pg_insert(t).values(**values)
        return pg.on_conflict_do_update(
            index_elements=[t.c.queue, t.c.domain], set_={"value": t.c.value + 1}
        ).returning(t.c.value)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    lite = sqlite_insert(t).values(**values)
    return lite.on_conflict_do_update(
        index_elements=[t.c.queue, t.c.domain], set_={"value": t.c.value + 1}
    ).returning(t.c.value)


async def next_number(session: AsyncSession, *, queue: str, domain: str) -> int:
    """Increment and return the counter of ``(queue, domain)``; the first value is 1."""
    result = await session.execute(_upsert_increment(session, queue=queue, domain=domain))
    return int(result.scalar_one())


async def plan_version(session: AsyncSession, *, queue: str) -> int:
    """How many speculation plans of ``queue`` were written (0: none yet)."""
    value = (await session.execute(sa.select(t.c.value).where(
        t.c.queue == queue, t.c.domain == PLAN_DOMAIN))).scalar_one_or_none()
    return int(value) if value is not None else 0


async def advance_plan(session: AsyncSession, *, queue: str, seen: int) -> None:
    """Move the plan version of ``queue`` from ``seen`` (read before the snapshot the
    plan came from) to ``seen + 1``, or raise ``VersionMismatch``: another run wrote a
    plan since, and this one must re-plan whatever rows it was going to write."""
    if seen == 0:
        result = await session.execute(insert_ignore(session, t).values(
            queue=queue, domain=PLAN_DOMAIN, value=1))
    else:
        result = await session.execute(sa.update(t).where(
            t.c.queue == queue, t.c.domain == PLAN_DOMAIN, t.c.value == seen,
        ).values(value=seen + 1))
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise VersionMismatch(f"the speculation plan of queue {queue!r} is no longer at "
                              f"version {seen}; another run wrote one first")
