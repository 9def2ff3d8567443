"""Circuits of external dependencies (``app/domain/outages.py``), shared by every
process through the database.

Stored in the ``counters`` table (no table of their own yet): one row per field, with
``queue`` = the dependency (``repository:<queue>``, ``builds:<queue>``, ...) and
``domain`` = ``circuit.<field>``. A circuit with no rows is closed. Writes go through
``save`` (one upsert per field, in the caller's transaction); the right to run an open
circuit's probe is won with ``take_probe``, a conditional write of the next probe time
(``WHERE value = <the probe time the caller read>``), so of many processes and
consumers that see the probe due, exactly one runs it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import dialect_name
from app.db.tables import counters as t
from app.domain.outages import Circuit

PREFIX = "circuit."
FIELDS = ("failures", "opened_at_ms", "probe_at_ms", "probes", "notified")


def _upsert(session: AsyncSession, values: list[dict[str, object]]) -> sa.Executable:
    if dialect_name(session) == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        pg = pg_insert(t).values(values)
        return pg.on_conflict_do_update(index_elements=[t.c.queue, t.c.domain],
                                        set_={"value": pg.excluded.value})
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    lite = sqlite_insert(t).values(values)
    return lite.on_conflict_do_update(index_elements=[t.c.queue, t.c.domain],
                                      set_={"value": lite.excluded.value})


async def load_all(session: AsyncSession) -> dict[str, Circuit]:
    """Every circuit with stored state, by dependency (closed ones included)."""
    rows = (await session.execute(sa.select(t.c.queue, t.c.domain, t.c.value).where(
        t.c.domain.startswith(PREFIX)))).all()
    fields: dict[str, dict[str, int]] = {}
    for dep, domain, value in rows:
        name = domain.removeprefix(PREFIX)
        if name in FIELDS:
            fields.setdefault(dep, {})[name] = int(value)
    return {dep: Circuit(dependency=dep, **vals) for dep, vals in fields.items()}


async def load(session: AsyncSession, *, dependency: str) -> Circuit:
    rows = (await session.execute(sa.select(t.c.domain, t.c.value).where(
        t.c.queue == dependency, t.c.domain.startswith(PREFIX)))).all()
    vals = {d.removeprefix(PREFIX): int(v) for d, v in rows if d.removeprefix(PREFIX) in FIELDS}
    return Circuit(dependency=dependency, **vals)


async def save(session: AsyncSession, *, circuit: Circuit) -> None:
    values: list[dict[str, object]] = [
        {"queue": circuit.dependency, "domain": PREFIX + f, "value": int(getattr(circuit, f))}
        for f in FIELDS]
    await session.execute(_upsert(session, values))


async def take_probe(session: AsyncSession, *, dependency: str, seen_ms: int,
                     next_ms: int) -> bool:
    """Move the probe time of ``dependency`` from ``seen_ms`` to ``next_ms``; False if
    another consumer moved it first (it runs the probe)."""
    result = await session.execute(sa.update(t).where(
        t.c.queue == dependency, t.c.domain == PREFIX + "probe_at_ms",
        t.c.value == seen_ms).values(value=next_ms))
    return bool(getattr(result, "rowcount", 0) == 1)
