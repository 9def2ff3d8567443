"""``mergesignal``'s state table, row by row (app/controllers/mergesignal.py)."""

from __future__ import annotations

import pytest

from app.controllers import mergesignal
from app.controllers.mergesignal import MergeSignalController
from app.domain.errors import InvalidState, NotFound
from app.domain.states import BatchState, RequestState
from tests.conftest import BACKENDS
from tests.support.controllers import (
    CONTROLLER_ONLY,
    Case,
    Rig,
    StateTable,
    crash_points,
    run_case,
    run_crash_repair,
    run_redelivery,
)

B = "demo/batch/1"
OK = {"id": B, "queue": "demo", "outcome": "succeeded"}
BAD = {"id": B, "queue": "demo", "outcome": "failed", "reason": "conflict in a.py"}
FANOUT = [("conclude", "demo", f"{B}/conclude/merged"), ("speculate", "demo", f"{B}/merged")]


def batch_in(state: BatchState, version: int = 3):  # type: ignore[no-untyped-def]
    async def seed(rig: Rig) -> None:
        req = await rig.request(1, RequestState.BATCHED, version=2)
        await rig.batch(1, state, [req], version=version)
    return seed


async def nothing(rig: Rig) -> None:
    return None


def batch_is(state: BatchState, version: int, reason: str = ""):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        b = await rig.get_batch(1)
        assert (b.state, b.version) == (state, version)
        assert b.failure_reason == reason
    return check


TABLE = StateTable(mergesignal, [
    Case("batch ``merging``", batch_in(BatchState.MERGING), OK, name="merging-succeeded",
         published=FANOUT, check=batch_is(BatchState.SUCCEEDED, 4)),
    Case("batch ``merging``", batch_in(BatchState.MERGING), BAD, name="merging-failed",
         published=FANOUT,
         check=batch_is(BatchState.FAILED, 4, "merge failed: conflict in a.py")),
    Case("batch ``succeeded`` / ``failed``", batch_in(BatchState.SUCCEEDED), OK,
         name="succeeded-replays", published=FANOUT, check=batch_is(BatchState.SUCCEEDED, 3)),
    Case("batch ``succeeded`` / ``failed``", batch_in(BatchState.FAILED), OK,
         name="failed-replays-and-keeps-its-verdict", published=FANOUT,
         check=batch_is(BatchState.FAILED, 3)),
    Case("batch ``cancelled`` / ``cancelling``", batch_in(BatchState.CANCELLED), OK,
         name="cancelled", published=[], writes_nothing=True,
         check=batch_is(BatchState.CANCELLED, 3)),
    Case("batch ``cancelled`` / ``cancelling``", batch_in(BatchState.CANCELLING), OK,
         name="cancelling", published=[], writes_nothing=True,
         check=batch_is(BatchState.CANCELLING, 3)),
    *[Case("batch ``creating`` / ``created`` / ``speculating``", batch_in(st), OK,
           name=st.value, raises=InvalidState, published=[], check=batch_is(st, 3))
      for st in (BatchState.CREATING, BatchState.CREATED, BatchState.SPECULATING)],
    Case("batch missing", nothing, OK, raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", TABLE.cases, ids=lambda c: c.id)
async def test_row(rig: Rig, case: Case) -> None:
    await run_case(rig, MergeSignalController(rig.deps), "mergesignal", case)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
@pytest.mark.parametrize(("case", "crash"), crash_points(TABLE.cases),
                         ids=lambda x: x if isinstance(x, str) else x.id)
async def test_crash_before_publishing_is_repaired(rig: Rig, case: Case, crash: str) -> None:
    await run_crash_repair(rig, MergeSignalController(rig.deps), "mergesignal", case, crash)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
@pytest.mark.parametrize("case", [c for c in TABLE.cases if c.raises is None],
                         ids=lambda c: c.id)
async def test_a_duplicate_delivery_writes_nothing(rig: Rig, case: Case) -> None:
    await run_redelivery(rig, MergeSignalController(rig.deps), "mergesignal", case)
