"""Lost leases and member identity, the same on SQLite and PostgreSQL.

A stale holder is told before it acts (``Delivery.ensure_held`` raises ``LeaseLost``;
a renewal that finds the receipt stale cancels the handler) and its outcome is
discarded; a broker restarted with the same member id takes its claims back at once,
fenced, without spending an attempt (``app/queue/delivery.py``, ``members.py``).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.queue import (
    ConsumerSpec,
    Delivery,
    LeaseLost,
    TopicSpec,
    Topology,
)
from tests.conftest import BACKENDS
from tests.integration.queue_support import (
    Recorder,
    eventually,
    running,
    started_broker,
)
from tests.support.clocks import FakeClock

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


def topology(name: str, *, visibility_timeout_ms: int = 60_000, max_attempts: int = 5,
             serial: bool = True) -> Topology:
    topo = Topology()
    topo.declare(TopicSpec(name, serial=serial, visibility_timeout_ms=visibility_timeout_ms,
                           max_attempts=max_attempts))
    topo.subscribe(name, "g")
    return topo


# -- the lease-lost signal ----------------------------------------------------------


async def test_a_stale_holder_gets_lease_lost_before_its_effect_and_the_successor_runs_once(
    database_url: str,
) -> None:
    clock = FakeClock()
    effects: list[int] = []  # the "external effect": attempts that pushed
    told: list[int] = []
    frozen = asyncio.Event()

    async def push(d: Delivery) -> None:
        if d.attempt == 1:
            await frozen.wait()  # paused past the visibility timeout (no renewal ran)
        try:
            await d.ensure_held()
        except LeaseLost:
            told.append(d.attempt)
            raise
        effects.append(d.attempt)

    async with started_broker(database_url, topology("push"), clock=clock) as broker:
        await broker.publish("push", {}, partition_key="p", message_id="m")
        stale, successor = Recorder(push), Recorder(push)
        async with running(broker, [ConsumerSpec("push", "g", stale, concurrency=1)]) as first:
            await eventually(lambda: len(stale.seen) == 1, what="the first holder to start")
            clock.now += 60_001  # its lease lapsed while it was frozen
            async with running(broker, [ConsumerSpec("push", "g", successor,
                                                     concurrency=1)]) as second:
                await eventually(lambda: second.consumers[0].counters.acked == 1,
                                 what="the successor to run and ack")
                frozen.set()
                await eventually(lambda: first.consumers[0].counters.lease_lost == 1,
                                 what="the stale holder's outcome")
        assert effects == [2], "only the successor pushed"
        assert told == [1]
        assert successor.seen == [("p", "m", 2)]
        # The stale outcome was discarded: not retried, not dead-lettered, nothing left.
        assert first.consumers[0].counters.by_outcome == {"lease_lost": 1}
        (stats,) = [s for s in await broker.stats() if s.topic == "push"]
        assert (stats.groups[0].depth, stats.dlq_size) == (0, 0)


async def test_the_framework_cancels_a_handler_whose_lease_was_taken(database_url: str) -> None:
    clock = FakeClock()
    visibility_ms = 1500  # renewals every 0.5 s of real time
    cancelled = asyncio.Event()
    effects: list[int] = []

    async def blocked(d: Delivery) -> None:
        try:
            await asyncio.Event().wait()  # only a cancellation ends this
        except asyncio.CancelledError:
            cancelled.set()
            raise
        effects.append(d.attempt)

    topo = topology("slow", visibility_timeout_ms=visibility_ms)
    async with started_broker(database_url, topo, clock=clock) as broker:
        await broker.publish("slow", {}, partition_key="p", message_id="m")
        rec = Recorder(blocked)
        async with running(broker, [ConsumerSpec("slow", "g", rec, concurrency=1)]) as svc:
            await eventually(lambda: len(rec.seen) == 1, what="the handler to start")
            clock.now += visibility_ms + 1  # lapsed before the first renewal
            (successor,) = await broker.claim("g", "slow", 1)
            assert successor.attempt == 2
            await asyncio.wait_for(cancelled.wait(), timeout=5)
            await eventually(lambda: svc.consumers[0].counters.lease_lost == 1,
                             what="the lost lease to be counted")
            assert svc.consumers[0].running
            # The stale holder settled and released nothing: the successor still holds it.
            assert await broker.ack(successor)
        assert effects == []
        assert svc.consumers[0].counters.by_outcome == {"lease_lost": 1}


async def test_ensure_held_checks_the_database_and_renews_the_lease(database_url: str) -> None:
    clock = FakeClock()
    async with started_broker(database_url, topology("t", visibility_timeout_ms=10_000),
                              clock=clock) as broker:
        await broker.publish("t", {}, partition_key="p", message_id="m")
        (cd,) = await broker.claim("g", "t", 1)
        d = Delivery(broker, cd, 10_000)
        clock.now += 9_000
        await d.ensure_held()  # still ours: renewed until now + 10 s
        clock.now += 9_000
        assert await broker.claim("g", "t", 1) == [], "the renewal kept it invisible"
        clock.now += 1_001
        (successor,) = await broker.claim("g", "t", 1)
        assert not d.lease_lost  # no renewal has looked yet: only the database knows
        with pytest.raises(LeaseLost):
            await d.ensure_held()
        assert d.lease_lost
        with pytest.raises(LeaseLost):
            await d.extend()
        assert not await broker.ack(cd)
        assert await broker.ack(successor)


# -- member identity ----------------------------------------------------------------


async def test_a_restarted_member_resumes_its_claim_at_once_with_the_same_attempt(
    database_url: str,
) -> None:
    clock = FakeClock()
    topo = topology("work")
    async with started_broker(database_url, topo, clock=clock, member_id="w1") as first:
        await first.publish("work", {"n": 1}, partition_key="p", message_id="m")
        (old,) = await first.claim("g", "work", 1)
        assert old.attempt == 1
        # The process dies holding the claim (nothing settled, nothing released) and
        # comes back with the same member id, long before the visibility timeout.
        async with started_broker(database_url, topo, clock=clock, member_id="w1") as again:
            assert first.generation is not None
            assert again.generation == first.generation + 1
            (resumed,) = await again.claim("g", "work", 1)
            assert (resumed.message.message_id, resumed.attempt) == ("m", 1)
            assert resumed.lease_token != old.lease_token
            # The earlier generation's receipt is fenced: it can neither extend nor ack.
            assert not await first.extend(old, lease_ms=60_000)
            assert not await first.ack(old)
            assert await again.ack(resumed)


async def test_another_member_waits_for_the_visibility_timeout(database_url: str) -> None:
    clock = FakeClock()
    topo = topology("work")
    async with started_broker(database_url, topo, clock=clock, member_id="w1") as first:
        await first.publish("work", {}, partition_key="p", message_id="m")
        (old,) = await first.claim("g", "work", 1)
        async with started_broker(database_url, topo, clock=clock, member_id="w2") as other:
            assert await other.claim("g", "work", 1) == []
            clock.now += 59_999
            assert await other.claim("g", "work", 1) == []
            clock.now += 1  # the lease ran out
            (late,) = await other.claim("g", "work", 1)
            assert late.attempt == 2, "a lapsed lease still counts an attempt"
            assert not await first.ack(old)
            assert await other.ack(late)


async def test_only_the_first_resume_of_a_delivery_is_free(database_url: str) -> None:
    """A message that crashes its process every time still reaches the DLQ."""
    clock = FakeClock()
    topo = topology("poison", max_attempts=2)
    attempts: list[int] = []
    async with started_broker(database_url, topo, clock=clock, member_id="w1") as broker:
        await broker.publish("poison", {}, partition_key="p", message_id="m")
        attempts += [c.attempt for c in await broker.claim("g", "poison", 1)]
    for _ in range(3):  # each run claims it and dies; the next start resumes it
        async with started_broker(database_url, topo, clock=clock, member_id="w1") as broker:
            attempts += [c.attempt for c in await broker.claim("g", "poison", 1)]
    assert attempts == [1, 1, 2], "the second resume counted an attempt, the third dead-lettered"
    async with started_broker(database_url, topo, clock=clock) as broker:
        (dead,) = await broker.list_messages("poison_dlq")
        assert dead.message_id == "m" and "lease expired" in (dead.last_error or "")


async def test_a_later_start_with_the_same_member_id_fences_the_earlier_one(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="submitqueue.queue")
    clock = FakeClock()
    topo = topology("work")
    async with started_broker(database_url, topo, clock=clock, member_id="dup",
                              member_heartbeat_ms=50) as first:
        await first.publish("work", {}, partition_key="p", message_id="m")
        (old,) = await first.claim("g", "work", 1)
        async with started_broker(database_url, topo, clock=clock, member_id="dup",
                                  member_heartbeat_ms=50) as second:
            started = [r for r in caplog.records if "did not stop" in r.getMessage()]
            assert [r.levelno for r in started] == [logging.WARNING]
            membership = first.membership
            assert membership is not None
            await eventually(lambda: membership.superseded_by is not None,
                             what="the earlier process to notice")
            assert membership.superseded_by is not None
            assert membership.superseded_by.generation == second.generation
            assert any(r.levelno == logging.WARNING and "superseded" in r.getMessage()
                       for r in caplog.records)
            (taken,) = await second.claim("g", "work", 1)
            assert taken.attempt == 1
            assert not await first.ack(old)
            assert await second.ack(taken)


async def test_a_restart_after_a_clean_stop_does_not_warn(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="submitqueue.queue")
    clock = FakeClock()
    topo = topology("work")
    async with started_broker(database_url, topo, clock=clock, member_id="w1") as first:
        await first.publish("work", {}, partition_key="p", message_id="m")
        (old,) = await first.claim("g", "work", 1)
    async with started_broker(database_url, topo, clock=clock, member_id="w1") as again:
        (resumed,) = await again.claim("g", "work", 1)
        assert resumed.attempt == 1 and resumed.lease_token != old.lease_token
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("resumed" in r.getMessage() for r in caplog.records)
