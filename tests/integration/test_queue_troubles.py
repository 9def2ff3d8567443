"""``Broker.troubles()``: the unsettled messages that failed at least once, read in one
statement, on SQLite and PostgreSQL — a retry waiting and running, a hold that is not a
retry, a dead letter waiting for its reconciler, the same with the reconciler paused, and
one parked; settled work and first attempts are not troubles."""

from __future__ import annotations

import pytest

from app.queue import Backoff, TopicSpec
from tests.conftest import BACKENDS
from tests.integration.queue_support import started_broker, topology
from tests.support.clocks import FakeClock

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


async def test_retrying_then_dead_lettered_then_paused_then_parked(database_url: str) -> None:
    topo = topology(TopicSpec("flaky", max_attempts=3, backoff=Backoff(10, 40)),
                    TopicSpec("calm"))
    topo.subscribe("flaky_dlq", "fixers")
    clock = FakeClock()
    async with started_broker(database_url, topo, clock=clock) as broker:
        await broker.publish("flaky", {"id": "q/1", "queue": "q"}, partition_key="p",
                             message_id="m1")
        await broker.publish("calm", {"id": "q/2", "queue": "q"}, partition_key="p",
                             message_id="m2")
        assert await broker.troubles() == []
        [first] = await broker.claim("g", "flaky", 1)
        [calm] = await broker.claim("g", "calm", 1)
        assert await broker.troubles() == []  # first attempts under way are no trouble
        await broker.hold(calm, delay_ms=1000)
        assert await broker.retry(first, delay_ms=5000, error="Boom: attempt 1")

        [t] = await broker.troubles()
        assert (t.state, t.topic, t.attempts, t.max_attempts) == ("retrying", "flaky", 1, 3)
        assert t.last_error == "Boom: attempt 1" and not t.running
        assert t.next_attempt_ms == clock.now + 5000
        assert t.payload == {"id": "q/1", "queue": "q"} and not t.needs_operator

        clock.now += 5000
        [second] = await broker.claim("g", "flaky", 1)
        [t] = await broker.troubles()
        assert t.state == "retrying" and t.running and t.attempts == 2
        assert t.next_attempt_ms is None

        assert await broker.dead_letter(second, error="Boom: attempt 2", detail={})
        [t] = await broker.troubles()
        assert (t.state, t.topic, t.dlq_topic, t.attempts) == (
            "dead_lettered", "flaky", "flaky_dlq", 2)
        assert t.last_error == "Boom: attempt 2" and t.failed_at_ms == clock.now
        assert not t.parked and not t.reconciler_paused and not t.needs_operator

        await broker.pause("fixers", "flaky_dlq", reason="look first")
        [t] = await broker.troubles()
        assert t.reconciler_paused and t.needs_operator

        await broker.resume("fixers", "flaky_dlq")
        [fix] = await broker.claim("fixers", "flaky_dlq", 1)
        assert await broker.dead_letter(fix, error="Undecodable: no", detail={})  # parked
        [t] = await broker.troubles()
        assert t.state == "dead_lettered" and t.parked and t.needs_operator
        assert t.topic == "flaky" and t.last_error == "Boom: attempt 2"  # the original

        await broker.discard("flaky_dlq", t.seq, reason="seen")
        assert await broker.troubles() == []
