"""A ``Rig`` per test on the backend the test is parametrised with (``BACKENDS``).

Overrides ``database_url`` for speed: a state-table case is one short transaction or
two, so on PostgreSQL creating and dropping a database per case (as the shared fixture
does) would cost ten times the case. Here every PostgreSQL case of the session shares
one database cloned from the migrated template, and each starts by emptying the
application tables (the broker is recorded, so the queue's tables stay empty). SQLite
cases keep their own copied file.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from app.db import tables
from app.queue.backends import postgres_dsn_from_url
from tests.conftest import _pg_admin_sync, _pg_url_for
from tests.support.controllers import Rig, make_rig


@pytest.fixture(scope="session")
def pg_state_tables_db(pg_template: str) -> Iterator[str]:
    name = f"sq_st_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _pg_admin_sync(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    # Commits need not wait for the disk: this database is thrown away.
    _pg_admin_sync(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    yield _pg_url_for(name)
    _pg_admin_sync(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _empty(url: str) -> None:
    """Delete every application row (``DELETE`` of a few rows is far cheaper than
    ``TRUNCATE``, which rewrites each table's files)."""
    conn = await asyncpg.connect(postgres_dsn_from_url(url))
    try:
        async with conn.transaction():
            for t in reversed(tables.metadata.sorted_tables):
                await conn.execute(f'DELETE FROM "{t.name}"')
    finally:
        await conn.close()


@pytest.fixture
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty migrated database of the backend named by the param."""
    if getattr(request, "param", "sqlite") == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "sq.db"
        shutil.copyfile(template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    url: str = request.getfixturevalue("pg_state_tables_db")
    await _empty(url)
    yield url


@pytest.fixture
async def rig(database_url: str) -> AsyncIterator[Rig]:
    r = make_rig(database_url)
    try:
        yield r
    finally:
        await r.aclose()
