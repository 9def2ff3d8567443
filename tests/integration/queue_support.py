"""Helpers for queue tests: a topology, a started broker, recording controllers, waiting."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from app.queue import (
    Broker,
    ClaimedDelivery,
    ConsumerService,
    ConsumerSpec,
    Delivery,
    TopicSpec,
    Topology,
    backend_for_url,
)


def topology(*specs: TopicSpec, groups: tuple[str, ...] = ("g",)) -> Topology:
    topo = Topology()
    for spec in specs:
        topo.declare(spec)
        for g in groups:
            topo.subscribe(spec.name, g)
    return topo


@asynccontextmanager
async def started_broker(url: str, topology: Topology, **kw: Any) -> AsyncIterator[Broker]:
    broker = Broker(backend_for_url(url), topology, **kw)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.close()


@asynccontextmanager
async def running(
    broker: Broker, specs: list[ConsumerSpec], *, poll_interval_ms: int = 50,
    shutdown_grace_ms: int = 2000,
) -> AsyncIterator[ConsumerService]:
    service = ConsumerService(broker, specs, poll_interval_ms=poll_interval_ms,
                              shutdown_grace_ms=shutdown_grace_ms)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


class Recorder:
    """A controller that records what it saw and runs an optional behaviour."""

    def __init__(
        self, behaviour: Callable[[Delivery], Awaitable[None]] | None = None
    ) -> None:
        self.seen: list[tuple[str, str, int]] = []  # (partition, message_id, attempt)
        self.started_at: dict[str, float] = {}
        self.behaviour = behaviour
        self.changed = asyncio.Event()

    async def process(self, delivery: Delivery) -> None:
        self.started_at.setdefault(delivery.message_id, time.monotonic())
        self.seen.append((delivery.partition_key, delivery.message_id, delivery.attempt))
        self.changed.set()
        if self.behaviour is not None:
            await self.behaviour(delivery)

    def ids(self) -> list[str]:
        return [m for _, m, _ in self.seen]


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], *, timeout: float = 10.0,
    interval: float = 0.02, what: str = "condition",
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class ClaimWatch:
    """Counts ``broker.claim`` calls per topic (wrapping the instance's method), so a
    test can wait until a consumer has *claimed after* some point — had its chance at
    everything published before it — and see what each claim handed out."""

    def __init__(self, broker: Broker) -> None:
        self.started: dict[str, int] = defaultdict(int)
        self.done: dict[str, list[int]] = defaultdict(list)  # start index of each finished
        self.handed_out: dict[str, list[str]] = defaultdict(list)
        inner = broker.claim

        async def claim(group: str, topic: str, limit: int) -> list[ClaimedDelivery]:
            index = self.started[topic]
            self.started[topic] += 1
            result = await inner(group, topic, limit)
            self.handed_out[topic].extend(c.message.message_id for c in result)
            self.done[topic].append(index)
            return result

        broker.claim = claim  # type: ignore[method-assign]

    def mark(self, topic: str) -> int:
        """A point in time: claims of ``topic`` starting from now count as after it."""
        return self.started[topic]

    async def claimed_since(self, topic: str, mark: int, *, timeout: float = 10.0) -> None:
        """Wait until a claim of ``topic`` that started at or after ``mark`` finished."""
        await eventually(lambda: any(i >= mark for i in self.done[topic]), timeout=timeout,
                         what=f"a claim of {topic} after mark {mark}")


async def drained(broker: Broker, topic: str, group: str | None = None) -> bool:
    """Every message of ``topic`` was delivered to (and settled by) ``group`` (or every
    group): no delivery row is left, so a consumer had its chance at all of them."""
    for stats in await broker.stats():
        if stats.topic == topic:
            return all(g.depth == 0 for g in stats.groups
                       if group is None or g.consumer_group == group)
    raise AssertionError(f"no topic {topic}")
