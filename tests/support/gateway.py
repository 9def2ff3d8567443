"""The gateway's API in process, for the gateway's tests: a runtime double over a real
database and broker, the app, and helpers to land, finish and read errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI

from app.api.app_routes import install
from app.db.engine import Database
from app.db.repos.request_log import persist_log
from app.db.tables import counters as counters_t
from app.db.tables import request_log as log_t
from app.db.tables import request_summaries as sum_t
from app.domain.entities import RequestLog
from app.domain.errors import InvalidState
from app.domain.messages import CANCEL, LOG, START, log_id
from app.domain.queue_config import QueueConfig
from app.domain.states import LandStrategy, LogType
from app.gateway.access import Access, AccessPolicy
from app.metrics import Metrics
from app.queue import Broker, TopicSpec, Topology, backend_for_url
from tests.support.clocks import TickingClock

SHA = "0123456789abcdef0123456789abcdef01234567"
URI_A = f"github://github.com/acme/widgets/pull/1/{SHA}"
URI_B = "phab://phab.example.com/D12/3"
URI_C = f"git://git.example.com/team/repo/refs%2Fheads%2Fmain/{SHA}"
T0 = 1_700_000_000_000
OPEN = AccessPolicy(mode="open")


@dataclass
class FakeRuntime:
    db: Database
    broker: Broker
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    policy: AccessPolicy = field(default_factory=lambda: OPEN)
    metrics: Metrics = field(default_factory=lambda: Metrics(process_metrics=False))
    access: Access = field(init=False)

    def __post_init__(self) -> None:
        self.access = Access(self.db, self.policy, self.broker.clock)


def topology(*topics: str) -> Topology:
    t = Topology()
    for name in topics:
        t.declare(TopicSpec(name))
    return t


@dataclass
class Env:
    client: httpx.AsyncClient
    runtime: FakeRuntime
    app: FastAPI

    async def count(self, table: sa.Table) -> int:
        async with self.runtime.db.read() as s:
            return int((await s.execute(sa.select(sa.func.count()).select_from(table)))
                       .scalar_one())

    async def messages(self, topic: str) -> list[Any]:
        return await self.runtime.broker.list_messages(topic, unsettled_only=False)

    async def assert_nothing_written(self) -> None:
        assert await self.count(sum_t) == 0
        assert await self.count(counters_t) == 0
        assert await self.count(log_t) == 0
        assert await self.messages(START) == []


async def make_env(url: str, topics: tuple[str, ...] = (START, CANCEL, LOG), *,
                   policy: AccessPolicy | None = None,
                   queues: dict[str, QueueConfig] | None = None) -> Env:
    broker = Broker(backend_for_url(url), topology(*topics), clock=TickingClock(T0))
    await broker.start()
    runtime = FakeRuntime(
        db=Database(url), broker=broker, policy=policy or OPEN,
        queues={
            "demo": QueueConfig(name="demo", description="the demo queue", build_budget=3),
            "squashy": QueueConfig(name="squashy", default_strategy=LandStrategy.SQUASH_REBASE),
        } if queues is None else queues,
    )
    app = FastAPI()
    app.state.runtime = runtime
    install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    @app.get("/conflict")
    async def conflict() -> None:
        raise InvalidState("request demo/1 is landed; it cannot be changed")

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return Env(client, runtime, app)


@asynccontextmanager
async def opened_env(url: str, **kw: Any) -> AsyncIterator[Env]:
    """``make_env(url, **kw)``, closed (client, broker, database) on the way out."""
    e = await make_env(url, **kw)
    try:
        yield e
    finally:
        await e.client.aclose()
        await e.runtime.broker.close()
        await e.runtime.db.dispose()


async def land(env: Env, *uris: str, queue: str = "demo", **body: Any) -> str:
    r = await env.client.post(f"/api/v1/queues/{queue}/requests",
                              json={"change_uris": list(uris), **body})
    assert r.status_code == 202, r.text
    return str(r.json()["sqid"])


async def finish(env: Env, sqid: str, status: str, **metadata: Any) -> None:
    """Fold a terminal status for ``sqid`` as the orchestrator's log would."""
    await persist_log(env.runtime.db, RequestLog(
        queue=sqid.split("/")[0], request_id=sqid, timestamp_ms=T0 + 1_000,
        type=LogType.STATUS, status=status, request_version=3, metadata=metadata,
        log_id=log_id(sqid, status)))


def error(r: httpx.Response) -> dict[str, str]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


# --- land ----------------------------------------------------------------------------
