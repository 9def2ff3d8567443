"""``speculate`` applies a hotfix's overtakes (``app/speculation/priority.py``) in its
fenced plan write, on SQLite and PostgreSQL: the overtaken batch gains the hotfix as a
dependency (a conditional write, version + 1), its running path is stopped and it is
rebuilt on top of the hotfix; a redelivered or later run writes the edge again never;
an overtaken batch that started merging meanwhile is depended on instead."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.controllers.speculate import SpeculateController
from app.db.repos import batches as batch_repo
from app.db.repos import speculation as spec_repo
from app.domain.states import BatchState, Priority
from tests.conftest import BACKENDS
from tests.integration.state_tables.speculate_rig import (
    MERGING,
    P1,
    RUNNING_1,
    SPEC,
    B,
    S,
    build,
    msg,
    queue,
)
from tests.support.controllers import FakeDelivery, Rig, batch_id, path

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


async def hotfix(rig: Rig, n: int, overtakes: int) -> None:
    """Batch ``n`` becomes a hotfix that went ahead of batch ``overtakes`` (what
    dependency analysis writes with ``created``)."""
    old = await rig.get_batch(n)
    async with rig.db.write() as s:
        await batch_repo.update(s, old=old, new=replace(
            old, version=old.version + 1, priority=Priority.HOTFIX,
            overtakes=(batch_id(overtakes),)), now_ms=rig.broker.now_ms)


async def statuses(rig: Rig, n: int) -> dict[str, str]:
    async with rig.db.read() as s:
        sets = await spec_repo.path_sets(s, queue="demo", heads=[batch_id(n)])
    return {e.id: e.status.value for e in sets[batch_id(n)].entries}


async def test_the_overtaken_batch_gains_the_hotfix_once_and_is_rebuilt_on_it(
    rig: Rig,
) -> None:
    await queue(RUNNING_1, B(2, SPEC), budget=4)(rig)
    await hotfix(rig, 2, overtakes=1)
    before = await rig.get_batch(1)
    await SpeculateController(rig.deps).process(FakeDelivery("speculate", msg(2), seq=9))
    after = await rig.get_batch(1)
    assert after.dependencies == (batch_id(2),) and after.version == before.version + 1
    on_fix = path(1, (2, S))
    assert (await statuses(rig, 1))[P1.id] == "cancelling"  # its build had no hotfix
    assert (await statuses(rig, 1))[on_fix.id] == "pending"
    sent = rig.broker.keys()
    assert build(path(2)) in sent and build(on_fix) in sent
    # a redelivery (another process: no coalescing mark) writes no edge again
    fix = await rig.get_batch(2)
    await SpeculateController(rig.deps).process(FakeDelivery("speculate", msg(2), seq=10))
    again = await rig.get_batch(1)
    assert again.dependencies == (batch_id(2),) and again.version == after.version
    assert (await rig.get_batch(2)).dependencies == fix.dependencies == ()


async def test_a_batch_that_started_merging_meanwhile_stays_ahead_of_the_hotfix(
    rig: Rig,
) -> None:
    await queue(B(1, MERGING), B(2, SPEC), budget=4)(rig)
    await hotfix(rig, 2, overtakes=1)
    await SpeculateController(rig.deps).process(FakeDelivery("speculate", msg(2), seq=9))
    assert (await rig.get_batch(2)).dependencies == (batch_id(1),)
    assert (await rig.get_batch(1)).dependencies == ()
    assert (await rig.get_batch(1)).state is BatchState.MERGING
    sent = rig.broker.keys()
    assert build(path(2, (1, S))) in sent
