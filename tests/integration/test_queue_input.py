"""Bad input at publish: a clear exception, and nothing stored."""

from __future__ import annotations

import pytest

from app.queue import InvalidPayload, Outgoing, PayloadTooLarge, TopicSpec, Topology, UnknownTopic
from tests.conftest import BACKENDS
from tests.integration.queue_support import started_broker

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


def topo() -> Topology:
    t = Topology()
    t.declare(TopicSpec("in"))
    t.subscribe("in", "g")
    return t


async def assert_empty(broker) -> None:  # type: ignore[no-untyped-def]
    assert await broker.list_messages("in", unsettled_only=False) == []
    assert await broker.claim("g", "in", 10) == []


async def test_unknown_topic(database_url: str) -> None:
    async with started_broker(database_url, topo()) as broker:
        with pytest.raises(UnknownTopic, match="'nope' is not declared"):
            await broker.publish("nope", {}, partition_key="p", message_id="m")
        await assert_empty(broker)


async def test_oversize_payload(database_url: str) -> None:
    async with started_broker(database_url, topo(), max_payload_bytes=1024) as broker:
        with pytest.raises(PayloadTooLarge, match="limit is 1024"):
            await broker.publish("in", {"x": "y" * 2000}, partition_key="p", message_id="m")
        await assert_empty(broker)


@pytest.mark.parametrize(
    "payload", [b"bytes", {1, 2}, float("nan"), {"k": object()}], ids=["bytes", "set", "nan", "obj"]
)
async def test_non_json_payload(database_url: str, payload: object) -> None:
    async with started_broker(database_url, topo()) as broker:
        with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
            await broker.publish("in", payload, partition_key="p", message_id="m")
        await assert_empty(broker)


@pytest.mark.parametrize("key", ["", "x" * 256, "a\x00b"], ids=["empty", "long", "nul"])
async def test_bad_keys(database_url: str, key: str) -> None:
    async with started_broker(database_url, topo()) as broker:
        with pytest.raises(InvalidPayload):
            await broker.publish("in", {}, partition_key=key, message_id="m")
        with pytest.raises(InvalidPayload):
            await broker.publish("in", {}, partition_key="p", message_id=key)
        await assert_empty(broker)


async def test_one_bad_message_in_a_batch_stores_none(database_url: str) -> None:
    async with started_broker(database_url, topo()) as broker:
        with pytest.raises(InvalidPayload):
            await broker.publish_many(
                [Outgoing("in", {"ok": 1}, "p", "a"), Outgoing("in", b"x", "p", "b")]
            )
        await assert_empty(broker)
