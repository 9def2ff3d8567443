"""The controllers with external effects act only while their delivery holds its lease.

A merge (push) or build (trigger) whose lease lapsed and was claimed by a successor
raises ``LeaseLost`` before the effect; the successor performs it once. Real database
rows and queue, fake merger and runner that record their calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from app.controllers.build import BuildController
from app.controllers.common import Deps
from app.controllers.merge import MergeController
from app.controllers.pipeline import TopicSettings, build_topology
from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, LandRequest, PathEntry, PathSet, SpeculationPath
from app.domain.messages import BUILD, MERGE, ORCHESTRATOR_GROUP, BuildMsg, EntityMsg
from app.domain.states import BatchState, LandStrategy, PathStatus, RequestState
from app.extensions.base import (
    BuildReport,
    BuildRequest,
    MergeOutcome,
    MergeSpec,
    QueueExtensions,
)
from app.queue import Broker, ClaimedDelivery, Delivery, LeaseLost
from tests.conftest import BACKENDS
from tests.integration.queue_support import started_broker
from tests.support.clocks import FakeClock

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

VISIBILITY_MS = 60_000
QUEUE, SQID, BATCH_ID = "demo", "demo/1", "demo/batch/1"


class RecordingMerger:
    def __init__(self) -> None:
        self.pushes: list[str] = []

    async def check(self, spec: MergeSpec) -> MergeOutcome:
        return MergeOutcome(succeeded=True)

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        self.pushes.append(spec.id)
        return MergeOutcome(succeeded=True)


class RecordingRunner:
    def __init__(self) -> None:
        self.triggers: list[str] = []

    async def trigger(self, request: BuildRequest) -> str:
        self.triggers.append(request.path_id)
        return f"build-{len(self.triggers)}"

    async def status(self, build_id: str) -> BuildReport:
        raise NotImplementedError

    async def cancel(self, build_id: str) -> None:
        return None


@dataclass
class World:
    broker: Broker
    clock: FakeClock
    deps: Deps
    merger: RecordingMerger = field(default_factory=RecordingMerger)
    runner: RecordingRunner = field(default_factory=RecordingRunner)

    async def stale_and_successor(self, topic: str) -> tuple[ClaimedDelivery, ClaimedDelivery]:
        """The first claim lapses (its holder froze) and a successor claims the message."""
        (stale,) = await self.broker.claim(ORCHESTRATOR_GROUP, topic, 1)
        self.clock.now += VISIBILITY_MS + 1
        (successor,) = await self.broker.claim(ORCHESTRATOR_GROUP, topic, 1)
        assert successor.attempt == stale.attempt + 1
        return stale, successor


@asynccontextmanager
async def world(database_url: str, batch_state: BatchState) -> AsyncIterator[World]:
    clock = FakeClock()
    db = Database(database_url)
    topology = build_topology(TopicSettings(visibility_timeout_ms=VISIBILITY_MS))
    try:
        async with db.write() as s:
            await request_repo.create(s, request=LandRequest(
                queue=QUEUE, id=SQID, change_uris=("git://example.com/r/refs%2Fheads%2Fa/1",),
                strategy=LandStrategy.REBASE, state=RequestState.BATCHED, version=1),
                now_ms=clock.now)
            await batch_repo.create(s, batch=Batch(
                queue=QUEUE, id=BATCH_ID, contains=(SQID,), dependencies=(), state=batch_state,
                version=1), now_ms=clock.now)
        async with started_broker(database_url, topology, clock=clock) as broker:
            merger, runner = RecordingMerger(), RecordingRunner()
            extensions = QueueExtensions(
                provider=cast(Any, None), analyzer=cast(Any, None), runner=runner,
                merger=merger, scorer=cast(Any, None), build_budget=1)
            deps = Deps(db=db, broker=broker, extensions=lambda _queue: extensions)
            yield World(broker, clock, deps, merger, runner)
    finally:
        await db.dispose()


async def test_merge_does_not_push_when_its_lease_was_lost(database_url: str) -> None:
    async with world(database_url, BatchState.MERGING) as w:
        await w.broker.publish(MERGE, EntityMsg(id=BATCH_ID, queue=QUEUE).model_dump(),
                               partition_key=QUEUE, message_id=BATCH_ID)
        stale, successor = await w.stale_and_successor(MERGE)
        controller = MergeController(w.deps)
        with pytest.raises(LeaseLost):
            await controller.process(Delivery(w.broker, stale, VISIBILITY_MS))
        assert w.merger.pushes == [], "the stale holder pushed"
        await controller.process(Delivery(w.broker, successor, VISIBILITY_MS))
        assert w.merger.pushes == [BATCH_ID]


async def test_build_does_not_trigger_when_its_lease_was_lost(database_url: str) -> None:
    async with world(database_url, BatchState.SPECULATING) as w:
        path = SpeculationPath(head=BATCH_ID, dependencies=())
        async with w.deps.db.write() as s:
            await spec_repo.save_path_set(s, old=PathSet(queue=QUEUE, head=BATCH_ID), new=PathSet(
                queue=QUEUE, head=BATCH_ID, version=1,
                entries=(PathEntry(path=path, status=PathStatus.PENDING, attempt=1),)))
        msg = BuildMsg(id=BATCH_ID, queue=QUEUE, path_id=path.id, attempt=1)
        await w.broker.publish(BUILD, msg.model_dump(), partition_key=BATCH_ID,
                               message_id=f"{path.id}/1")
        stale, successor = await w.stale_and_successor(BUILD)
        controller = BuildController(w.deps)
        with pytest.raises(LeaseLost):
            await controller.process(Delivery(w.broker, stale, VISIBILITY_MS))
        assert w.runner.triggers == [], "the stale holder triggered a build"
        await controller.process(Delivery(w.broker, successor, VISIBILITY_MS))
        assert w.runner.triggers == [path.id]
