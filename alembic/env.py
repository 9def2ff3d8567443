"""Alembic environment: async engines, both dialects, batch mode on SQLite."""

from __future__ import annotations

import asyncio

from sqlalchemy.engine import Connection

from alembic import context
from app.db.engine import create_engine
from app.db.migrate import COMPARE_OPTIONS
from app.db.tables import metadata as app_metadata
from app.queue.schema import metadata as queue_metadata

config = context.config
target_metadata = [app_metadata, queue_metadata]


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from app.settings import get_settings

    return get_settings().database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        **COMPARE_OPTIONS,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_engine(_url())
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_configure)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(_run_online())
