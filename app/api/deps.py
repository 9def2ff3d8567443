"""What the gateway's routers need from ``request.app.state.runtime``.

``install()`` expects ``app.state.runtime`` to offer ``db`` (``Database``),
``broker`` (``Broker``; its ``clock()`` is the gateway's time) and ``queues``
(``{name: QueueConfig}``) — the composition root's ``Runtime`` or a test double.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Protocol, cast

from fastapi import Depends, Request

from app.db.engine import Database
from app.domain.errors import NotFound
from app.domain.queue_config import QueueConfig
from app.queue import Broker


class GatewayRuntime(Protocol):
    @property
    def db(self) -> Database: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def queues(self) -> Mapping[str, QueueConfig]: ...


def get_runtime(request: Request) -> GatewayRuntime:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise RuntimeError("app.state.runtime is not set; the app has not started")
    return cast(GatewayRuntime, runtime)


RuntimeDep = Annotated[GatewayRuntime, Depends(get_runtime)]


def now_ms(runtime: GatewayRuntime) -> int:
    return runtime.broker.clock()


def queue_config(runtime: GatewayRuntime, queue: str) -> QueueConfig:
    """The configured queue, or ``NotFound`` naming the queues that exist."""
    config = runtime.queues.get(queue)
    if config is None:
        known = ", ".join(sorted(runtime.queues)) or "none"
        raise NotFound(f"queue {queue!r} is not configured (configured: {known})")
    return config
