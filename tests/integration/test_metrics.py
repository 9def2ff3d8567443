"""Metrics and log context of the consumer framework on a real queue (SQLite and
PostgreSQL), the scrape-time refresh of the database gauges, and the terminal-status
rule behind the land duration histogram."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.controllers.common import finished_request, log_ids
from app.db.engine import Database
from app.domain.entities import RequestLog, RequestSummary
from app.domain.states import LogType
from app.metrics import Metrics, StateSnapshot, state_source
from app.queue import (
    Backoff,
    ConsumerService,
    ConsumerSpec,
    Delivery,
    NonRetryable,
    Retryable,
    TopicSpec,
    Topology,
)
from tests.conftest import BACKENDS
from tests.integration.queue_support import eventually, started_broker
from tests.support.logs import captured_logs


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, _ = metrics.render(None)
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


class Scripted:
    """Acts on the payload: ok, hold once, fail once then succeed, or refuse."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.lines: list[str] = []

    async def process(self, delivery: Delivery) -> None:
        logging.getLogger("submitqueue.test").warning("handling")
        action = delivery.payload["do"]
        if action == "hold" and delivery.message_id not in self.held:
            self.held.add(delivery.message_id)
            delivery.hold(10)
        elif action == "flaky" and delivery.attempt == 1:
            raise Retryable(ConnectionError("try again"))
        elif action == "bad":
            raise NonRetryable(ValueError("never"))
        elif action == "slow":
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_handler_outcomes_durations_and_queue_state(database_url: str) -> None:
    topo = Topology()
    topo.declare(TopicSpec("work", max_attempts=3, backoff=Backoff(initial_ms=10, max_ms=10)))
    topo.subscribe("work", "g")
    metrics = Metrics(refresh_interval_ms=0, process_metrics=False)
    db = Database(database_url)
    async with started_broker(database_url, topo) as broker:
        metrics.attach(state_source(db, broker), {"demo": 3})
        for i, action in enumerate(["ok", "ok", "hold", "flaky", "bad", "slow"]):
            await broker.publish("work", {"do": action, "queue": "demo", "id": f"demo/{i}"},
                                 partition_key=f"p{i}", message_id=f"m{i}")
        await metrics.refresh()
        assert value(metrics, "submitqueue_queue_depth", topic="work", group="g") == 6
        service = ConsumerService(broker, [ConsumerSpec("work", "g", Scripted())],
                                  poll_interval_ms=20, on_handled=metrics.on_handled)
        await service.start()
        try:
            await eventually(
                lambda: (value(metrics, "submitqueue_queue_handled_total", topic="work",
                               group="g", outcome="acked") or 0) >= 5, what="5 acks")
        finally:
            await service.stop()
        handled = {o: value(metrics, "submitqueue_queue_handled_total", topic="work", group="g",
                            outcome=o) for o in ("acked", "held", "retried", "dead_lettered")}
        assert handled == {"acked": 5, "held": 1, "retried": 1, "dead_lettered": 1}
        assert value(metrics, "submitqueue_queue_handler_duration_seconds_count",
                     topic="work", group="g") == 8
        slow_or_faster = value(metrics, "submitqueue_queue_handler_duration_seconds_bucket",
                               topic="work", group="g", le="0.025")
        assert slow_or_faster is not None and slow_or_faster <= 7  # the slow one took 50 ms

        await metrics.refresh()
        assert value(metrics, "submitqueue_queue_depth", topic="work", group="g") == 0
        assert value(metrics, "submitqueue_queue_dlq_size", topic="work") == 1
        assert value(metrics, "submitqueue_queue_in_flight", topic="work", group="g") == 0
        assert value(metrics, "submitqueue_build_budget", queue="demo") == 3
        assert value(metrics, "submitqueue_builds_in_flight", queue="demo") == 0
        assert value(metrics, "submitqueue_metrics_refresh_errors_total") == 0
    await db.dispose()


async def test_handler_log_lines_carry_the_delivery_ids(database_url: str) -> None:
    url = database_url  # SQLite
    topo = Topology()
    topo.declare(TopicSpec("work"))
    topo.subscribe("work", "g")
    with captured_logs("INFO") as out:
        async with started_broker(url, topo) as broker:
            await broker.publish("work", {"do": "ok", "queue": "demo", "id": "demo/batch/4"},
                                 partition_key="demo", message_id="m-1")
            service = ConsumerService(broker, [ConsumerSpec("work", "g", Scripted())],
                                      poll_interval_ms=20, log_context=log_ids)
            await service.start()
            try:
                await eventually(lambda: "handling" in out.text, what="the handler's log line")
            finally:
                await service.stop()
        logging.getLogger("submitqueue.test").warning("after")
    line = next(r for r in out.records() if r["event"] == "handling")
    assert {k: line.get(k) for k in ("topic", "group", "message_id", "partition_key", "attempt",
                                     "queue", "batch_id")} == {
        "topic": "work", "group": "g", "message_id": "m-1", "partition_key": "demo",
        "attempt": 1, "queue": "demo", "batch_id": "demo/batch/4"}
    after = next(r for r in out.records() if r["event"] == "after")
    assert "message_id" not in after  # bound for the handler's task only


def test_log_ids_name_the_entity_kind() -> None:
    assert log_ids({"queue": "q", "id": "q/3"}) == {"queue": "q", "sqid": "q/3"}
    assert log_ids({"queue": "q", "id": "q/batch/3"}) == {"queue": "q", "batch_id": "q/batch/3"}
    assert log_ids({"queue": "q", "request_id": "q/9", "log_id": "x"}) == \
        {"queue": "q", "sqid": "q/9"}
    assert log_ids({"queue": "q", "id": "fake-abc"}) == {"queue": "q", "entity_id": "fake-abc"}
    assert log_ids(["not", "a", "mapping"]) == {}


async def test_refresh_is_rate_limited_and_keeps_old_values_on_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    mode = {"now": "ok"}

    async def source() -> StateSnapshot:
        calls.append(mode["now"])
        if mode["now"] == "fail":
            raise ConnectionError("database down")
        if mode["now"] == "hang":
            await asyncio.sleep(10)
        return StateSnapshot(requests={"demo": {"landed": len(calls)}},
                             taken_at=asyncio.get_running_loop().time())

    metrics = Metrics(refresh_interval_ms=60_000, process_metrics=False)
    metrics.attach(source, {"demo": 2})
    assert value(metrics, "submitqueue_metrics_state_age_seconds") == -1
    await metrics.refresh()
    await metrics.refresh()  # within the interval: served from the last read
    assert calls == ["ok"]
    assert value(metrics, "submitqueue_requests", queue="demo", status="landed") == 1
    mode["now"] = "fail"
    await metrics.refresh(force=True)
    monkeypatch.setattr("app.metrics.REFRESH_TIMEOUT_S", 0.05)
    mode["now"] = "hang"
    await metrics.refresh(force=True)
    assert calls == ["ok", "fail", "hang"]
    assert value(metrics, "submitqueue_metrics_refresh_errors_total") == 2
    assert value(metrics, "submitqueue_requests", queue="demo", status="landed") == 1


def test_each_metrics_has_its_own_registry() -> None:
    a, b = Metrics(process_metrics=False), Metrics(process_metrics=False)
    a.merge_finished("demo", "succeeded")
    assert value(a, "submitqueue_merges_total", queue="demo", outcome="succeeded") == 1
    assert value(b, "submitqueue_merges_total", queue="demo", outcome="succeeded") is None


def _summary(status: str, received: int = 1000) -> RequestSummary:
    return RequestSummary(queue="demo", request_id="demo/1", change_uris=("x",),
                          received_at_ms=received, status=status, request_version=1,
                          status_timestamp_ms=received, version=3)


def _status(status: str, at: int) -> RequestLog:
    return RequestLog(queue="demo", request_id="demo/1", timestamp_ms=at, type=LogType.STATUS,
                      status=status, request_version=4, log_id=f"demo/1/{status}")


def test_a_request_is_timed_once_when_it_first_turns_terminal() -> None:
    assert finished_request(_status("landed", 3500), _summary("landing")) == ("landed", 2.5)
    assert finished_request(_status("error", 1500), _summary("speculating")) == ("error", 0.5)
    assert finished_request(_status("landed", 3500), None) is None  # did not win
    assert finished_request(_status("landed", 9000), _summary("landed")) is None  # a repair
    assert finished_request(_status("landing", 3000), _summary("speculated")) is None
    event = RequestLog(queue="demo", request_id="demo/1", timestamp_ms=5, type=LogType.EVENT,
                       event="built", log_id="e")
    assert finished_request(event, _summary("speculating")) is None

    metrics = Metrics(process_metrics=False)
    metrics.log_folded(_status("landed", 3500), _summary("landing"))
    metrics.log_folded(_status("landed", 9000), _summary("landed"))
    assert value(metrics, "submitqueue_land_duration_seconds_count",
                 queue="demo", status="landed") == 1
    assert value(metrics, "submitqueue_land_duration_seconds_sum",
                 queue="demo", status="landed") == 2.5
