"""The ``speculate`` resync's table, row by row (app/controllers/resync.py): a scheduler
job, not a consumer, driven here as one (the delivery is ignored; ``run`` returns how
many wake-ups it stored)."""

from __future__ import annotations

import pytest

from app.controllers import resync
from app.controllers.common import Deps
from app.controllers.resync import SpeculateResync
from app.domain.states import BatchState, RequestState
from app.queue import Delivery
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    Rig,
    Seed,
    StateTable,
    batch_id,
)
from tests.support.tables import table_tests

INTERVAL_MS = 30_000
WAKE = f"demo/resync/{NOW_MS // INTERVAL_MS}"


class Resync:
    def __init__(self, deps: Deps) -> None:
        self.job = SpeculateResync(deps, ["demo", "quiet"], interval_ms=INTERVAL_MS)

    async def process(self, delivery: Delivery) -> int:
        return await self.job.run()


def batches(*states: BatchState) -> Seed:
    """Batches 1, 2, ... of the demo queue in these states (the ``quiet`` queue has none)."""
    async def seed(rig: Rig) -> None:
        for n, st in enumerate(states, start=1):
            req = await rig.request(n, RequestState.BATCHED)
            await rig.batch(n, st, [req])
    return seed


def wakes(n: int):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        assert rig.broker.payload("speculate", WAKE) == {"id": batch_id(n), "queue": "demo"}
    return check


ACTIVE = "active batches (``created`` / ``speculating`` / ``merging`` / ``cancelling``)"

TABLE = StateTable(resync, headers=["Loaded state (per configured queue)"], cases=[
    *[Case(ACTIVE, batches(BatchState.SUCCEEDED, BatchState.CREATING, st, BatchState.CREATED),
           {}, name=f"oldest-{st.value}", published=[("speculate", "demo", WAKE)],
           returns=1, writes_nothing=True, check=wakes(3))
      for st in (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING,
                 BatchState.CANCELLING)],
    Case("no active batch", batches(BatchState.CREATING, BatchState.FAILED,
                                    BatchState.SUCCEEDED, BatchState.CANCELLED), {},
         published=[], returns=0, writes_nothing=True),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, Resync, "resync"))


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_one_wake_up_per_interval(rig: Rig) -> None:
    """Within an interval every run (of any process) names the same message; the next
    interval's is a new one."""
    await batches(BatchState.SPECULATING)(rig)
    first, other = Resync(rig.deps), Resync(rig.deps)
    assert await first.job.run() == 1 and await other.job.run() == 0
    assert (first.job.published, other.job.duplicates) == (1, 1)
    rig.broker.now_ms += INTERVAL_MS
    assert await other.job.run() == 1
    assert rig.broker.keys() == [("speculate", "demo", WAKE)] * 2 + [
        ("speculate", "demo", f"demo/resync/{NOW_MS // INTERVAL_MS + 1}")]
