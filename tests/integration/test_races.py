"""Races below the whole app, on seeded state: two speculate runs of one queue (a lease
lost mid-run lets a successor run beside its stale predecessor) and two folds of one
request's log (the gateway's own ``cancelling`` beside the log consumer's terminal
status). ``docs/races.md`` is the matrix; ``tests/e2e/test_races*.py`` drive the rest
on the real app.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.controllers.common import Deps
from app.controllers.pipeline import build_topology
from app.controllers.speculate import ACTIVE, SpeculateController
from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import request_log as log_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain import messages as m
from app.domain.entities import (
    Batch,
    Build,
    LandRequest,
    PathEntry,
    PathSet,
    RequestLog,
    SpeculationPath,
)
from app.domain.errors import VersionMismatch
from app.domain.queue_config import parse_queues
from app.domain.states import (
    BatchState,
    BuildStatus,
    LandStrategy,
    LogType,
    PathStatus,
    RequestState,
)
from app.extensions.factory import build_extensions
from app.queue import Broker
from app.speculation.scoring import build_scorer
from tests.conftest import BACKENDS, PG_SKIP_REASON, PG_URL
from tests.integration.queue_support import started_broker
from tests.support.clocks import FakeClock
from tests.support.interleave import hook

pytestmark = pytest.mark.timeout(60)

QUEUE = "demo"
BUDGET = 2
QUEUES_YAML = f"""
queues:
  - name: {QUEUE}
    change_provider: {{type: fake}}
    conflict_analyzer: {{type: pathoverlap, by: directory}}
    build_runner: {{type: fake, delay_ms: 0}}
    merger: {{type: fake}}
    scorer: {{type: constant, probability: 0.9}}
    build_budget: {BUDGET}
"""


def bid(n: int) -> str:
    return f"{QUEUE}/batch/{n}"


@dataclass
class World:
    db: Database
    broker: Broker
    clock: FakeClock
    deps: Deps

    async def batch(self, n: int, state: BatchState, deps: tuple[str, ...] = ()) -> Batch:
        """Batch ``n`` with one member request ``<queue>/<n>`` (``batched``)."""
        sqid = f"{QUEUE}/{n}"
        batch = Batch(queue=QUEUE, id=bid(n), contains=(sqid,), dependencies=deps,
                      state=state, version=1)
        self.clock.now += 1  # queue order is creation order
        async with self.db.write() as s:
            await request_repo.create(s, request=LandRequest(
                queue=QUEUE, id=sqid, change_uris=(f"git://example.com/r/refs%2Fheads%2F{n}/1",),
                strategy=LandStrategy.REBASE, state=RequestState.BATCHED, version=2),
                now_ms=self.clock.now)
            await batch_repo.create(s, batch=batch, now_ms=self.clock.now)
        return batch

    async def building(self, n: int, path: SpeculationPath, build_id: str) -> None:
        """Batch ``n``'s path set: ``path`` building, linked to a running build."""
        async with self.db.write() as s:
            await spec_repo.save_path_set(s, old=PathSet(queue=QUEUE, head=bid(n)), new=PathSet(
                queue=QUEUE, head=bid(n), version=1,
                entries=(PathEntry(path=path, status=PathStatus.BUILDING, attempt=1),)))
            await spec_repo.create_build(s, build=Build(
                queue=QUEUE, id=build_id, batch_id=bid(n), path_id=path.id, attempt=1,
                status=BuildStatus.RUNNING, version=1), now_ms=self.clock.now)
            await spec_repo.link(s, queue=QUEUE, path_id=path.id, attempt=1, build_id=build_id)

    async def live_paths(self) -> dict[str, list[str]]:
        """Live path entries per active batch: what the build budget counts."""
        async with self.db.read() as s:
            active = await batch_repo.list_by_states(s, queue=QUEUE, states=ACTIVE)
            sets = await spec_repo.path_sets(s, queue=QUEUE, heads=[b.id for b in active])
        return {h: [e.id for e in ps.entries if e.status.live]
                for h, ps in sets.items() if any(e.status.live for e in ps.entries)}

    async def dispatched(self) -> list[str]:
        """The heads of every ``build`` message published, oldest first."""
        msgs = await self.broker.list_messages(m.BUILD, unsettled_only=False, limit=100)
        return [x.payload["id"] for x in reversed(msgs)]


@asynccontextmanager
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    (config,) = parse_queues(QUEUES_YAML, base_dir=tmp_path).values()
    extensions = build_extensions(config, build_scorer)
    clock = FakeClock()
    db = Database(database_url)
    try:
        async with started_broker(database_url, build_topology(), clock=clock) as broker:
            yield World(db, broker, clock,
                        Deps(db=db, broker=broker, extensions=lambda _q: extensions))
    finally:
        await db.dispose()


def wake(batch_id: str) -> Any:
    """A ``speculate`` delivery as the run reads it (payload and sequence number)."""
    return SimpleNamespace(payload={"id": batch_id, "queue": QUEUE},
                           message=SimpleNamespace(seq=10**12))


# -- two speculate runs of one queue -----------------------------------------------------


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_stale_run_that_funds_another_head_than_its_successor_loses(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 2, one slot free: batch 1 builds, batch 2 (behind it) has no path yet. Run
    A (its lease about to lapse) reads the queue and stalls; batch 3 (independent, so
    more likely than any path of batch 2) arrives; run B, A's successor, admits it and
    gives it the free slot. A then plans from its snapshot: the free slot goes to batch
    2. A writes batch 2's path set only, a row B never touched, so only a fence over
    the whole queue's plan can stop it: its write must lose (``VersionMismatch``) and
    its re-plan fund nothing. Else three builds run on a budget of two."""
    async with world(database_url, tmp_path) as w:
        await w.batch(1, BatchState.SPECULATING)
        await w.building(1, SpeculationPath(head=bid(1), dependencies=()), "build-1")
        await w.batch(2, BatchState.SPECULATING, deps=(bid(1),))
        run_a, run_b = SpeculateController(w.deps), SpeculateController(w.deps)
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        stale = asyncio.create_task(run_a.process(wake(bid(1))))
        await snapshot.reached()
        await w.batch(3, BatchState.CREATED)  # dependency_analysis created it meanwhile
        await run_b.process(wake(bid(3)))
        assert await w.live_paths() == {
            bid(1): [SpeculationPath(head=bid(1), dependencies=()).id],
            bid(3): [SpeculationPath(head=bid(3), dependencies=()).id]}
        snapshot.release()
        with pytest.raises(VersionMismatch):
            await stale
        await run_a.process(wake(bid(1)))  # the retry plans from a fresh snapshot
        live = await w.live_paths()
        assert sum(len(v) for v in live.values()) == BUDGET, live
        assert bid(2) not in live
        assert await w.dispatched() == [bid(3)]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_stale_run_that_funds_what_its_successor_funded_loses(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both runs plan the same build; the stale one's write loses and nothing is funded
    or dispatched twice."""
    async with world(database_url, tmp_path) as w:
        await w.batch(1, BatchState.SPECULATING)
        await w.batch(2, BatchState.SPECULATING, deps=(bid(1),))
        run_a, run_b = SpeculateController(w.deps), SpeculateController(w.deps)
        snapshot = hook(monkeypatch, SpeculateController, "_snapshot", pause="exit")
        stale = asyncio.create_task(run_a.process(wake(bid(1))))
        await snapshot.reached()
        await run_b.process(wake(bid(1)))
        funded = await w.live_paths()
        assert sum(len(v) for v in funded.values()) == BUDGET, funded
        snapshot.release()
        with pytest.raises(VersionMismatch):
            await stale
        await run_a.process(wake(bid(1)))
        assert await w.live_paths() == funded
        assert sorted(await w.dispatched()) == sorted(h for h, ps in funded.items() for _ in ps)


# -- two folds of one request's log (the gateway) ---------------------------------------


def status(n: int, value: str, *, version: int, at_ms: int) -> RequestLog:
    sqid = f"{QUEUE}/{n}"
    return RequestLog(queue=QUEUE, request_id=sqid, timestamp_ms=at_ms, type=LogType.STATUS,
                      status=value, request_version=version, log_id=f"{sqid}/{value}")


LANDED = status(1, "landed", version=6, at_ms=1_000)
CANCELLING = status(1, "cancelling", version=0, at_ms=2_000)  # later, but not terminal

# A fold reads the summary and writes it in one transaction; on SQLite every write
# transaction of the process takes one lock, so two folds cannot interleave there at
# all (and a test pausing inside one would only deadlock). PostgreSQL runs them side
# by side: the one that wrote second must lose its conditional write and fold again.
POSTGRES = pytest.param("postgres", id="postgres", marks=[
    pytest.mark.postgres, pytest.mark.skipif(not PG_URL, reason=PG_SKIP_REASON)])


@pytest.mark.parametrize("database_url", [POSTGRES], indirect=True)
@pytest.mark.parametrize(("paused", "other"), [(LANDED, CANCELLING), (CANCELLING, LANDED)],
                         ids=["terminal-paused", "cancelling-paused"])
async def test_two_folds_of_one_request_end_with_the_terminal_status(
    database_url: str, monkeypatch: pytest.MonkeyPatch, paused: RequestLog, other: RequestLog
) -> None:
    db = Database(database_url)
    try:
        async with db.write() as s:
            await log_repo.create_summary(s, queue=QUEUE, request_id=LANDED.request_id,
                                          change_uris=["uri-1"], received_at_ms=0)
        reading = hook(monkeypatch, log_repo, "summaries_of", pause="exit")
        writes = hook(monkeypatch, log_repo, "write_summary")
        first = asyncio.create_task(log_repo.persist_log(db, paused))
        await reading.reached()  # inside its transaction: summary read, not yet written
        await log_repo.persist_log(db, other)
        reading.release()
        await first
        assert [type(e) for e in writes.errors] == [VersionMismatch]
        async with db.read() as s:
            summary = await log_repo.get_summary(s, queue=QUEUE, request_id=LANDED.request_id)
            history = await log_repo.history(s, queue=QUEUE, request_id=LANDED.request_id)
        assert (summary.status, summary.request_version) == ("landed", 6)
        assert sorted(e.log_id for e in history) == sorted([LANDED.log_id, CANCELLING.log_id])
    finally:
        await db.dispose()

