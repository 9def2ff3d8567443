"""Speculation can be trusted (issue #12, items 4 and 6), end to end on the real app:

- a plan rejected because of one batch fails that batch only, whichever batch the
  dead-lettered message named;
- a wake-up stamped by a publisher whose clock is 300 ms behind is not coalesced away
  (coalescing uses the queue's sequence numbers, not clocks);
- the periodic resync alone unsticks a queue whose wake-up was lost;
- the scheduler starts and stops with the runtime, and two runtimes on one PostgreSQL
  store one resync wake-up per queue per interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import app.controllers.speculate as speculate_module
from app.controllers.common import Deps
from app.db.repos import batches as batch_repo
from app.domain import messages as m
from app.domain.entities import PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.queue import Broker, PublishResult, StoredMessage
from app.speculation.planner import Plan, PlanInput
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.support.races import until

pytestmark = pytest.mark.timeout(120)

QUEUES = """
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 2
"""


def controller(server: Server, topic: str) -> Any:
    return next(c.spec.controller for c in server.runtime.consumers.consumers
                if c.spec.topic == topic and c.spec.group == m.ORCHESTRATOR_GROUP)


async def batch_of(server: Server, sqid: str) -> str:
    await server.wait_status(sqid, {"speculating"})
    return str((await server.summary(sqid))["metadata"]["batch_id"])


async def build_running(server: Server, sqid: str) -> bool:
    return any(e.get("event") == "building" and e["metadata"].get("build_status") == "running"
               for e in await server.history(sqid))


async def _batch_is(server: Server, sqid: str, state: str) -> bool:
    async with server.runtime.db.read() as s:
        found = await batch_repo.for_request(s, queue="demo", request_id=sqid)
    return bool(found) and found[-1].state == state


async def speculate_messages(server: Server, *, unsettled: bool) -> list[StoredMessage]:
    return await server.runtime.broker.list_messages(m.SPECULATE, unsettled_only=unsettled,
                                                     limit=1000)


# -- item 4: a plan error fails only the batches it is about --------------------------


@dataclass
class PlanCorruptor:
    """Wraps the real planner; while ``about`` speculates with a stored path, every plan
    gives it one path more than the budget allows (a deterministic planner bug)."""

    about: str
    extra: SpeculationPath
    armed: bool = False
    fired: int = 0

    def __post_init__(self) -> None:
        self.real = speculate_module.plan

    def __call__(self, inp: PlanInput, *, linked: Callable[[PathEntry], bool]) -> Plan:
        out = self.real(inp, linked=linked)
        b = inp.batches.get(self.about)
        if not self.armed or b is None or b.state is not BatchState.SPECULATING \
                or not inp.entries.get(self.about):
            return out
        self.fired += 1
        mine = out.entries.get(self.about, tuple(inp.entries[self.about]))
        return replace(out, entries={**out.entries, self.about: (
            *mine, PathEntry(self.extra, PathStatus.PENDING))})


@pytest.mark.slow
@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_plan_rejected_because_of_batch_2_on_batch_1s_message_fails_batch_2_only(
        database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, queue_max_attempts=2,
                     speculate_resync_ms=0) as server:
        broker = server.runtime.broker
        first = await server.land(change("first", files="one/a.py", build_ms=1500))
        second = await server.land(change("second", files="two/b.py", build_ms=120_000))
        b1, b2 = await batch_of(server, first), await batch_of(server, second)
        async def both_running() -> bool:
            return await build_running(server, first) and await build_running(server, second)

        async def drained() -> bool:
            return not await speculate_messages(server, unsettled=True)

        await until("both builds running", both_running)
        # Nothing more reaches speculate on its own: hold the build signals, wait until
        # the speculate topic is drained, then wake the queue with batch 1's message.
        await broker.pause(m.ORCHESTRATOR_GROUP, m.BUILDSIGNAL)
        await until("speculate drained", drained)
        bug = PlanCorruptor(b2, SpeculationPath(b2, ((b1, Assumption.SUCCEEDS),)))
        monkeypatch.setattr(speculate_module, "plan", bug)
        bug.armed = True
        await broker.publish(m.SPECULATE, {"id": b1, "queue": "demo"}, partition_key="demo",
                             message_id=f"{b1}/test-wake-up")

        assert await server.wait_terminal(second) == "error"
        reason = (await server.summary(second))["last_error"]
        assert reason.startswith("dead-lettered from speculate after 1 attempt: speculation "
                                 "plan rejected: 3 live paths would exceed the build budget 2"), \
            reason
        (dead,) = [d for d in await broker.list_messages("speculate_dlq", unsettled_only=False)
                   if d.payload["id"] == b1]  # it arrived on batch 1's message
        assert dead.failure_detail is not None and dead.failure_count == 1  # not retried
        assert [(s["type"], s["id"]) for s in dead.failure_detail["subjects"]] == \
            [("batch", b2), ("queue", "demo")]

        await broker.resume(m.ORCHESTRATOR_GROUP, m.BUILDSIGNAL)
        assert await server.wait_terminal(first) == "landed"
        assert (await server.summary(first))["last_error"] == ""
        # Batch 1's message was rejected once and not retried (failure_count 1 above); a
        # wake-up that reached speculate before the reconciler failed batch 2 meets the
        # same planner bug and is counted too (seen once on a loaded machine: 2).
        assert bug.fired >= 1


# -- item 6: no stall under clock skew, and a resync for lost wake-ups ---------------


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_wake_up_from_a_publisher_300ms_behind_is_not_dropped(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, speculate_resync_ms=0) as server:
        rt = server.runtime
        # This process's clock stands still (so the outcome does not depend on how fast
        # the machine is); the build signals are published by a clock 300 ms behind it.
        now = rt.broker.clock()
        rt.broker.clock = lambda: now
        behind = Broker(rt.broker.backend, rt.broker.topology, clock=lambda: now - 300)
        controller(server, m.BUILDSIGNAL).deps = replace(rt.deps, broker=behind)
        try:
            sqid = await server.land(change("skewed", files="s/a.py"))
            # (all log entries carry one timestamp now, so the summary shows `accepted`
            # until the versioned `landed`: watch the batch instead)
            await until("the batch merged", lambda: _batch_is(server, sqid, "succeeded"))
            assert await server.wait_terminal(sqid) == "landed"
        finally:
            await behind.close()
        signals = [s for s in await speculate_messages(server, unsettled=False)
                   if "/build-signal/" in s.message_id]
        assert signals and all(s.published_at_ms == now - 300 for s in signals)


@dataclass
class LosesWakeUps(Deps):
    """A publisher whose ``speculate`` wake-ups are lost (a bug, a discard, a crash)."""

    lost: list[str] = field(default_factory=list)

    async def publish(self, topic: str, msg: BaseModel, *,
                      message_id: str) -> PublishResult:
        if topic == m.SPECULATE:
            self.lost.append(message_id)
            return PublishResult(seq=None, created=False)
        return await super().publish(topic, msg, message_id=message_id)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_the_resync_alone_unsticks_a_queue_whose_wake_up_was_lost(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, speculate_resync_ms=300) as server:
        rt = server.runtime
        losing = LosesWakeUps(db=rt.deps.db, broker=rt.deps.broker,
                              extensions=rt.deps.extensions, metrics=rt.deps.metrics)
        controller(server, m.BUILDSIGNAL).deps = losing
        sqid = await server.land(change("lost", files="l/a.py"))
        assert await server.wait_terminal(sqid, timeout=30) == "landed"
        assert any("/build-signal/" in i for i in losing.lost)  # the passed build's
        resyncs = [s for s in await speculate_messages(server, unsettled=False)
                   if s.message_id.startswith("demo/resync/")]
        assert resyncs and rt.resync is not None and rt.resync.published == len(resyncs)


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_the_scheduler_starts_and_stops_with_the_runtime(
        database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path, speculate_resync_ms=200) as server:
        rt = server.runtime
        assert rt.scheduler.running
        assert rt.scheduler.jobs[:5] == ["metrics-refresh", "stall-check", "speculate-resync",
                                         "outage-notify", "queue-gc"]
        await until("a resync ran", lambda: _true(rt.scheduler.runs.get("speculate-resync")))
        assert rt.resync is not None and rt.resync.published == 0  # no active batch
    assert not rt.scheduler.running and not rt.scheduler._in_progress
    async with serve(database_url, tmp_path, speculate_resync_ms=0) as server:
        jobs = server.runtime.scheduler.jobs
        assert "speculate-resync" not in jobs and server.runtime.resync is None
    async with serve(database_url, tmp_path, role="gateway") as server:
        # the workers resync, collect the queue's garbage and beat for their builds; every
        # role checks for stalls (its pages and /metrics show them)
        assert server.runtime.scheduler.jobs == ["metrics-refresh", "stall-check"]


async def _true(value: object) -> bool:
    return bool(value)


@pytest.mark.slow
@pytest.mark.parametrize("database_url", BACKENDS[1:], indirect=True)
async def test_two_runtimes_on_one_postgres_store_one_resync_per_queue_per_interval(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, speculate_resync_ms=300) as one, \
            serve(database_url, tmp_path, speculate_resync_ms=300) as two:
        sqid = await one.land(change("long", files="x/a.py", build_ms=120_000))
        await one.wait_status(sqid, {"speculating"})
        jobs = [one.runtime.resync, two.runtime.resync]
        assert jobs[0] is not None and jobs[1] is not None
        start = [j.published + j.duplicates for j in jobs]
        await until("both processes resynced 4 times", lambda: _true(all(
            j.published + j.duplicates - s >= 4 for j, s in zip(jobs, start, strict=True))))
        ids = [s.message_id for s in await speculate_messages(one, unsettled=False)
               if s.message_id.startswith("demo/resync/")]
        buckets = [int(i.rsplit("/", 1)[1]) for i in ids]
        assert len(buckets) == len(set(buckets))  # one wake-up per interval, not per process
        assert sum(j.published for j in jobs) == len(ids)
        assert sum(j.duplicates for j in jobs) >= 3  # the other process had stored it
        assert await one.wait_status(sqid, {"speculating"}) == "speculating"
