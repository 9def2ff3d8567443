"""The consumer's guard hook (app/queue/guard.py) on both databases: a hold spends no
attempt, a give-up dead-letters at once with the guard's detail, a failing guard is
ignored."""

from __future__ import annotations

from typing import Any

import pytest

from app.queue import Backoff, ConsumerService, ConsumerSpec, Delivery, Retryable, TopicSpec
from app.queue.guard import Ruling
from app.queue.records import ClaimedDelivery
from tests.conftest import BACKENDS
from tests.integration.queue_support import Recorder, eventually, started_broker, topology

pytestmark = [pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
              pytest.mark.timeout(60)]


class ScriptedGuard:
    def __init__(self, *, before: list[Ruling | None] | None = None,
                 failed: list[Ruling | None] | None = None, broken: bool = False) -> None:
        self._before = list(before or [])
        self._failed = list(failed or [])
        self.broken = broken
        self.succeeded_with: list[bool] = []

    async def before(self, cd: ClaimedDelivery) -> Ruling | None:
        if self.broken:
            raise RuntimeError("guard bug")
        return self._before.pop(0) if self._before else None

    async def failed(self, cd: ClaimedDelivery, exc: BaseException) -> Ruling | None:
        return self._failed.pop(0) if self._failed else None

    async def succeeded(self, cd: ClaimedDelivery, *, held: bool) -> None:
        self.succeeded_with.append(held)


async def _run(database_url: str, guard: Any, behaviour: Any, *, until: Any,
               max_attempts: int = 2) -> tuple[Recorder, Any, ConsumerService]:
    topo = topology(TopicSpec("t", max_attempts=max_attempts, backoff=Backoff(10, 20)))
    async with started_broker(database_url, topo) as broker:
        await broker.publish("t", {"x": 1}, partition_key="p", message_id="m")
        rec = Recorder(behaviour)
        service = ConsumerService(broker, [ConsumerSpec("t", "g", rec)], poll_interval_ms=50,
                                  shutdown_grace_ms=2000, guard=guard)
        await service.start()
        try:
            await eventually(lambda: until(service.consumers[0].counters))
        finally:
            await service.stop()
        dead = await broker.list_messages("t_dlq")
    return rec, dead, service


async def test_holds_before_and_after_failures_spend_no_attempt(database_url: str) -> None:
    calls = 0

    async def behaviour(d: Delivery) -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise Retryable("dependency down")

    guard = ScriptedGuard(before=[Ruling.hold(10), Ruling.hold(10)],
                          failed=[Ruling.hold(10)] * 3)
    rec, dead, svc = await _run(database_url, guard, behaviour,
                                until=lambda c: c.acked == 1, max_attempts=2)
    # three failures with max_attempts=2, and still acked: no attempt was spent
    assert [a for _, _, a in rec.seen] == [1, 1, 1, 1]
    assert svc.consumers[0].counters.waiting == 5
    assert dead == [] and guard.succeeded_with == [False]


async def test_give_up_dead_letters_at_once_with_the_guards_detail(database_url: str) -> None:
    async def behaviour(d: Delivery) -> None:
        raise Retryable("dependency down")

    detail = {"reason": "dependency_unavailable", "dependency": "repository:q", "down_ms": 5}
    guard = ScriptedGuard(failed=[Ruling.give_up("dependency unavailable: gone", detail)])
    rec, dead, _ = await _run(database_url, guard, behaviour,
                              until=lambda c: c.dead_lettered == 1, max_attempts=10)
    assert len(rec.seen) == 1
    (d,) = dead
    assert d.last_error == "dependency unavailable: gone"
    assert d.failure_detail is not None
    assert {k: d.failure_detail[k] for k in detail} == detail


async def test_a_failing_guard_is_ignored(database_url: str) -> None:
    async def behaviour(d: Delivery) -> None:
        return None

    rec, dead, _ = await _run(database_url, ScriptedGuard(broken=True), behaviour,
                              until=lambda c: c.acked == 1)
    assert len(rec.seen) == 1 and dead == []
