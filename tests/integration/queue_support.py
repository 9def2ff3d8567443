"""Helpers for queue tests: a topology, a started broker, recording controllers, waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from app.queue import (
    Broker,
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
