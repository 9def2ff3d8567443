"""A controller's world below the whole app: a real migrated database, a broker that
records what is published, and the demo queue's fakes as extensions (each seam wrapped
in a ``Scripted`` recorder a case can give a chosen outcome or error), with seeds for
every orchestrator and gateway table (re-exported by ``tests.support.controllers``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from app.controllers.common import Deps
from app.db import tables
from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import request_log as log_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import (
    Batch,
    Build,
    ChangeDetails,
    LandRequest,
    PathEntry,
    PathSet,
    RequestLog,
    RequestSummary,
)
from app.domain.queue_config import parse_queues
from app.domain.states import BatchState, BuildStatus, LandStrategy, RequestState
from app.extensions.base import QueueExtensions
from app.extensions.factory import build_extensions
from app.speculation.scoring import build_scorer
from tests.support.doubles import (
    NOW_MS,
    QUEUE,
    SEAMS,
    RecordingBroker,
    RecordingMetrics,
    Scripted,
)
from tests.support.seeds import batch_id, change_uri, status_entry

QUEUES_YAML = Path(__file__).resolve().parents[2] / "queues.yaml"


@functools.cache
def _demo_config() -> Any:
    configs = parse_queues(QUEUES_YAML.read_text(encoding="utf-8"), source=str(QUEUES_YAML),
                           base_dir=QUEUES_YAML.parent)
    return configs[QUEUE]


def demo_extensions() -> QueueExtensions:
    """The ``demo`` queue of the example queues file: fakes only (fresh ones each time;
    the file is read once)."""
    return build_extensions(_demo_config(), build_scorer)


@dataclass
class Rig:
    """A controller's world: database, recording broker and the deps that join them.

    ``ext`` is the demo queue's extensions with every seam wrapped in ``Scripted``
    (``rig.seam("merger").script(check=...)``; ``rig.seam("runner").called("cancel")``).
    ``stack`` undoes what a case patched when the rig closes.
    """

    db: Database
    broker: RecordingBroker
    deps: Deps
    ext: QueueExtensions
    metrics: RecordingMetrics
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def configure(self, **changes: Any) -> QueueExtensions:
        """This case's queue with other settings (``build_budget=1``, ``speculation=``);
        the seams stay the scripted ones."""
        ext = self.ext = replace(self.ext, **changes)
        self.deps.extensions = lambda _q: ext
        return ext

    def seam(self, name: str) -> Scripted:
        wrapped = getattr(self.ext, name)
        assert isinstance(wrapped, Scripted), name
        return wrapped

    def calls(self) -> dict[str, list[str]]:
        """Methods called on each seam, in order (seams never called are left out)."""
        out = {n: [m for m, _ in self.seam(n).calls] for n in SEAMS}
        return {n: ms for n, ms in out.items() if ms}

    async def aclose(self) -> None:
        self.stack.close()
        await self.db.dispose()

    # --- orchestrator seeds ---------------------------------------------------------

    async def request(self, n: int, state: RequestState, *, version: int = 1,
                      uris: tuple[str, ...] | None = None, last_error: str = "") -> LandRequest:
        req = LandRequest(queue=QUEUE, id=f"{QUEUE}/{n}",
                          change_uris=uris or (change_uri(n),),
                          strategy=LandStrategy.REBASE, state=state, version=version,
                          last_error=last_error)
        async with self.db.write() as s:
            await request_repo.create(s, request=req, now_ms=self.broker.now_ms)
        return req

    async def batch(self, n: int, state: BatchState, contains: Sequence[LandRequest | str], *,
                    version: int = 1, dependencies: tuple[str, ...] = (),
                    failure_reason: str = "",
                    landed: dict[str, tuple[str, ...]] | None = None) -> Batch:
        batch = Batch(queue=QUEUE, id=batch_id(n),
                      contains=tuple(r if isinstance(r, str) else r.id for r in contains),
                      dependencies=dependencies, state=state, version=version,
                      failure_reason=failure_reason, landed=dict(landed or {}))
        async with self.db.write() as s:
            await batch_repo.create(s, batch=batch, now_ms=self.broker.now_ms)
        return batch

    async def path_set(self, n: int, entries: Sequence[PathEntry], *,
                       version: int = 1) -> PathSet:
        """Store batch ``n``'s path set (``path(n)`` makes a path for it)."""
        new = PathSet(queue=QUEUE, head=batch_id(n), entries=tuple(entries), version=version)
        async with self.db.write() as s:
            await spec_repo.save_path_set(s, old=replace(new, version=0), new=new)
        return new

    async def build(self, build_id: str, n: int, status: BuildStatus, *, path_id: str,
                    attempt: int = 1, version: int = 1, log_url: str = "",
                    link: bool = True, detail: str = "") -> Build:
        """A build of batch ``n``'s path, linked to its (path, attempt) unless ``link``
        is False."""
        build = Build(queue=QUEUE, id=build_id, batch_id=batch_id(n), path_id=path_id,
                      attempt=attempt, status=status, version=version, log_url=log_url,
                      detail=detail)
        async with self.db.write() as s:
            await spec_repo.create_build(s, build=build, now_ms=self.broker.now_ms)
            if link:
                await spec_repo.link(s, queue=QUEUE, path_id=path_id, attempt=attempt,
                                     build_id=build_id)
        return build

    async def link(self, path_id: str, attempt: int, build_id: str) -> None:
        async with self.db.write() as s:
            await spec_repo.link(s, queue=QUEUE, path_id=path_id, attempt=attempt,
                                 build_id=build_id)

    async def claim(self, n: int, uris: Sequence[str]) -> None:
        """Request ``n`` claims the change URIs (details: no author, no files)."""
        async with self.db.write() as s:
            await change_repo.claim(s, queue=QUEUE, request_id=f"{QUEUE}/{n}",
                                    details=[ChangeDetails(uri=u) for u in uris],
                                    now_ms=self.broker.now_ms)

    async def get_request(self, n: int) -> LandRequest:
        async with self.db.read() as s:
            return await request_repo.get(s, queue=QUEUE, id=f"{QUEUE}/{n}")

    async def get_batch(self, n: int) -> Batch:
        async with self.db.read() as s:
            return await batch_repo.get(s, queue=QUEUE, id=batch_id(n))

    async def get_build(self, build_id: str) -> Build:
        async with self.db.read() as s:
            return await spec_repo.get_build(s, queue=QUEUE, id=build_id)

    # --- gateway seeds --------------------------------------------------------------

    async def summary(self, n: int, status: str = "accepted", *, request_version: int = 0,
                      at_ms: int = NOW_MS - 10_000, received_at_ms: int = NOW_MS - 60_000,
                      last_error: str = "") -> RequestSummary:
        """Request ``n``'s gateway summary: ``accepting`` at version 1, or (any other
        status) that status folded on top at version 2. No history row is stored."""
        async with self.db.write() as s:
            summary = await log_repo.create_summary(
                s, queue=QUEUE, request_id=f"{QUEUE}/{n}", change_uris=[f"uri-{n}"],
                received_at_ms=received_at_ms)
            if status != log_repo.ACCEPTING:
                folded = status_entry(n, status, at_ms=at_ms, request_version=request_version,
                                      last_error=last_error)
                summary = await log_repo.update_summary_status(s, summary=summary, entry=folded)
        return summary

    async def history_row(self, entry: RequestLog) -> None:
        async with self.db.write() as s:
            await log_repo.append_log(s, entry=entry)

    async def get_summary(self, n: int) -> RequestSummary | None:
        async with self.db.read() as s:
            return await log_repo.find_summary(s, queue=QUEUE, request_id=f"{QUEUE}/{n}")

    async def history(self, n: int) -> list[RequestLog]:
        async with self.db.read() as s:
            return await log_repo.history(s, queue=QUEUE, request_id=f"{QUEUE}/{n}")

    # --- everything -----------------------------------------------------------------

    async def snapshot(self) -> dict[str, list[str]]:
        """Every row of every application table (the queue's tables are the broker's,
        which is recorded instead)."""
        every = tables.metadata.sorted_tables
        out: dict[str, list[str]] = {}
        async with self.db.read() as s:
            counts = (await s.execute(sa.select(*[  # one query; rows only where there are
                sa.select(sa.func.count()).select_from(t).scalar_subquery().label(t.name)
                for t in every]))).one()
            for table, n in zip(every, counts, strict=True):
                rows = (await s.execute(sa.select(table))).all() if n else []
                out[table.name] = sorted(repr(tuple(r)) for r in rows)
        return out


def make_rig(database_url: str, extensions: QueueExtensions | None = None) -> Rig:
    db = Database(database_url)
    broker = RecordingBroker()
    base = extensions or demo_extensions()
    wrapped: dict[str, Any] = {n: Scripted(getattr(base, n)) for n in SEAMS}
    ext = replace(base, **wrapped)
    metrics = RecordingMetrics()
    deps = Deps(db=db, broker=broker, extensions=lambda _q: ext,  # type: ignore[arg-type]
                metrics=metrics)
    return Rig(db=db, broker=broker, deps=deps, ext=ext, metrics=metrics)
