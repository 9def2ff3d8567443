"""``speculate`` beyond its tables (app/controllers/speculate.py): coalescing on the
queue's message sequence, and plan errors. The queue is seeded as in ``test_speculate``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest import mock

import pytest

from app.controllers import speculate
from app.controllers.plan_check import PlanRejected
from app.controllers.speculate import SpeculateController
from app.db.repos import batches as batch_repo
from app.domain.entities import PathEntry
from app.domain.errors import VersionMismatch
from app.domain.states import BuildStatus, PathStatus
from app.speculation.planner import Plan, PlanInvariantError
from tests.conftest import BACKENDS
from tests.integration.state_tables.speculate_rig import (
    CREATED,
    MERGING,
    P1,
    P2,
    P2S,
    PASSED,
    PENDING,
    RUNNING_1,
    SPEC,
    B,
    E,
    batch_is,
    build,
    log,
    msg,
    queue,
    stored,
)
from tests.support.controllers import CONTROLLER_ONLY, FakeDelivery, Rig, batch_id, path

# -- coalescing on the queue's message sequence ------------------------------------------

def deliver(n: int, seq: int) -> FakeDelivery:
    return FakeDelivery("speculate", msg(n), seq=seq)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_a_message_a_completed_run_read_gets_only_the_pre_step(rig: Rig) -> None:
    """The first run notes the queue's highest message number (5) before it reads; a
    message numbered at or below it gets the pre-step only, one above it a run."""
    rig.broker.stored_seq = 5
    await queue(RUNNING_1, B(2, SPEC), B(3, CREATED), budget=1)(rig)
    controller = SpeculateController(rig.deps)
    await controller.process(deliver(1, seq=5))  # admits batch 3; no free slot
    assert rig.broker.keys() == [log(3, "speculating")]
    rig.configure(build_budget=4)
    await controller.process(deliver(2, seq=5))  # announced before the run read: coalesced
    assert rig.broker.keys() == [log(3, "speculating")]
    await controller.process(deliver(2, seq=6))
    assert rig.broker.keys() == [log(3, "speculating"), build(P2), build(path(3))]
    # That run noted 6 (the first run's log was numbered 6): 6 is coalesced, 7 runs; the
    # paths it funded are still unlinked, but this process dispatched them already, so
    # it sends nothing again; another process (or a restart) replays their dispatch,
    # with the same ids.
    await controller.process(deliver(3, seq=6))
    assert len(rig.broker.keys()) == 3
    await controller.process(deliver(3, seq=7))
    assert len(rig.broker.keys()) == 3
    await SpeculateController(rig.deps).process(deliver(3, seq=7))
    assert rig.broker.keys()[3:] == [build(P2), build(path(3))]


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_the_pre_step_is_never_coalesced(rig: Rig) -> None:
    await queue(RUNNING_1, B(2, SPEC))(rig)
    controller = SpeculateController(rig.deps)
    await controller.process(deliver(1, seq=1))
    funded = rig.broker.keys()
    assert funded == [build(P2)]
    await queue(B(3, CREATED))(rig)
    await controller.process(deliver(3, seq=1))
    assert rig.broker.keys() == [*funded, log(3, "speculating")]  # admitted, not funded
    await batch_is(3, SPEC, 3)(rig)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_a_run_that_failed_sets_no_mark(rig: Rig) -> None:
    await queue(B(1, SPEC))(rig)
    controller = SpeculateController(rig.deps)
    bad = PlanRejected("speculation plan rejected: x", problems={batch_id(1): ["x"]})
    with mock.patch.object(speculate, "check_plan", side_effect=bad), \
            pytest.raises(PlanRejected):
        await controller.process(deliver(1, seq=1))
    assert rig.broker.keys() == []
    await controller.process(deliver(1, seq=1))
    assert rig.broker.keys() == [build(P1)]


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_another_process_has_no_mark(rig: Rig) -> None:
    await queue(B(1, SPEC))(rig)
    first = SpeculateController(rig.deps)
    await first.process(deliver(1, seq=1))
    assert rig.broker.keys() == [build(P1)]
    await first.process(deliver(1, seq=1))
    assert rig.broker.keys() == [build(P1)]  # coalesced
    await SpeculateController(rig.deps).process(deliver(1, seq=1))
    assert rig.broker.keys() == [build(P1)] * 2  # it ran (and replayed the dispatch)


# -- plan errors --------------------------------------------------------------------------

@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_rejected_plan_writes_nothing_and_names_its_heads(rig: Rig) -> None:
    """A plan funding a head that is not speculating is rejected before anything is
    written or published; the error names that head and the queue (the ``speculate``
    DLQ reconciler fails exactly that batch)."""
    await queue(B(1, SPEC), B(2, MERGING, entries=(E(P2, PASSED),)))(rig)
    before = await rig.snapshot()
    bad = Plan(decisions=(), entries={batch_id(2): (stored(E(P2, PASSED)), PathEntry(
        path=P2S, status=PENDING))}, dependencies={}, builds=(P2S,), cancels=(), rebuilds=0)
    with mock.patch.object(speculate, "plan", return_value=bad), \
            pytest.raises(PlanRejected) as err:
        await SpeculateController(rig.deps).process(deliver(1, seq=1))
    assert err.value.queue == "demo" and err.value.batches == (batch_id(2),)
    assert [s["id"] for s in err.value.subjects] == [batch_id(2), "demo"]
    assert rig.broker.keys() == [] and await rig.snapshot() == before


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_a_planner_invariant_error_is_given_the_queue(rig: Rig) -> None:
    await queue(B(1, SPEC))(rig)
    bug = PlanInvariantError("speculation plan breaks an invariant: x",
                             problems={batch_id(1): ["x"]})
    with mock.patch.object(speculate, "plan", side_effect=bug), \
            pytest.raises(PlanInvariantError) as err:
        await SpeculateController(rig.deps).process(deliver(1, seq=1))
    assert err.value.queue == "demo"
    assert err.value.subjects[-1] == {"type": "queue", "id": "demo"}
    assert rig.broker.keys() == []


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_lost_race_writes_nothing_of_the_plan(rig: Rig) -> None:
    """The run read batch 1 at v1, but another writer (a cancel) moved it to v2 since:
    the plan's conditional write loses and the whole transaction rolls back, its
    dispatch (published in the same transaction) with it: nothing went out."""
    await queue(B(1, SPEC, entries=(E(P1, PathStatus.BUILDING, BuildStatus.SUCCEEDED),)))(rig)
    real = batch_repo.list_kept

    async def stale(session: Any, **kwargs: Any) -> Any:
        return [replace(b, version=1) for b in await real(session, **kwargs)]

    before = await rig.snapshot()
    with mock.patch.object(batch_repo, "list_kept", new=stale), \
            pytest.raises(VersionMismatch):
        await SpeculateController(rig.deps).process(deliver(1, seq=1))
    assert await rig.snapshot() == before
    assert rig.broker.published == []
