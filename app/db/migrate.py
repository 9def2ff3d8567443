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
from app.db.engine import create_engine, ensure_sqlite_dir, is_sqlite
from app.resources import resource


def alembic_config(url: str) -> Config:
    """The migrations (``app.resources``: the wheel's bundled copy or the checkout's
    ``alembic/``) against ``url``. No ``alembic.ini`` is read: the checkout's serves the
    ``alembic`` command of a developer (``revision --autogenerate``), and its
    ``prepend_sys_path = .`` would put the server's working directory on ``sys.path``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(resource("alembic")))
    cfg.set_main_option("path_separator", "os")
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


def current_revision_sync(url: str) -> str | None:
    """The revision the database at ``url`` is at, outside an event loop (``serve``
    checks it before it starts); ``None`` when never migrated. A SQLite file that does
    not exist is ``None`` and is not created."""
    if is_sqlite(url):
        path = sa.engine.make_url(url).database or ""
        if path and path != ":memory:" and not Path(path).exists():
            return None

    async def read() -> str | None:
        engine = create_engine(url)
        try:
            return await current_revision(engine)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def behind(url: str) -> tuple[str | None, str | None] | None:
    """``(current, head)`` when the database at ``url`` is behind this version's head
    (or never migrated); ``None`` at head, and also ahead (a revision this version does
    not know: a newer release migrated it), as ``app.main.migration_state`` judges."""
    current = current_revision_sync(url)
    script = ScriptDirectory.from_config(alembic_config(url))
    head = script.get_current_head()
    known = {r.revision for r in script.walk_revisions()}
    if current == head or (current is not None and current not in known):
        return None
    return current, head


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
