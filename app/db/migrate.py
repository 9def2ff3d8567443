"""Run Alembic migrations from code (``submitqueue db upgrade`` and server start), and
compare the models with a migrated database the way ``alembic revision --autogenerate``
does (``schema_diff``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

from alembic import command
from app.db.engine import ensure_sqlite_dir

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_sync(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``. Alembic's environment starts its own event loop, so
    when called from inside a running loop the work moves to a helper thread."""
    ensure_sqlite_dir(url)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(alembic_config(url), revision)
        return
    errors: list[BaseException] = []

    def work() -> None:
        try:
            command.upgrade(alembic_config(url), revision)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work, name="sq-migrate")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


async def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``; runs in a thread because Alembic starts its own loop."""
    await asyncio.to_thread(upgrade_sync, url, revision)


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync_conn: MigrationContext.configure(sync_conn).get_current_revision()
        )


def compare_server_default(
    context: MigrationContext, inspected_column: sa.Column[Any], metadata_column: sa.Column[Any],
    inspected_default: str | None, metadata_default: Any, rendered_metadata_default: str | None,
) -> bool | None:
    """Alembic's ``compare_server_default`` hook: an empty-string default reads back
    from SQLite as ``('')`` or ``''``, which Alembic's SQLite comparison (its pattern
    needs one character between the quotes) reports as changed from ``''`` on every
    run. Call that equal; leave every other column to Alembic (``None``)."""
    if (context.dialect.name == "sqlite" and rendered_metadata_default == ""
            and inspected_default in ("''", "('')")):
        return False
    return None


COMPARE_OPTIONS: dict[str, Any] = {
    "compare_type": True,
    "compare_server_default": compare_server_default,
}


def schema_diff(conn: sa.Connection, metadata: Sequence[sa.MetaData]) -> list[Any]:
    """What autogenerate would change to make the database ``conn`` match ``metadata``
    (types, nullability, server defaults, indexes, constraints): ``[]`` when the
    migrations and the models agree."""
    combined = sa.MetaData()
    for md in metadata:
        for table in md.tables.values():
            table.to_metadata(combined)
    diff: list[Any] = compare_metadata(
        MigrationContext.configure(conn, opts=COMPARE_OPTIONS), combined
    )
    return diff
