"""Database layer: migrations match the models, conditional writes, sessions."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.db import migrate
from app.db.engine import Database
from app.db.locking import conditional_update
from app.db.tables import metadata as app_metadata
from app.domain.errors import VersionMismatch
from app.queue.schema import metadata as queue_metadata
from tests.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

scratch = sa.MetaData()
widgets = sa.Table(
    "test_widgets",
    scratch,
    sa.Column("queue", sa.String(50), primary_key=True),
    sa.Column("id", sa.String(50), primary_key=True),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
)


def _combined() -> sa.MetaData:
    combined = sa.MetaData()
    for md in (app_metadata, queue_metadata):
        for table in md.tables.values():
            table.to_metadata(combined)
    return combined


async def test_migrations_match_the_models(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with db.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"compare_type": True}), _combined()
                )
            )
        assert diff == []
        assert await migrate.current_revision(db.engine) == migrate.head_revision(database_url)
    finally:
        await db.dispose()


async def test_migrating_again_is_a_no_op(database_url: str) -> None:
    await migrate.upgrade(database_url)
    db = Database(database_url)
    try:
        assert await migrate.current_revision(db.engine) == migrate.head_revision(database_url)
    finally:
        await db.dispose()


async def test_conditional_update_wins_once_and_reports_a_lost_race(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with db.engine.begin() as conn:
            await conn.run_sync(scratch.create_all)
        async with db.write() as s:
            await s.execute(widgets.insert().values(queue="q", id="w1", state="new", version=1))
        key = {"queue": "q", "id": "w1"}

        async def advance(state: str) -> bool:
            try:
                async with db.write() as s:
                    await conditional_update(s, widgets, key=key, old_version=1, new_version=2,
                                             values={"state": state})
                return True
            except VersionMismatch:
                return False

        results = await asyncio.gather(advance("a"), advance("b"), advance("c"))
        assert sorted(results) == [False, False, True]
        async with db.read() as s:
            row = (await s.execute(sa.select(widgets))).one()
        assert row.version == 2 and row.state in {"a", "b", "c"}
        with pytest.raises(VersionMismatch, match="no longer at version 1"):
            async with db.write() as s:
                await conditional_update(s, widgets, key=key, old_version=1, new_version=2,
                                         values={"state": "late"})
        with pytest.raises(VersionMismatch):
            async with db.write() as s:
                await conditional_update(s, widgets, key={"queue": "q", "id": "absent"},
                                         old_version=1, new_version=2, values={"state": "x"})
    finally:
        await db.dispose()


async def test_a_failed_write_block_rolls_back(database_url: str) -> None:
    db = Database(database_url)
    try:
        async with db.engine.begin() as conn:
            await conn.run_sync(scratch.create_all)
        with pytest.raises(RuntimeError):
            async with db.write() as s:
                await s.execute(widgets.insert().values(queue="q", id="w", state="x", version=1))
                raise RuntimeError("fail after the write")
        async with db.read() as s:
            assert (await s.execute(sa.select(sa.func.count()).select_from(widgets))).scalar() == 0
    finally:
        await db.dispose()
