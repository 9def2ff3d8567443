"""Shared fixtures: a migrated database per test, on SQLite and (when configured) PostgreSQL.

PostgreSQL tests need ``SQ_TEST_POSTGRES_URL`` (``.ci/run`` sets it); without it they
skip with that reason. Each PostgreSQL test gets its own database cloned from a
migrated template; each SQLite test its own file copied from a migrated template.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import app.controllers.stages  # noqa: F401 - publishing needs the stage registry loaded
from app.db.migrate import upgrade_sync
from app.queue.backends import postgres_dsn_from_url

PG_URL = os.environ.get("SQ_TEST_POSTGRES_URL")
PG_SKIP_REASON = "PostgreSQL tests need SQ_TEST_POSTGRES_URL (set by .ci/run)"

#: the order tests start in: the long ones first, so that under pytest-xdist the short
#: ones fill the workers at the end instead of one worker finishing a long test alone
_START_ORDER = {"e2e": 1, "browser": 1, "security": 2, "integration": 3, "unit": 4}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        folder = item.nodeid.split("/")[1] if item.nodeid.count("/") > 1 else ""
        return (0 if item.get_closest_marker("slow") else 1, _START_ORDER.get(folder, 3))

    items.sort(key=rank)  # stable: a file's tests keep their order


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgres",
        id="postgres",
        marks=[pytest.mark.postgres, pytest.mark.skipif(not PG_URL, reason=PG_SKIP_REASON)],
    ),
]


def _pg_url_for(database: str) -> str:
    assert PG_URL is not None
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{database}"


async def _pg_admin(sql: str) -> None:
    assert PG_URL is not None
    conn = await asyncpg.connect(postgres_dsn_from_url(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _pg_admin_sync(sql: str) -> None:
    """Run an admin statement from sync code, even inside a running event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _pg_admin(sql)).result()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tpl") / "template.db"
    upgrade_sync(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    if not PG_URL:
        pytest.skip(PG_SKIP_REASON)
    name = f"sq_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _pg_admin_sync(f'CREATE DATABASE "{name}"')
    upgrade_sync(_pg_url_for(name))
    yield name
    _pg_admin_sync(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database_url(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[str]:
    """A freshly migrated, empty database URL for the backend named by the param."""
    kind = getattr(request, "param", "sqlite")
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "sq.db"
        shutil.copyfile(template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    template_name: str = request.getfixturevalue("pg_template")
    name = f"sq_t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    try:
        yield _pg_url_for(name)
    finally:
        await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
