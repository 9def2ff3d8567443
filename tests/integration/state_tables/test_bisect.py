"""``bisect``'s state table, row by row (app/controllers/bisect.py), run through
``conclude``, which owns a terminal batch's members and calls it. The seeds and checks
are conclude's (``test_conclude.py``)."""

from __future__ import annotations

from app.controllers import bisect
from app.controllers.conclude import ConcludeController
from app.db.repos import batches as batch_repo
from app.domain.queue_config import SpeculationConfig
from app.domain.states import BatchState, RequestState
from tests.integration.state_tables.test_conclude import (
    B2,
    C3,
    MSG,
    REASON,
    batch_of,
    both,
    log,
    parted,
    parts_are,
    terminal_logs,
)
from tests.support.controllers import Case, Check, Rig, Seed, StateTable
from tests.support.tables import table_tests

FAILED = BatchState.FAILED


def split_before(seed: Seed, part: int, *members: int) -> Seed:
    """``seed``, then a part ``part`` of batch 1 holding ``members``, claimed under
    ``split:1`` (an earlier run's split)."""
    async def seeded(rig: Rig) -> None:
        await seed(rig)
        await rig.batch(part, BatchState.CREATING, [f"demo/{m}" for m in members])
        async with rig.db.write() as s:
            for m in members:
                await batch_repo.claim(s, queue="demo", request_id=f"demo/{m}",
                                       cause="split:1", batch_id=f"demo/batch/{part}",
                                       now_ms=rig.broker.now_ms)
    return seeded


def second_chances(seed: Seed) -> Seed:
    """``seed`` in a queue with ``speculation.second_chance`` on."""
    async def seeded(rig: Rig) -> None:
        rig.configure(speculation=SpeculationConfig(second_chance=True))
        await seed(rig)
    return seeded


def second_chance_is(n: int, member: int) -> Check:
    """Batch ``n`` is request ``member``'s second chance: ``creating``, ``chance`` 1,
    claimed under ``split:1``; the request stays ``batched`` and its log says why."""
    async def check(rig: Rig) -> None:
        b = await rig.get_batch(n)
        assert (b.state, b.contains, b.chance) == (
            BatchState.CREATING, (f"demo/{member}",), 1)
        async with rig.db.read() as s:
            assert await batch_repo.claimed(s, queue="demo", request_id=f"demo/{member}",
                                            cause="split:1") == f"demo/batch/{n}"
        assert (await rig.get_request(member)).state is RequestState.BATCHED
        md = rig.broker.payload("log", f"demo/{member}/batching/demo/batch/{n}")["metadata"]
        assert md["second_chance"] is True and "second chance" in md["reason"], md
    return check


TABLE = StateTable(bisect, [
    Case("batch ``failed`` of several members, some ``batched``, no part claimed",
         batch_of(FAILED, B2, B2, B2, B2, reason=REASON), MSG, name="four-in-two-parts",
         published=[*parted(2, 1, 2), *parted(3, 3, 4)],
         check=parts_are((2, (1, 2)), (3, (3, 4)), failed=REASON)),
    Case("batch ``failed`` of several members, some ``batched``, no part claimed",
         batch_of(FAILED, B2, B2, B2, reason=REASON), MSG, name="three-in-two-parts",
         published=[*parted(2, 1, 2), *parted(3, 3)],
         check=parts_are((2, (1, 2)), (3, (3,)), failed=REASON)),
    Case("batch ``cancelled`` of several members, some ``batched`` (not cancelled)",
         batch_of(BatchState.CANCELLED, C3, B2), MSG, name="one-part-of-the-rest",
         published=[*parted(2, 2), log(1, "cancelled")],
         check=parts_are((2, (2,)), failed="cancelled for another member")),
    Case("batch ``failed`` of one ``batched`` member, ``chance`` 0, by its builds, the "
         "queue's second chances open (``speculation.second_chance``, its last ended second "
         "chances read in that transaction)",
         second_chances(batch_of(FAILED, B2, reason=REASON)), MSG, name="second-chance",
         published=parted(2, 1), check=second_chance_is(2, 1)),
    # A replay: the parts an earlier run minted are announced again, nothing is minted.
    Case("the parts claimed already (found in that transaction)",
         split_before(batch_of(FAILED, B2, B2, reason=REASON), 2, 1, 2), MSG,
         name="replays-the-claimed-part", published=parted(2, 1, 2), writes_nothing=True,
         check=parts_are((2, (1, 2)), failed=REASON)),
    Case("a member ``cancelling``", batch_of(FAILED, B2, C3, B2, reason=REASON), MSG,
         name="not-split", published=[*parted(2, 1), *parted(3, 3), log(2, "cancelled")],
         check=both(parts_are((2, (1,)), (3, (3,)), failed=REASON),
                    terminal_logs(RequestState.CANCELLED, 4, REASON, 2))),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, ConcludeController, "conclude"))
