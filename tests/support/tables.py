"""The three tests every state-table module runs, bound to its table.

    test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
        table_tests(TABLE, CancelController, "cancel"))

``test_row``: each case on SQLite and PostgreSQL (``run_case``); ``after(rig, case,
delivery)`` adds a module's own check. ``test_crash_before_publishing_is_repaired``: the
process dies before each topic a handled case publishes to, and a redelivery repairs it
(``run_crash_repair``). ``test_a_duplicate_delivery_writes_nothing``
(``run_redelivery``). The last two run on SQLite only (``CONTROLLER_ONLY``).
Module-level names are what pytest collects, so assign all three.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.support.controllers import (
    CONTROLLER_ONLY,
    Case,
    FakeDelivery,
    StateTable,
    crash_points,
    run_case,
    run_crash_repair,
    run_redelivery,
)
from tests.support.rig import Rig

After = Callable[[Rig, Case, FakeDelivery], None]
TestFn = Callable[..., Any]


def _case_id(x: object) -> str:
    return x if isinstance(x, str) else x.id  # type: ignore[attr-defined,no-any-return]


def table_tests(table: StateTable, controller: Callable[[Any], Any], topic: str, *,
                after: After | None = None) -> tuple[TestFn, TestFn, TestFn]:
    handled: Sequence[Case] = [c for c in table.cases if c.raises is None]

    @pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
    @pytest.mark.parametrize("case", table.cases, ids=lambda c: c.id)
    async def test_row(rig: Rig, case: Case) -> None:
        delivery = await run_case(rig, controller(rig.deps), topic, case)
        if after is not None:
            after(rig, case, delivery)

    @pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
    @pytest.mark.parametrize(("case", "crash"), crash_points(table.cases), ids=_case_id)
    async def test_crash(rig: Rig, case: Case, crash: str) -> None:
        await run_crash_repair(rig, controller(rig.deps), topic, case, crash)

    @pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
    @pytest.mark.parametrize("case", handled, ids=lambda c: c.id)
    async def test_duplicate(rig: Rig, case: Case) -> None:
        await run_redelivery(rig, controller(rig.deps), topic, case)

    return test_row, test_crash, test_duplicate


def filter_test(table: StateTable, wants: Callable[[Any, Any], bool]) -> TestFn:
    """A tap's publish-time filter (``Topology.filter``) against its relay's table: it
    wants every message of a row the relay publishes for (so no relay is starved), and
    refuses the well-formed log entries of every row the relay publishes nothing for
    (the deliveries it saves). Malformed payloads may go either way: the relay acks them."""
    from pydantic import ValidationError

    from app.domain.messages import LogMsg

    @pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
    @pytest.mark.parametrize("case", table.cases, ids=lambda c: c.id)
    async def test_filter(rig: Rig, case: Case) -> None:
        seeded = await case.seed(rig)
        payload = case.payload(seeded) if callable(case.payload) else case.payload
        assert case.published is not None, "a relay's rows say what they publish"
        if case.published:
            assert wants(rig.deps, payload), "the relay would publish: it must be delivered"
            return
        try:
            LogMsg.model_validate(payload)
        except ValidationError:
            return
        assert not wants(rig.deps, payload), "the relay publishes nothing: no delivery"

    return test_filter
