"""Optimistic locking: every versioned row is written with ``WHERE version = :old``.

The caller (a controller) computes ``new = old + 1`` and updates its in-memory copy
only after ``conditional_update`` returned; a lost race raises ``VersionMismatch``,
which the queue retries (the controller then reloads and classifies again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.errors import VersionMismatch


async def conditional_update(
    session: AsyncSession,
    table: sa.Table,
    *,
    key: Mapping[str, Any],
    old_version: int,
    new_version: int,
    values: Mapping[str, Any],
) -> None:
    """Update one row identified by ``key`` only if it is still at ``old_version``."""
    if new_version <= old_version:
        raise ValueError(f"new version {new_version} must be greater than {old_version}")
    if "version" in values:
        raise ValueError("pass versions as old_version/new_version, not in values")
    stmt = _update_of(table, tuple(key), tuple(values))
    params = {**{f"k_{name}": value for name, value in key.items()}, "k_version": old_version,
              **{f"v_{name}": value for name, value in values.items()},
              "v_version": new_version}
    result = await session.execute(stmt, params)
    if result.rowcount != 1:  # type: ignore[attr-defined]
        described = ", ".join(f"{k}={v!r}" for k, v in key.items())
        raise VersionMismatch(
            f"{table.name} ({described}) is no longer at version {old_version}; "
            "another writer changed it first"
        )


# One statement per table and shape, built once: building an UPDATE costs more than
# running it. Values are bound (``k_*`` for the key and the old version, ``v_*`` for the
# new values: a bound name must differ from the columns it sets).
_UPDATES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], sa.Update] = {}


def _update_of(table: sa.Table, key: tuple[str, ...], columns: tuple[str, ...]) -> sa.Update:
    shape = (table.name, key, columns)
    stmt = _UPDATES.get(shape)
    if stmt is None:
        stmt = _UPDATES[shape] = (
            sa.update(table)
            .where(*(table.c[name] == sa.bindparam(f"k_{name}") for name in key),
                   table.c.version == sa.bindparam("k_version"))
            .values({**{name: sa.bindparam(f"v_{name}") for name in columns},
                     "version": sa.bindparam("v_version")})
        )
    return stmt
