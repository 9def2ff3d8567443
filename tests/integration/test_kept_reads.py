"""Reads that fetch whole rows only where they changed (``Kept``): the active batches of
a deep queue and their path sets are read by id and version first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from app.db.engine import Database
from app.db.memo import Kept
from app.db.repos import batches as batch_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, PathSet
from app.domain.states import BatchState
from tests.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()


def _batch(n: int, state: BatchState = BatchState.SPECULATING) -> Batch:
    return Batch(queue="q", id=f"q/{n}", contains=(f"q/r{n}",), dependencies=(),
                 state=state, version=1, created_at_ms=n)


async def _seed(db: Database, count: int) -> list[Batch]:
    async with db.write() as s:
        for n in range(1, count + 1):
            await batch_repo.create(s, batch=_batch(n), now_ms=n)
    async with db.read() as s:
        return await batch_repo.list_by_states(s, queue="q", states=ACTIVE)


async def _kept_list(db: Database, kept: Kept[Batch]) -> list[Batch]:
    async with db.read() as s:
        return await batch_repo.list_kept(s, queue="q", states=ACTIVE, kept=kept)


async def test_an_unchanged_queue_is_read_whole_once(db: Database) -> None:
    stored = await _seed(db, 12)
    kept: Kept[Batch] = Kept()
    assert await _kept_list(db, kept) == stored
    assert kept.fetched == 12
    again = await _kept_list(db, kept)
    assert again == stored and kept.fetched == 12  # nothing changed: nothing fetched


async def test_a_changed_row_is_read_again_and_one_that_left_is_dropped(db: Database) -> None:
    stored = await _seed(db, 6)
    kept: Kept[Batch] = Kept()
    await _kept_list(db, kept)
    two, five = stored[1], stored[4]
    moved = replace(two, dependencies=("q/1",), version=2)
    done = replace(five, state=BatchState.SUCCEEDED, version=2)
    async with db.write() as s:
        await batch_repo.update(s, old=two, new=moved, now_ms=100)
        await batch_repo.update(s, old=five, new=done, now_ms=100)
        await batch_repo.create(s, batch=_batch(7, BatchState.CREATED), now_ms=100)
    got = await _kept_list(db, kept)
    assert [b.id for b in got] == ["q/1", "q/2", "q/3", "q/4", "q/6", "q/7"]
    assert got[1].dependencies == ("q/1",) and got[1].version == 2
    assert kept.fetched == 6 + 2  # the changed row and the new one, not the queue
    async with db.read() as s:
        assert got == await batch_repo.list_by_states(s, queue="q", states=ACTIVE)


class _WritesBetweenReads:
    """A session whose first statement is followed by ``write`` (committed elsewhere)."""

    def __init__(self, session: Any, write: Callable[[], Awaitable[None]]) -> None:
        self._session, self._write, self._calls = session, write, 0

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._session.execute(*args, **kwargs)
        self._calls += 1
        if self._calls == 1:
            result = list(result)
            await self._write()
        return result


async def test_a_row_that_changed_between_the_two_reads_is_read_as_it_is_then(
        db: Database) -> None:
    """Batches 1 and 3 changed since the kept read, and change again between the read of
    the stamps and the fetch of the changed rows (3 leaves the states). PostgreSQL
    reads each statement at its own time: 1 comes back as it is now, 3 not at all;
    SQLite reads both in the transaction's snapshot: as they were at the first read."""
    stored = await _seed(db, 3)
    kept: Kept[Batch] = Kept()
    await _kept_list(db, kept)
    one, _, three = stored
    one2, three2 = replace(one, version=2), replace(three, version=2)
    async with db.write() as s:
        await batch_repo.update(s, old=one, new=one2, now_ms=50)
        await batch_repo.update(s, old=three, new=three2, now_ms=50)

    async def write() -> None:
        async with db.write() as s:
            await batch_repo.update(s, old=one2, new=replace(one2, version=3), now_ms=60)
            await batch_repo.update(s, old=three2, new=replace(
                three2, state=BatchState.FAILED, version=3), now_ms=60)

    async with db.read() as s:
        got = await batch_repo.list_kept(_WritesBetweenReads(s, write),  # type: ignore[arg-type]
                                         queue="q", states=ACTIVE, kept=kept)
    seen = [(b.id, b.version) for b in got]
    if db.dialect == "postgresql":
        assert seen == [("q/1", 3), ("q/2", 1)]
    else:
        assert seen == [("q/1", 2), ("q/2", 1), ("q/3", 2)]


async def test_path_sets_are_read_whole_only_when_their_version_moved(db: Database) -> None:
    old = {h: PathSet(queue="q", head=h) for h in ("q/1", "q/2", "q/3")}
    async with db.write() as s:
        for h in ("q/1", "q/2"):
            await spec_repo.save_path_set(s, old=old[h], new=replace(old[h], version=1))
    kept: Kept[PathSet] = Kept()

    async def read() -> dict[str, PathSet]:
        async with db.read() as s:
            return await spec_repo.path_sets_kept(s, queue="q", heads=list(old), kept=kept)

    first = await read()
    assert {h: p.version for h, p in first.items()} == {"q/1": 1, "q/2": 1, "q/3": 0}
    assert kept.fetched == 2
    assert await read() == first and kept.fetched == 2
    async with db.write() as s:
        await spec_repo.save_path_set(s, old=first["q/2"], new=replace(first["q/2"], version=2))
    again = await read()
    assert again["q/2"].version == 2 and kept.fetched == 3
    async with db.read() as s:
        assert again == await spec_repo.path_sets(s, queue="q", heads=list(old))
