"""Path sets, builds and path-build links (orchestrator-owned)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.dialect import insert_ignore
from app.db.locking import conditional_update
from app.db.memo import Kept, Memo
from app.db.repos._rows import build_from_row, dumps, entries_from_json, entries_to_json
from app.db.tables import builds as bt
from app.db.tables import path_builds as pbt
from app.db.tables import path_sets as pst
from app.domain.entities import Build, PathSet
from app.domain.errors import NotFound, VersionMismatch
from app.domain.states import BuildStatus

# The hot reads, built once (``app/db/bound.py``).
_PATH_SETS = where_bound(sa.select(pst), pst, "queue", within="head")
_PATH_SET_VERSIONS = where_bound(sa.select(pst.c.head, pst.c.version), pst, "queue",
                                 within="head")
_BUILD = where_bound(sa.select(bt), bt, "queue", "id")
_BUILDS = where_bound(sa.select(bt), bt, "queue", within="id")
_LINK = where_bound(sa.select(pbt.c.build_id), pbt, "queue", "path_id", "attempt")
_LINKS = where_bound(sa.select(pbt), pbt, "queue", within="path_id")


async def path_sets(
    session: AsyncSession, *, queue: str, heads: Iterable[str],
    memo: Memo[PathSet] | None = None,
) -> dict[str, PathSet]:
    """Stored path sets by head; heads without one get an empty set at version 0.
    ``memo``: rows unchanged since the memo decoded them are not parsed again."""
    wanted = sorted(set(heads))
    out = {h: PathSet(queue=queue, head=h) for h in wanted}
    if wanted:
        rows = await session.execute(_PATH_SETS, {"queue": queue, "head": wanted})
        for r in rows:
            out[r.head] = _path_set(r) if memo is None else \
                memo.get((r.queue, r.head), r, _path_set)
    return out


async def path_sets_kept(session: AsyncSession, *, queue: str, heads: Iterable[str],
                         kept: Kept[PathSet]) -> dict[str, PathSet]:
    """``path_sets`` that reads a set's entries only where ``kept`` lacks its current
    version (every write of a path set raises it: ``save_path_set``)."""
    wanted = sorted(set(heads))
    out = {h: PathSet(queue=queue, head=h) for h in wanted}
    if not wanted:
        kept.keep({}, {})
        return out
    rows = await session.execute(_PATH_SET_VERSIONS, {"queue": queue, "head": wanted})
    stamps: dict[Any, Any] = dict(rows.all())
    stale = kept.stale(stamps)
    found: Iterable[Any] = await session.execute(
        _PATH_SETS, {"queue": queue, "head": stale}) if stale else []
    fetched = {r.head: (r.version, _path_set(r)) for r in found}
    out.update(kept.keep(stamps, fetched))
    return out


def _path_set(r: Any) -> PathSet:
    return PathSet(queue=r.queue, head=r.head, entries=entries_from_json(r.entries_json),
                   version=r.version)


async def save_path_set(session: AsyncSession, *, old: PathSet, new: PathSet) -> None:
    """Create (old version 0) or replace wholesale with a conditional write."""
    if old.version == 0:
        result = await session.execute(insert_ignore(session, pst).values(
            queue=new.queue, head=new.head, entries_json=entries_to_json(new.entries),
            version=new.version))
        if not result.rowcount:  # type: ignore[attr-defined]
            raise VersionMismatch(f"path set of {new.head!r} was created concurrently")
        return
    await conditional_update(
        session, pst, key={"queue": old.queue, "head": old.head}, old_version=old.version,
        new_version=new.version, values={"entries_json": entries_to_json(new.entries)})


async def create_build(session: AsyncSession, *, build: Build, now_ms: int) -> None:
    await session.execute(insert_ignore(session, bt).values(
        queue=build.queue, id=build.id, batch_id=build.batch_id, path_id=build.path_id,
        attempt=build.attempt, status=build.status.value, version=build.version,
        log_url=build.log_url, epoch=build.epoch, detail=build.detail, created_at_ms=now_ms,
        updated_at_ms=now_ms))


async def get_build(session: AsyncSession, *, queue: str, id: str) -> Build:
    row = (await session.execute(_BUILD, {"queue": queue, "id": id})).first()
    if row is None:
        raise NotFound(f"build {id!r} does not exist in queue {queue!r}")
    return build_from_row(row)


async def builds_by_id(
    session: AsyncSession, *, queue: str, ids: Iterable[str]
) -> dict[str, Build]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await session.execute(_BUILDS, {"queue": queue, "id": wanted})
    return {r.id: build_from_row(r) for r in rows}


async def builds_of(session: AsyncSession, *, queue: str, batch_id: str, path_id: str,
                    attempt: int) -> list[Build]:
    """Every build stored for a batch's (path, attempt): the linked one, and the loser
    of a trigger race (stored, never linked)."""
    rows = await session.execute(sa.select(bt).where(
        bt.c.queue == queue, bt.c.batch_id == batch_id, bt.c.path_id == path_id,
        bt.c.attempt == attempt).order_by(bt.c.id))
    return [build_from_row(r) for r in rows]


async def update_build(session: AsyncSession, *, old: Build, new: Build, now_ms: int) -> None:
    await conditional_update(
        session, bt, key={"queue": old.queue, "id": old.id}, old_version=old.version,
        new_version=new.version,
        values={"status": new.status.value, "log_url": new.log_url, "updated_at_ms": now_ms,
                "base_sha": new.base_sha, "commit_sha": new.commit_sha,
                "tree_sha": new.tree_sha, "changes_json": dumps(list(new.changes)),
                "detail": new.detail})


async def link(session: AsyncSession, *, queue: str, path_id: str, attempt: int,
               build_id: str) -> str:
    """Write-once link of (path, attempt) to a build; returns the build id that holds it."""
    await session.execute(insert_ignore(session, pbt).values(
        queue=queue, path_id=path_id, attempt=attempt, build_id=build_id))
    held = await get_link(session, queue=queue, path_id=path_id, attempt=attempt)
    assert held is not None
    return held


async def get_link(session: AsyncSession, *, queue: str, path_id: str, attempt: int) -> str | None:
    row = (await session.execute(_LINK, {"queue": queue, "path_id": path_id,
                                         "attempt": attempt})).first()
    return row.build_id if row else None


async def links(session: AsyncSession, *, queue: str,
                keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
    wanted = set(keys)
    if not wanted:
        return {}
    path_ids = sorted({p for p, _ in wanted})
    rows = await session.execute(_LINKS, {"queue": queue, "path_id": path_ids})
    return {(r.path_id, r.attempt): r.build_id for r in rows if (r.path_id, r.attempt) in wanted}


async def recent_finished_builds(session: AsyncSession, *, queue: str,
                                 limit: int = 200) -> list[Build]:
    """The queue's latest builds that ended with a verdict (passed or failed), newest first."""
    rows = await session.execute(
        sa.select(bt).where(bt.c.queue == queue,
                            bt.c.status.in_([BuildStatus.SUCCEEDED.value,
                                             BuildStatus.FAILED.value]))
        .order_by(bt.c.updated_at_ms.desc()).limit(limit))
    return [build_from_row(r) for r in rows]
