"""Delivery semantics of the durable queue, run the same on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import ClassVar

import pytest

from app.queue import (
    Backoff,
    Broker,
    ConsumerSpec,
    Delivery,
    NonRetryable,
    Outgoing,
    Retryable,
    TopicSpec,
)
from tests.conftest import BACKENDS
from tests.integration.queue_support import (
    ClaimWatch,
    Recorder,
    drained,
    eventually,
    running,
    started_broker,
    topology,
)
from tests.support.clocks import FakeClock

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


async def publish_interleaved(
    broker: Broker, topic: str, partitions: int, per: int
) -> dict[str, list[str]]:
    expected: dict[str, list[str]] = defaultdict(list)
    for i in range(per):
        for p in range(partitions):
            mid = f"m{p}-{i}"
            await broker.publish(topic, {"i": i}, partition_key=f"p{p}", message_id=mid)
            expected[f"p{p}"].append(mid)
    return expected


@pytest.mark.parametrize("serial", [True, False], ids=["serial", "parallel"])
async def test_per_partition_order(database_url: str, serial: bool) -> None:
    topo = topology(TopicSpec("orders", serial=serial))
    async with started_broker(database_url, topo) as broker:
        expected = await publish_interleaved(broker, "orders", partitions=4, per=15)
        rec = Recorder(lambda d: asyncio.sleep(random.random() / 500))
        async with running(broker, [ConsumerSpec("orders", "g", rec, concurrency=6)]):
            await eventually(lambda: len(rec.seen) >= 60, what="60 deliveries")
        got: dict[str, list[str]] = defaultdict(list)
        for pk, mid, _ in rec.seen:
            got[pk].append(mid)
        assert dict(got) == dict(expected)


async def test_serial_partition_never_has_two_in_flight(database_url: str) -> None:
    topo = topology(TopicSpec("serial", serial=True))
    in_flight: dict[str, int] = defaultdict(int)
    max_per_partition: dict[str, int] = defaultdict(int)
    total = {"now": 0, "max": 0}

    async def behaviour(d: Delivery) -> None:
        in_flight[d.partition_key] += 1
        total["now"] += 1
        max_per_partition[d.partition_key] = max(
            max_per_partition[d.partition_key], in_flight[d.partition_key]
        )
        total["max"] = max(total["max"], total["now"])
        await asyncio.sleep(0.005)
        in_flight[d.partition_key] -= 1
        total["now"] -= 1

    async with started_broker(database_url, topo) as broker:
        await publish_interleaved(broker, "serial", partitions=5, per=8)
        rec = Recorder(behaviour)
        async with running(broker, [ConsumerSpec("serial", "g", rec, concurrency=10)]):
            await eventually(lambda: len(rec.seen) >= 40, what="40 deliveries")
    assert max(max_per_partition.values()) == 1
    assert total["max"] > 1, "partitions should run in parallel"


async def test_duplicate_publish_is_stored_once_also_after_consumption(database_url: str) -> None:
    topo = topology(TopicSpec("dedupe"))
    async with started_broker(database_url, topo) as broker:
        first = await broker.publish("dedupe", {"v": 1}, partition_key="p", message_id="same")
        again = await broker.publish("dedupe", {"v": 2}, partition_key="p", message_id="same")
        assert first.created and not again.created
        rec = Recorder()
        async with running(broker, [ConsumerSpec("dedupe", "g", rec)]):
            await eventually(lambda: len(rec.seen) == 1, what="one delivery")
            after = await broker.publish("dedupe", {"v": 3}, partition_key="p",
                                         message_id="same")
            other_pk = await broker.publish("dedupe", {"v": 4}, partition_key="q",
                                            message_id="same")
            await eventually(lambda: len(rec.seen) == 2, what="the other partition's message")
            # Every stored message was delivered and settled: a duplicate would be seen.
            await eventually(lambda: drained(broker, "dedupe"), what="dedupe drained")
        assert not after.created
        assert other_pk.created
        assert rec.ids() == ["same", "same"]
        assert [pk for pk, _, _ in rec.seen] == ["p", "q"]
        stored = await broker.find_messages("dedupe", "same")
        assert [m.payload for m in stored] == [{"v": 1}, {"v": 4}]


async def test_redelivery_after_lost_lease(database_url: str) -> None:
    topo = topology(TopicSpec("lease", visibility_timeout_ms=300, max_attempts=5))
    clock = FakeClock()
    async with started_broker(database_url, topo, clock=clock) as broker:
        await broker.publish("lease", {}, partition_key="p", message_id="m")
        first = await broker.claim("g", "lease", 10)
        assert [c.attempt for c in first] == [1]
        assert await broker.claim("g", "lease", 10) == []  # invisible while leased
        clock.now += 299
        assert await broker.claim("g", "lease", 10) == []  # still leased, 1 ms before
        clock.now += 2  # the "crashed" holder never settles: its lease is past
        second = await broker.claim("g", "lease", 10)
        assert [c.attempt for c in second] == [2]
        assert not await broker.ack(first[0]), "a stale lease cannot settle the message"
        assert await broker.ack(second[0])


async def test_lease_is_extended_while_the_handler_runs(database_url: str) -> None:
    topo = topology(TopicSpec("slow", visibility_timeout_ms=300))

    async with started_broker(database_url, topo) as broker:
        rec = Recorder(lambda d: asyncio.sleep(1.0))
        await broker.publish("slow", {}, partition_key="p", message_id="m")
        async with running(broker, [ConsumerSpec("slow", "g", rec)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.acked == 1, timeout=5)
        assert rec.seen == [("p", "m", 1)]


async def test_hold_spends_no_attempt_and_blocks_its_partition(database_url: str) -> None:
    topo = topology(TopicSpec("poll", serial=False))
    holds = {"n": 0}

    async def behaviour(d: Delivery) -> None:
        if d.message_id == "a" and holds["n"] < 2:
            holds["n"] += 1
            d.hold(150)

    async with started_broker(database_url, topo) as broker:
        rec = Recorder(behaviour)
        await broker.publish("poll", {}, partition_key="p", message_id="a")
        async with running(broker, [ConsumerSpec("poll", "g", rec, concurrency=4)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.held == 1, what="a's first hold")
            await broker.publish("poll", {}, partition_key="p", message_id="b")
            await broker.publish("poll", {}, partition_key="q", message_id="c")
            await eventually(lambda: "b" in rec.ids(), what="b after a's holds")
    order = rec.ids()
    assert order.index("c") < order.index("b"), "another partition is not blocked"
    assert [x for x in order if x in "ab"] == ["a", "a", "a", "b"]
    assert [att for _, m, att in rec.seen if m == "a"] == [1, 1, 1]


async def test_retries_then_dead_letters_with_error_and_attempts(database_url: str) -> None:
    topo = topology(TopicSpec("flaky", max_attempts=3, backoff=Backoff(10, 40)))

    async def behaviour(d: Delivery) -> None:
        raise Retryable(f"dependency down (attempt {d.attempt})")

    async with started_broker(database_url, topo) as broker:
        await broker.publish("flaky", {"x": 1}, partition_key="p", message_id="m",
                             metadata={"trace": "t1"})
        rec = Recorder(behaviour)
        async with running(broker, [ConsumerSpec("flaky", "g", rec)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.dead_lettered == 1)
        assert [a for _, _, a in rec.seen] == [1, 2, 3]
        dead = await broker.list_messages("flaky_dlq")
        assert len(dead) == 1
        d = dead[0]
        assert (d.message_id, d.partition_key, d.payload) == ("m", "p", {"x": 1})
        assert d.original_topic == "flaky" and d.source_group == "g"
        assert d.failure_count == 3
        assert d.last_error == "Retryable: dependency down (attempt 3)"
        assert d.metadata == {"trace": "t1"}
        assert d.failure_detail is not None and d.failure_detail["reason"] == "attempts-exhausted"
        stats = {s.topic: s for s in await broker.stats()}
        assert stats["flaky"].dlq_size == 1
        assert stats["flaky"].groups[0].depth == 0


async def test_non_retryable_error_dead_letters_at_once(database_url: str) -> None:
    topo = topology(TopicSpec("strict", max_attempts=5))

    async def behaviour(d: Delivery) -> None:
        raise ValueError("cannot decode payload")

    async with started_broker(database_url, topo) as broker:
        await broker.publish("strict", {}, partition_key="p", message_id="m")
        rec = Recorder(behaviour)
        async with running(broker, [ConsumerSpec("strict", "g", rec)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.dead_lettered == 1)
        assert len(rec.seen) == 1
        (dead,) = await broker.list_messages("strict_dlq")
        assert dead.failure_count == 1
        assert dead.last_error == "ValueError: cannot decode payload"
        assert dead.failure_detail and dead.failure_detail["retryable"] is False


async def test_a_crash_looping_message_is_dead_lettered_by_claim(database_url: str) -> None:
    topo = topology(TopicSpec("crashy", visibility_timeout_ms=100, max_attempts=2))
    clock = FakeClock()
    async with started_broker(database_url, topo, clock=clock) as broker:
        await broker.publish("crashy", {}, partition_key="p", message_id="m")
        for attempt in (1, 2):
            (c,) = await broker.claim("g", "crashy", 1)
            assert c.attempt == attempt
            clock.now += 101  # the handler "dies" each time: its lease runs out
        assert await broker.claim("g", "crashy", 1) == []
        (dead,) = await broker.list_messages("crashy_dlq")
        assert "lease expired" in (dead.last_error or "")


async def test_requeue_and_discard_dead_letters(database_url: str) -> None:
    topo = topology(TopicSpec("work", max_attempts=1))
    fixed = {"ok": False}

    async def behaviour(d: Delivery) -> None:
        if not fixed["ok"]:
            raise NonRetryable(RuntimeError("bug"))

    async with started_broker(database_url, topo) as broker:
        await broker.publish("work", {"n": 1}, partition_key="p", message_id="one")
        await broker.publish("work", {"n": 2}, partition_key="p", message_id="two")
        rec = Recorder(behaviour)
        async with running(broker, [ConsumerSpec("work", "g", rec)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.dead_lettered == 2)
            dead = {m.message_id: m for m in await broker.list_messages("work_dlq")}
            assert set(dead) == {"one", "two"}
            fixed["ok"] = True
            requeued = await broker.requeue("work_dlq", dead["one"].seq)
            assert requeued.message_id == "one"
            await eventually(lambda: svc.consumers[0].counters.acked == 1)
            discarded = await broker.discard("work_dlq", dead["two"].seq, reason="bad input")
            assert discarded.message_id == "two"
        assert [(m, a) for _, m, a in rec.seen][-1] == ("one", 1)
        assert await broker.list_messages("work_dlq") == []
        stats = {s.topic: s for s in await broker.stats()}
        assert stats["work"].dlq_size == 0
        # The requeued message kept its identity: publishing it again is a duplicate.
        assert not (await broker.publish("work", {}, partition_key="p", message_id="one")).created


async def test_pause_and_resume_a_consumer_and_a_partition(database_url: str) -> None:
    topo = topology(TopicSpec("gated"))
    async with started_broker(database_url, topo) as broker:
        rec = Recorder()
        watch = ClaimWatch(broker)
        async with running(broker, [ConsumerSpec("gated", "g", rec)]):
            await broker.pause("g", "gated", reason="maintenance")
            await broker.publish("gated", {}, partition_key="p", message_id="a")
            # A claim that began after the publish finished: the loop had its chance at a.
            await watch.claimed_since("gated", watch.mark("gated"))
            assert watch.handed_out["gated"] == []
            assert rec.seen == []
            stats = {s.topic: s for s in await broker.stats()}
            assert stats["gated"].groups[0].paused and stats["gated"].groups[0].depth == 1
            await broker.resume("g", "gated")
            await eventually(lambda: rec.ids() == ["a"])
            await broker.pause("g", "gated", "p")
            await broker.publish("gated", {}, partition_key="p", message_id="b")
            await broker.publish("gated", {}, partition_key="q", message_id="c")
            since = watch.mark("gated")
            await eventually(lambda: "c" in rec.ids())
            # c was published after b; a claim after c was seen had its chance at b too.
            await watch.claimed_since("gated", since)
            assert "b" not in watch.handed_out["gated"]
            assert "b" not in rec.ids()
            await broker.resume("g", "gated", "p")
            await eventually(lambda: "b" in rec.ids())


async def test_consumer_groups_are_independent(database_url: str) -> None:
    topo = topology(TopicSpec("fanout", max_attempts=1), groups=("audit", "worker"))

    async def fail(d: Delivery) -> None:
        raise RuntimeError("worker is broken")

    async with started_broker(database_url, topo) as broker:
        audit, worker = Recorder(), Recorder(fail)
        for i in range(5):
            await broker.publish("fanout", {"i": i}, partition_key="p", message_id=f"m{i}")
        async with running(broker, [ConsumerSpec("fanout", "audit", audit),
                                    ConsumerSpec("fanout", "worker", worker)]) as svc:
            await eventually(lambda: svc.consumers[0].counters.acked == 5)
            await eventually(lambda: svc.consumers[1].counters.dead_lettered == 5)
        assert audit.ids() == [f"m{i}" for i in range(5)]
        dead = await broker.list_messages("fanout_dlq")
        assert {d.source_group for d in dead} == {"worker"}
        stats = {s.topic: s for s in await broker.stats()}
        assert {g.consumer_group: g.depth for g in stats["fanout"].groups} == {
            "audit": 0, "worker": 0}


async def test_a_failing_controller_never_stops_its_loop(database_url: str) -> None:
    topo = topology(TopicSpec("robust", max_attempts=1))

    async def behaviour(d: Delivery) -> None:
        kind = d.payload["kind"]
        if kind == "type":
            raise TypeError("bad")
        if kind == "key":
            raise KeyError("missing")
        if kind == "timeout":
            raise TimeoutError()

    async with started_broker(database_url, topo) as broker:
        rec = Recorder(behaviour)
        async with running(broker, [ConsumerSpec("robust", "g", rec, concurrency=1)]) as svc:
            for i, kind in enumerate(["type", "key", "timeout", "ok"]):
                await broker.publish("robust", {"kind": kind}, partition_key="p",
                                     message_id=f"m{i}")
            await eventually(lambda: svc.consumers[0].counters.acked == 1)
            assert svc.consumers[0].counters.dead_lettered == 3


async def test_shutdown_releases_unfinished_work_without_spending_an_attempt(
    database_url: str,
) -> None:
    topo = topology(TopicSpec("long"))
    async with started_broker(database_url, topo) as broker:
        await broker.publish("long", {}, partition_key="p", message_id="m")
        rec = Recorder(lambda d: asyncio.sleep(30))
        async with running(broker, [ConsumerSpec("long", "g", rec)], shutdown_grace_ms=100):
            await eventually(lambda: len(rec.seen) == 1)
        (again,) = await broker.claim("g", "long", 1)
        assert again.attempt == 1


async def test_publish_wakes_consumers_without_waiting_for_a_poll(database_url: str) -> None:
    topo = topology(TopicSpec("fast"))
    async with started_broker(database_url, topo) as broker:
        rec = Recorder()
        watch = ClaimWatch(broker)
        async with running(broker, [ConsumerSpec("fast", "g", rec)], poll_interval_ms=10_000):
            # Its first claim found nothing: the loop is now idle, waiting up to 10 s.
            await watch.claimed_since("fast", 0)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await broker.publish("fast", {}, partition_key="p", message_id="m")
            await eventually(lambda: len(rec.seen) == 1, timeout=5)
            assert loop.time() - t0 < 1.0


async def test_garbage_collection_removes_only_settled_old_messages(database_url: str) -> None:
    topo = topology(TopicSpec("gc", max_attempts=1))
    clock = FakeClock()
    async with started_broker(database_url, topo, clock=clock) as broker:
        await broker.publish_many([
            Outgoing("gc", {}, "p", "done"), Outgoing("gc", {}, "p", "fails"),
            Outgoing("gc", {}, "q", "pending"),
        ])
        (done, fails) = await broker.claim("g", "gc", 2)
        await broker.ack(done)
        await broker.dead_letter(fails, error="x")
        assert await broker.collect_garbage(retention_ms=10_000) == 0
        clock.now += 1  # both settled before the cutoff of a zero retention
        removed = await broker.collect_garbage(retention_ms=0)
        assert removed == 2  # "done" and the moved original of "fails"
        assert (await broker.publish("gc", {}, partition_key="p", message_id="done")).created
        assert len(await broker.list_messages("gc_dlq")) == 1
        assert [m.message_id for m in await broker.list_messages("gc")] == ["done", "pending"]


async def test_an_errors_subjects_are_stored_with_its_dead_letter(database_url: str) -> None:
    """The framework reads ``subjects`` off any exception, like ``retryable``."""
    topo = topology(TopicSpec("attributed", max_attempts=5))

    class About(Exception):
        retryable = False
        subjects: ClassVar = [{"type": "batch", "id": "q/batch/2", "reason": "why"}]

    async def behaviour(d: Delivery) -> None:
        raise About("planner bug")

    async with started_broker(database_url, topo) as broker:
        await broker.publish("attributed", {}, partition_key="p", message_id="m")
        async with running(broker, [ConsumerSpec("attributed", "g", Recorder(behaviour))]) \
                as svc:
            await eventually(lambda: svc.consumers[0].counters.dead_lettered == 1)
        (dead,) = await broker.list_messages("attributed_dlq")
        assert dead.failure_detail is not None
        assert dead.failure_detail["subjects"] == About.subjects


async def test_latest_seq_is_the_highest_number_stored(database_url: str) -> None:
    topo = topology(TopicSpec("a"), TopicSpec("b"))
    async with started_broker(database_url, topo) as broker:
        assert await broker.latest_seq() == 0
        first = await broker.publish("a", {}, partition_key="p", message_id="m1")
        assert await broker.latest_seq() == first.seq
        second = await broker.publish("b", {}, partition_key="x", message_id="m2")
        assert first.seq is not None and second.seq is not None and second.seq > first.seq
        assert await broker.latest_seq() == second.seq  # over every topic
        again = await broker.publish("a", {}, partition_key="p", message_id="m1")
        assert not again.created and await broker.latest_seq() == second.seq
