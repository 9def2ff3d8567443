"""Manual freezes of merge queues (``queue_freezes``; the admin API writes it, the
merge and speculate stages and the read model read it).

``save`` is the one write: the first freeze of a queue inserts version 1 (an insert
that adds nothing when a concurrent first freeze won raises ``VersionMismatch``);
every later freeze or unfreeze is a conditional update ``WHERE version = old``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.dialect import insert_ignore
from app.db.locking import conditional_update
from app.db.tables import queue_freezes as t
from app.domain.errors import VersionMismatch
from app.domain.freeze import ManualFreeze


def _of(row: sa.Row[tuple[object, ...]]) -> ManualFreeze:
    m = row._mapping
    return ManualFreeze(
        queue=m["queue"], frozen=bool(m["frozen"]), reason=m["reason"], by=m["frozen_by"],
        since_ms=int(m["since_ms"]), until_ms=int(m["until_ms"]),
        allow_builds=bool(m["allow_builds"]), allow_hotfix=bool(m["allow_hotfix"]),
        version=int(m["version"]), updated_at_ms=int(m["updated_at_ms"]),
        updated_by=m["updated_by"])


_GET = where_bound(sa.select(t), t, "queue")  # built once (``app/db/bound.py``)


async def get(session: AsyncSession, *, queue: str) -> ManualFreeze | None:
    row = (await session.execute(_GET, {"queue": queue})).first()
    return None if row is None else _of(row)


async def get_many(session: AsyncSession, *, queues: Sequence[str]) -> dict[str, ManualFreeze]:
    if not queues:
        return {}
    rows = await session.execute(sa.select(t).where(t.c.queue.in_(list(queues))))
    return {r.queue: _of(r) for r in rows}


def _values(new: ManualFreeze) -> dict[str, object]:
    return {"frozen": int(new.frozen), "reason": new.reason, "frozen_by": new.by,
            "since_ms": new.since_ms, "until_ms": new.until_ms,
            "allow_builds": int(new.allow_builds), "allow_hotfix": int(new.allow_hotfix),
            "updated_at_ms": new.updated_at_ms, "updated_by": new.updated_by}


async def save(session: AsyncSession, *, old: ManualFreeze | None, new: ManualFreeze) -> None:
    """Write ``new`` (version ``old.version + 1``, or 1 for a queue never frozen)."""
    if old is None or old.version == 0:
        if new.version != 1:
            raise ValueError(f"a first freeze is version 1, not {new.version}")
        res = await session.execute(insert_ignore(session, t).values(
            queue=new.queue, version=1, **_values(new)))
        if not res.rowcount:  # type: ignore[attr-defined]
            raise VersionMismatch(f"queue_freezes ({new.queue!r}) was written by another "
                                  "caller first; read it again")
        return
    await conditional_update(session, t, key={"queue": old.queue}, old_version=old.version,
                             new_version=new.version, values=_values(new))
