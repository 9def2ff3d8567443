"""The transactional outbox (``Deps.transaction``, ``Broker.publish_within``): messages
published in a write transaction are stored with its writes or not at all, wake
consumers only once committed, and deduplicate like any publish; on both databases,
through the drivers' own connections (``Database.execute_raw``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest
import sqlalchemy as sa

from app.controllers.common import Deps, status_log
from app.controllers.pipeline import TopicSettings, build_topology, install_filters
from app.db.engine import Database
from app.db.tables import counters
from app.domain.messages import (
    GATEWAY_LOG_GROUP,
    GITHUB_CHECK_RELAY_GROUP,
    LOG,
    NOTIFY_RELAY_GROUP,
    SPECULATE,
    VALIDATE,
    EntityMsg,
)
from app.queue import Broker, backend_for_url
from tests.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


@asynccontextmanager
async def world(database_url: str) -> AsyncIterator[Deps]:
    db = Database(database_url)
    broker = Broker(backend_for_url(database_url, sqlite_write_lock=db.write_lock),
                    build_topology(TopicSettings()))
    await broker.start()
    try:
        yield Deps(db=db, broker=broker, extensions=lambda _q: cast(Any, None))
    finally:
        await broker.close()
        await db.dispose()


async def rows(db: Database) -> list[str]:
    async with db.read() as s:
        return list((await s.execute(sa.select(counters.c.domain).where(
            counters.c.queue == "q"))).scalars())


async def test_messages_commit_with_the_write_and_wake_consumers_after(
        database_url: str) -> None:
    async with world(database_url) as deps:
        waker = deps.broker.waker(VALIDATE)
        statements = sum(deps.db.stats.statements.values())
        async with deps.transaction() as (s, outbox):
            await s.execute(counters.insert().values(queue="q", domain="written", value=1))
            (result,) = await outbox.publish_many(
                [(VALIDATE, EntityMsg(id="q/1", queue="q"), "q/1")])
            assert result.created
            assert not waker.is_set(), "woken before the commit"
        assert waker.is_set()
        assert sum(deps.db.stats.statements.values()) > statements + 1  # counted too
        (stored,) = await deps.broker.find_messages(VALIDATE, "q/1")
        assert json.loads(stored.payload_json) == {"id": "q/1", "queue": "q"}
        assert stored.partition_key == "q"
        assert await rows(deps.db) == ["written"]
        assert deps.broker.published[VALIDATE] == 1
        # the same id again, in another transaction: stored once
        async with deps.transaction() as (_, outbox):
            (again,) = await outbox.publish_many(
                [(VALIDATE, EntityMsg(id="q/1", queue="q"), "q/1")])
        assert not again.created
        assert len(await deps.broker.find_messages(VALIDATE, "q/1")) == 1


async def test_a_rolled_back_write_takes_its_messages_with_it(database_url: str) -> None:
    async with world(database_url) as deps:
        waker = deps.broker.waker(VALIDATE)
        with pytest.raises(RuntimeError, match="after publishing"):
            async with deps.transaction() as (s, outbox):
                await s.execute(counters.insert().values(queue="q", domain="lost", value=1))
                await outbox.publish_many([(VALIDATE, EntityMsg(id="q/2", queue="q"), "q/2")])
                raise RuntimeError("the controller failed after publishing")
        assert await deps.broker.find_messages(VALIDATE, "q/2") == []
        assert await rows(deps.db) == []
        assert not waker.is_set()
        assert deps.broker.published[VALIDATE] == 0


async def test_speculate_wake_ups_are_refused_inside_a_transaction(database_url: str) -> None:
    async with world(database_url) as deps:
        with pytest.raises(ValueError, match="after the commit"):
            async with deps.transaction() as (_, outbox):
                await outbox.publish(SPECULATE, EntityMsg(id="q/batch/1", queue="q"),
                                     message_id="q/batch/1")
        assert await deps.broker.find_messages(SPECULATE, "q/batch/1") == []


class _Endpoint:
    name, format, public_url = "team", "json", ""
    events = frozenset({"landed"})


async def test_a_relay_group_gets_no_delivery_of_an_entry_it_would_not_relay(
        database_url: str) -> None:
    """The taps' publish-time filters (``install_filters``): on a queue with no
    notification endpoint and no check-runs, a log entry is delivered to the gateway's
    group only, in a transaction or alone; an endpoint's queue relays what it notifies."""
    queues = {"quiet": SimpleNamespace(notify=(), github_check=None),
              "loud": SimpleNamespace(notify=(_Endpoint(),), github_check=None)}
    async with world(database_url) as deps:
        deps.extensions = lambda q: cast(Any, queues[q])
        install_filters(deps.broker.topology, deps)
        landed = [status_log(q, f"{q}/1", "landed", now=1, version=3) for q in queues]
        started = [status_log(q, f"{q}/1", "started", now=1) for q in queues]
        async with deps.transaction() as (_, outbox):
            await outbox.logs(landed)
        await deps.publish_logs(started)

        (topic,) = [t for t in await deps.broker.stats() if t.topic == LOG]
        depth = {g.consumer_group: g.depth for g in topic.groups}
        assert depth.get(GATEWAY_LOG_GROUP) == 4
        assert depth.get(NOTIFY_RELAY_GROUP, 0) == 1
        assert depth.get(GITHUB_CHECK_RELAY_GROUP, 0) == 0
        (relayed,) = await deps.broker.claim(NOTIFY_RELAY_GROUP, LOG, 10)
        assert json.loads(relayed.message.payload_json)["log_id"] == landed[1].log_id


async def test_many_messages_take_two_statements_and_keep_their_order_and_dedup(
        database_url: str) -> None:
    """A transaction's outbox of many messages is stored by one statement and its
    deliveries by another (plus PostgreSQL's partition lock and NOTIFY), whatever the
    count; ids follow the order given; a message stored before and one repeated in the
    list are duplicates; payloads arrive byte for byte; every group gets its delivery."""
    async with world(database_url) as deps:
        async with deps.transaction() as (_, outbox):
            await outbox.publish(VALIDATE, EntityMsg(id="q/0", queue="q"), message_id="q/0")
        items = [(VALIDATE, EntityMsg(id=f"q/{n}", queue="q"), f"q/{n}") for n in range(13)]
        items.insert(6, items[3])
        tricky = "quote \" back\\slash ' é ✓ \n {\"json\": [1]}"
        entries = [status_log("q", f"q/{n}", "landed", now=1, version=3, last_error=tricky)
                   for n in range(3)]
        async with deps.transaction() as (_, outbox):
            before = sum(deps.db.stats.statements.values())
            results = await outbox.publish_many(items)
            assert sum(deps.db.stats.statements.values()) - before <= (
                4 if deps.db.dialect == "postgresql" else 2)
            await outbox.logs(entries)

        assert [r.created for r in results] == [False] + [True] * 5 + [False] + [True] * 7
        seqs = [r.seq for r in results if r.seq is not None]
        assert seqs == sorted(seqs) and len(set(seqs)) == 12
        stored_seqs = [(await deps.broker.find_messages(VALIDATE, f"q/{n}"))[0].seq
                       for n in range(1, 13)]
        assert stored_seqs == seqs
        (spec,) = [t for t in await deps.broker.stats() if t.topic == VALIDATE]
        assert [g.depth for g in spec.groups] == [13]
        (log_topic,) = [t for t in await deps.broker.stats() if t.topic == LOG]
        assert {g.consumer_group: g.depth for g in log_topic.groups} == {
            GATEWAY_LOG_GROUP: 3, NOTIFY_RELAY_GROUP: 3, GITHUB_CHECK_RELAY_GROUP: 3}
        for entry in entries:
            (stored,) = await deps.broker.find_messages(LOG, entry.log_id)
            assert json.loads(stored.payload_json)["last_error"] == tricky
