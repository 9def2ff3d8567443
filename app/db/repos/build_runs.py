"""Build runs of the command and webhook build runners (table ``build_runs``).

``SqlBuildStore`` is the ``BuildStore`` (``app/extensions/base.py``) the composition
root hands to the runners; the module functions are its SQL, one transaction each.
Writes that change a run are guarded by its status: a finished run (terminal status)
is never changed again, so the first verdict stands. The store masks known secret
values (``mask``: the composition root's ``SecretMask`` of the admin token, database
passwords and webhook secrets) in every log and detail it writes, since
``GET /api/v1/builds/{id}/log`` serves them to anyone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.dialect import insert_ignore
from app.db.engine import Database
from app.db.tables import build_runs as t
from app.domain.build_run import BuildRun, TestedTree
from app.domain.states import BuildStatus

LIVE = (BuildStatus.ACCEPTED.value, BuildStatus.RUNNING.value)
_RUN_COLUMNS = [c for c in t.c if c.name != "log"]


def _from_row(r: Any) -> BuildRun:
    return BuildRun(
        id=r.id, queue=r.queue, runner=r.runner, batch_id=r.batch_id, path_id=r.path_id,
        attempt=r.attempt, status=BuildStatus(r.status), owner=r.owner,
        owner_group=r.owner_group, detail=r.detail, exit_code=r.exit_code,
        log_url=r.log_url, pid=r.pid, heartbeat_ms=r.heartbeat_ms,
        cancel_requested=bool(r.cancel_requested), created_at_ms=r.created_at_ms,
        updated_at_ms=r.updated_at_ms, tested=tested_from_json(r.tested_json),
    )


def tested_to_json(tested: TestedTree) -> str:
    return json.dumps({"base": tested.base, "commit": tested.commit, "tree": tested.tree,
                       "changes": list(tested.changes)}, sort_keys=True)


def tested_from_json(text: str | None) -> TestedTree | None:
    if not text:
        return None
    d = json.loads(text)
    return TestedTree(base=d["base"], commit=d["commit"], tree=d["tree"],
                      changes=tuple(d.get("changes", ())))


async def create(session: AsyncSession, *, run: BuildRun) -> None:
    """Insert the run (a second create of the same id changes nothing)."""
    await session.execute(insert_ignore(session, t).values(
        id=run.id, queue=run.queue, runner=run.runner, batch_id=run.batch_id,
        path_id=run.path_id, attempt=run.attempt, status=run.status.value, owner=run.owner,
        owner_group=run.owner_group, detail=run.detail, exit_code=run.exit_code,
        log_url=run.log_url, pid=run.pid, heartbeat_ms=run.heartbeat_ms,
        cancel_requested=run.cancel_requested, log="",
        tested_json=tested_to_json(run.tested) if run.tested else "",
        created_at_ms=run.created_at_ms,
        updated_at_ms=run.updated_at_ms))


async def get(session: AsyncSession, *, build_id: str) -> BuildRun | None:
    row = (await session.execute(sa.select(*_RUN_COLUMNS).where(t.c.id == build_id))).first()
    return _from_row(row) if row is not None else None


async def update(session: AsyncSession, *, build_id: str, now_ms: int,
                 values: dict[str, Any]) -> BuildRun | None:
    """Apply ``values`` to the run if it is unfinished; return it as stored afterwards."""
    if values:
        await session.execute(sa.update(t).where(t.c.id == build_id, t.c.status.in_(LIVE))
                              .values(**values, updated_at_ms=now_ms))
    return await get(session, build_id=build_id)


async def nudge(session: AsyncSession, *, queue: str, path_id: str, attempt: int) -> int:
    result = await session.execute(sa.update(t).where(
        t.c.queue == queue, t.c.path_id == path_id, t.c.attempt == attempt,
        t.c.status.in_(LIVE)).values(heartbeat_ms=0))
    return int(getattr(result, "rowcount", 0) or 0)


async def set_log(session: AsyncSession, *, build_id: str, text: str) -> None:
    await session.execute(sa.update(t).where(t.c.id == build_id).values(log=text))


async def get_log(session: AsyncSession, *, build_id: str) -> str | None:
    row = (await session.execute(sa.select(t.c.log).where(t.c.id == build_id))).first()
    return str(row.log) if row is not None else None


async def heartbeat(session: AsyncSession, *, owner: str, now_ms: int,
                    live: Sequence[str]) -> list[str]:
    await session.execute(sa.update(t).where(t.c.owner == owner, t.c.status.in_(LIVE))
                          .values(heartbeat_ms=now_ms))
    if not live:
        return []
    rows = await session.execute(sa.select(t.c.id).where(
        t.c.id.in_(sorted(set(live))),
        sa.or_(t.c.cancel_requested.is_(True), t.c.status.not_in(LIVE))))
    return sorted(r.id for r in rows)


async def request_cancel(session: AsyncSession, *, build_id: str) -> None:
    await session.execute(sa.update(t).where(t.c.id == build_id, t.c.status.in_(LIVE))
                          .values(cancel_requested=True))


async def unfinished(session: AsyncSession, *, owner_group: str) -> list[BuildRun]:
    rows = await session.execute(sa.select(*_RUN_COLUMNS).where(
        t.c.owner_group == owner_group, t.c.status.in_(LIVE)).order_by(t.c.created_at_ms))
    return [_from_row(r) for r in rows]


class SqlBuildStore:
    """The ``BuildStore`` on the application database (shared by every process)."""

    def __init__(self, db: Database, *, mask: Callable[[str], str] | None = None) -> None:
        self.db = db
        self.mask = mask or (lambda text: text)

    async def create(self, run: BuildRun) -> None:
        async with self.db.write() as s:
            await create(s, run=run)

    async def get(self, build_id: str) -> BuildRun | None:
        async with self.db.read() as s:
            return await get(s, build_id=build_id)

    async def update(
        self, build_id: str, *, now_ms: int, status: BuildStatus | None = None,
        detail: str | None = None, exit_code: int | None = None, log_url: str | None = None,
        pid: int | None = None, tested: TestedTree | None = None,
        heartbeat_ms: int | None = None,
    ) -> BuildRun | None:
        values: dict[str, Any] = {}
        if heartbeat_ms is not None:
            values["heartbeat_ms"] = heartbeat_ms
        if tested is not None:
            values["tested_json"] = tested_to_json(tested)
        if status is not None:
            values["status"] = status.value
        if detail is not None:
            values["detail"] = self.mask(detail)
        if exit_code is not None:
            values["exit_code"] = exit_code
        if log_url is not None:
            values["log_url"] = log_url
        if pid is not None:
            values["pid"] = pid
        async with self.db.write() as s:
            return await update(s, build_id=build_id, now_ms=now_ms, values=values)

    async def nudge(self, queue: str, path_id: str, attempt: int) -> int:
        async with self.db.write() as s:
            return await nudge(s, queue=queue, path_id=path_id, attempt=attempt)

    async def set_log(self, build_id: str, text: str) -> None:
        async with self.db.write() as s:
            await set_log(s, build_id=build_id, text=self.mask(text))

    async def get_log(self, build_id: str) -> str | None:
        async with self.db.read() as s:
            return await get_log(s, build_id=build_id)

    async def heartbeat(self, owner: str, now_ms: int, live: Sequence[str]) -> list[str]:
        async with self.db.write() as s:
            return await heartbeat(s, owner=owner, now_ms=now_ms, live=live)

    async def request_cancel(self, build_id: str) -> None:
        async with self.db.write() as s:
            await request_cancel(s, build_id=build_id)

    async def unfinished(self, owner_group: str) -> list[BuildRun]:
        async with self.db.read() as s:
            return await unfinished(s, owner_group=owner_group)
