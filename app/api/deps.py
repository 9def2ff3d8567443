"""The one runtime dependency of the gateway's routers: ``request.app.state.runtime``.

``ApiRuntime`` is everything any router uses; the composition root's ``Runtime``
offers all of it, a test double only what the routes it serves touch (the getter
does not check). ``broker.clock()`` is the gateway's time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Protocol, cast

from fastapi import Depends, Request

from app.controllers.common import Deps
from app.db.engine import Database
from app.domain.errors import NotFound
from app.domain.queue_config import QueueConfig
from app.extensions.base import BuildStore, QueueExtensions
from app.gateway.access import Access
from app.queue import Broker
from app.settings import Settings
from app.views.data import TimingCache
from app.views.events import EventHub
from app.views.stalls import StallDetector


class Extensions(Protocol):
    @property
    def build_store(self) -> BuildStore: ...

    def for_queue(self, name: str) -> QueueExtensions: ...


class ApiRuntime(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def db(self) -> Database: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def queues(self) -> Mapping[str, QueueConfig]: ...

    @property
    def extensions(self) -> Extensions: ...

    @property
    def deps(self) -> Deps: ...

    @property
    def event_hub(self) -> EventHub: ...

    @property
    def view_timing(self) -> TimingCache: ...

    @property
    def stalls(self) -> StallDetector | None: ...

    @property
    def metrics(self) -> Any: ...

    @property
    def access(self) -> Access: ...

    async def readiness(self) -> dict[str, dict[str, Any]]: ...


GatewayRuntime = ApiRuntime  # the name the routers' signatures used


def get_runtime(request: Request) -> ApiRuntime:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise RuntimeError("app.state.runtime is not set; the app has not started")
    return cast(ApiRuntime, runtime)


RuntimeDep = Annotated[ApiRuntime, Depends(get_runtime)]


def now_ms(runtime: ApiRuntime) -> int:
    return runtime.broker.clock()


def queue_config(runtime: ApiRuntime, queue: str) -> QueueConfig:
    """The configured queue, or ``NotFound`` naming the queues that exist."""
    config = runtime.queues.get(queue)
    if config is None:
        known = ", ".join(sorted(runtime.queues)) or "none"
        raise NotFound(f"queue {queue!r} is not configured (configured: {known})")
    return config
