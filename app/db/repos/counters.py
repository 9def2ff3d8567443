"""Per-queue counters that mint ids (``domain`` = ``request`` for the gateway,
``batch`` for the orchestrator).

One statement, ``INSERT ... ON CONFLICT (queue, domain) DO UPDATE SET value = value + 1
RETURNING value``, on both SQLite (3.35+) and PostgreSQL: atomic without a
read-modify-write, so two concurrent callers never get the same number. The
first number of a (queue, domain) is 1. The increment belongs to the caller's
transaction: if that rolls back, the number is handed out again.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import dialect_name
from app.db.tables import counters as t


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
