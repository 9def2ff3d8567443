"""The outage guard over a real database (SQLite and PostgreSQL), with a fake clock:
two guards stand for two processes sharing the circuits through the database."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from app.controllers.outages import OutageGuard
from app.domain.outages import OutagePolicy
from app.extensions.git.cli import Unreachable
from app.queue.records import ClaimedDelivery, StoredMessage
from tests.conftest import BACKENDS
from tests.support.rig import Rig, make_rig

pytestmark = [pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
              pytest.mark.timeout(60)]

POLICY = OutagePolicy(window_ms=60_000, threshold=2, initial_ms=1000, max_ms=4000, jitter=0.0,
                      notify_after_ms=10_000)
DOWN = Unreachable(["ls-remote", "--", "/gone.git"], 128,
                   "fatal: '/gone.git' does not appear to be a git repository")


def delivery(n: int, *, topic: str = "validate", published_ms: int = 0) -> ClaimedDelivery:
    msg = StoredMessage(seq=n, topic=topic, partition_key="q", message_id=f"m{n}",
                        payload_json=json.dumps({"id": f"q/{n}", "queue": "q"}), metadata={},
                        published_at_ms=published_ms)
    return ClaimedDelivery(delivery_id=n, consumer_group="orchestrator", lease_token="t",
                           lease_until_ms=0, attempt=1, message=msg)


@pytest.fixture
async def rig(database_url: str) -> AsyncIterator[Rig]:
    r = make_rig(database_url)
    try:
        yield r
    finally:
        await r.aclose()


def guards(rig: Rig, notified: list[str]) -> tuple[OutageGuard, OutageGuard]:
    def notify(c: object, _now: int) -> None:
        notified.append(getattr(c, "dependency", "?"))
    made = [OutageGuard(rig.deps, base=POLICY, queues={}, recheck_ms=500, refresh_ms=0,
                        notify=notify) for _ in range(2)]
    return made[0], made[1]


async def test_failures_open_the_circuit_for_every_process_and_one_probe_runs(rig: Rig) -> None:
    notified: list[str] = []
    a, b = guards(rig, notified)
    start = rig.broker.now_ms
    first = await a.failed(delivery(1, published_ms=start), DOWN)
    assert first is not None and first.hold_ms is not None and 0 < first.hold_ms <= 1000
    assert await b.before(delivery(2, published_ms=start)) is None  # still closed
    await b.failed(delivery(2, published_ms=start), DOWN)  # the second process's failure
    circuit = (await a.circuits(fresh=True))["repository:q"]
    assert circuit.is_open and circuit.failures == 2
    held = await a.before(delivery(3, published_ms=start))
    assert held is not None and held.hold_ms is not None and 0 < held.hold_ms <= 500
    # other topics that do not need the repository run on
    assert await a.before(delivery(4, topic="batch", published_ms=start)) is None

    rig.broker.now_ms = start + 1000  # the probe is due: exactly one of the two runs it
    rulings = [await a.before(delivery(5, published_ms=start)),
               await b.before(delivery(6, published_ms=start))]
    assert [r is None for r in rulings].count(True) == 1, rulings
    prober, probe_id = (a, 5) if rulings[0] is None else (b, 6)
    await prober.succeeded(delivery(probe_id, published_ms=start), held=False)
    assert not (await b.circuits(fresh=True))["repository:q"].is_open
    assert await b.before(delivery(7, published_ms=start)) is None
    assert notified == []


async def test_a_run_that_was_not_the_probe_or_held_does_not_close_it(rig: Rig) -> None:
    a, _ = guards(rig, [])
    start = rig.broker.now_ms
    for n in (1, 2):
        await a.failed(delivery(n, published_ms=start), DOWN)
    await a.succeeded(delivery(3, published_ms=start), held=False)  # not the probe
    assert (await a.circuits(fresh=True))["repository:q"].is_open
    rig.broker.now_ms = start + 1000
    assert await a.before(delivery(4, published_ms=start)) is None  # the probe
    await a.succeeded(delivery(4, published_ms=start), held=True)  # a poll: inconclusive
    assert (await a.circuits(fresh=True))["repository:q"].is_open


async def test_past_the_window_it_gives_up_once_notified(rig: Rig) -> None:
    notified: list[str] = []
    a, b = guards(rig, notified)
    start = rig.broker.now_ms
    for n in (1, 2):
        await a.failed(delivery(n, published_ms=start), DOWN)
    rig.broker.now_ms = start + 10_000
    await a.sweep()
    await b.sweep()
    assert notified == ["repository:q"]  # once, across both processes
    rig.broker.now_ms = start + 60_001
    ruling = await b.before(delivery(3, published_ms=start))
    assert ruling is not None and ruling.gives_up
    assert ruling.detail == {"reason": "dependency_unavailable", "dependency": "repository:q",
                             "down_ms": 60_001}
    assert ruling.error.startswith("dependency unavailable: repository:q was unreachable "
                                   "for 1 min")
    late = await b.before(delivery(4, published_ms=start + 30_000))  # published later
    assert late is None  # it has waited only 30 s: it runs as the due probe


async def test_a_logic_error_is_left_to_the_queue(rig: Rig) -> None:
    a, _ = guards(rig, [])
    assert await a.failed(delivery(1), ValueError("bad payload")) is None
    assert await a.circuits(fresh=True) == {}
