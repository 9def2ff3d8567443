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
    conditions = [table.c[name] == value for name, value in key.items()]
    stmt = (
        sa.update(table)
        .where(*conditions, table.c.version == old_version)
        .values(**values, version=new_version)
    )
    result = await session.execute(stmt)
    if result.rowcount != 1:  # type: ignore[attr-defined]
        described = ", ".join(f"{k}={v!r}" for k, v in key.items())
        raise VersionMismatch(
            f"{table.name} ({described}) is no longer at version {old_version}; "
            "another writer changed it first"
        )
