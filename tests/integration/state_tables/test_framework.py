"""The state-table framework itself (tests/support/controllers.py): the checks a case
relies on can fail."""

from __future__ import annotations

import pytest

from app.controllers.common import unique_id
from app.domain.errors import InvalidState
from app.domain.states import RequestState
from app.extensions.base import MergeOutcome
from app.queue import Delivery, LeaseLost
from tests.support.controllers import (
    Case,
    FakeDelivery,
    Rig,
    StateTable,
    crash_points,
    documented_rows,
    run_case,
    run_crash_repair,
    run_redelivery,
    unique,
)


class Documented:
    """Two tables.

    | Loaded state | Action |
    |---|---|
    | one | a |
    | two | b |

    | Loaded request | Action |
    |---|---|
    | three | c |

    | Something else | Action |
    |---|---|
    | four | d |

    | Dead letter | Action |
    |---|---|
    | five | e |
    """


async def nothing(rig: Rig) -> None:
    return None


def test_rows_of_the_tables_with_the_named_headers() -> None:
    assert documented_rows(Documented) == ["one", "two", "five"]
    assert documented_rows(Documented, ["Loaded request"]) == ["three"]
    assert documented_rows(Documented, ["Loaded state", "Loaded request"]) == [
        "one", "two", "three"]
    table = StateTable(Documented, [Case("one", nothing, {}), Case("six", nothing, {})])
    assert table.missing() == ["two", "five"] and table.unknown() == ["six"]


def test_case_names_are_unique() -> None:
    with pytest.raises(AssertionError, match="unique"):
        StateTable(Documented, [Case("one", nothing, {}), Case("one", nothing, {})])


class WritesThenRaises:
    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    async def process(self, delivery: Delivery) -> None:
        await self.rig.request(9, RequestState.STARTED)
        raise InvalidState("too late: something was written")


async def test_a_raising_row_that_writes_fails_its_case(rig: Rig) -> None:
    async def seed(rig: Rig) -> None:
        await rig.request(1, RequestState.STARTED)
    case = Case("one", seed, {}, raises=InvalidState)
    with pytest.raises(AssertionError, match="must write nothing"):
        await run_case(rig, WritesThenRaises(rig), "t", case)


async def test_scripted_seams_record_and_answer(rig: Rig) -> None:
    merger = rig.seam("merger").script(check=MergeOutcome(succeeded=False, reason="no"))
    assert (await merger.check("spec")).reason == "no"
    merger.script(check=ConnectionError("down"))
    with pytest.raises(ConnectionError):
        await merger.check("spec")
    assert rig.calls() == {"merger": ["check", "check"]}
    assert merger.called("check") == [("spec",), ("spec",)]


def test_a_delivery_records_its_hold() -> None:
    d = FakeDelivery("t", {"id": "x"})
    assert d.held_ms is None
    d.hold(500)
    assert d.held_ms == 500
    assert d.payload == {"id": "x"}


class WritesEveryTime:
    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.n = 0

    async def process(self, delivery: Delivery) -> None:
        self.n += 1
        await self.rig.request(self.n, RequestState.STARTED)


async def test_a_duplicate_delivery_that_writes_fails_its_case(rig: Rig) -> None:
    with pytest.raises(AssertionError, match="must write nothing"):
        await run_redelivery(rig, WritesEveryTime(rig), "t", Case("one", nothing, {}))


class DiesBeforePublishing:
    """Writes, then publishes; after the crash, the redelivery forgets to publish."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    async def process(self, delivery: Delivery) -> None:
        if delivery.attempt == 1:
            await self.rig.request(1, RequestState.STARTED)
            await self.rig.broker.publish("t", {}, partition_key="demo", message_id="x")


async def test_a_fan_out_lost_in_a_crash_fails_its_case(rig: Rig) -> None:
    case = Case("one", nothing, {}, published=[("t", "demo", "x")])
    assert crash_points([case]) == [(case, "t")]
    with pytest.raises(AssertionError):
        await run_crash_repair(rig, DiesBeforePublishing(rig), "t", case, "t")


class PublishesOnce:
    def __init__(self, rig: Rig, message_id: str) -> None:
        self.rig, self.message_id = rig, message_id

    async def process(self, delivery: Delivery) -> None:
        await self.rig.broker.publish("t", {}, partition_key="demo", message_id=self.message_id)


async def test_a_unique_id_matches_only_unique_of_its_base(rig: Rig) -> None:
    case = Case("one", nothing, {}, published=[("t", "demo", unique("x/recover"))])
    await run_case(rig, PublishesOnce(rig, unique_id("x/recover")), "t", case)
    for wrong in ("x/recover", "x/recover@constant", unique_id("y/recover")):
        rig.broker.published.clear()
        with pytest.raises(AssertionError):
            await run_case(rig, PublishesOnce(rig, wrong), "t", case)


async def test_a_delivery_can_have_lost_its_lease() -> None:
    held, lost = FakeDelivery("t", {}), FakeDelivery("t", {}, lease_lost=True)
    await held.ensure_held()
    with pytest.raises(LeaseLost):
        await lost.ensure_held()
    assert (held.lease_checks, lost.lease_checks) == (1, 1)


async def test_the_broker_numbers_what_it_stores(rig: Rig) -> None:
    broker = rig.broker
    assert await broker.latest_seq() == 1  # the delivered message
    first = await broker.publish("t", {}, partition_key="k", message_id="a")
    again = await broker.publish("t", {}, partition_key="k", message_id="a")
    assert (first.created, again.created) == (True, False)
    assert await broker.latest_seq() == 3


class RepublishesDifferently:
    """Publishes ``x`` with the attempt in its payload."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    async def process(self, delivery: Delivery) -> None:
        await self.rig.broker.publish("t", {"attempt": delivery.attempt}, partition_key="demo",
                                      message_id="x")


async def test_a_replay_with_another_payload_fails_unless_the_row_says_so(rig: Rig) -> None:
    case = Case("one", nothing, {}, published=[("t", "demo", "x")])
    with pytest.raises(AssertionError, match="replayed changed"):
        await run_redelivery(rig, RepublishesDifferently(rig), "t", case)
    rig.broker.published.clear()
    await run_redelivery(rig, RepublishesDifferently(rig), "t",
                         Case("one", nothing, {}, published=[("t", "demo", "x")],
                              replays_differ=["x"]))
