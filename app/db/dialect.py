"""The SQL that differs between SQLite and PostgreSQL for application tables."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession


def dialect_name(session: AsyncSession) -> str:
    bind = session.bind
    return bind.dialect.name if bind is not None else "sqlite"


def insert_ignore(session: AsyncSession, table: sa.Table) -> sa.Insert:
    """``INSERT ... ON CONFLICT DO NOTHING``; ``rowcount`` tells whether a row was added."""
    if dialect_name(session) == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing()
