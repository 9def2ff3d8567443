"""``mergesignal``'s state table, row by row (app/controllers/mergesignal.py)."""

from __future__ import annotations

from app.controllers import mergesignal
from app.controllers.mergesignal import MergeSignalController
from app.domain.errors import InvalidState, NotFound
from app.domain.states import BatchState, RequestState
from tests.support.controllers import (
    Case,
    Rig,
    StateTable,
)
from tests.support.tables import table_tests

B = "demo/batch/1"
SHA1, SHA2 = "1" * 40, "2" * 40
# The merger's landed commits per member; one for a request outside the batch is ignored.
OK = {"id": B, "queue": "demo", "outcome": "succeeded",
      "commits": {"demo/1": [SHA1, SHA2], "demo/9": ["9" * 40]}}
BAD = {"id": B, "queue": "demo", "outcome": "failed", "reason": "conflict in a.py",
       "commits": {"demo/1": [SHA1]}}
LANDED = {"demo/1": (SHA1, SHA2)}
FANOUT = [("conclude", "demo", f"{B}/conclude/merged"), ("speculate", "demo", f"{B}/merged")]


def batch_in(state: BatchState, version: int = 3, *,  # type: ignore[no-untyped-def]
             members: int = 1, landed: dict[str, tuple[str, ...]] | None = None):
    async def seed(rig: Rig) -> None:
        reqs = [await rig.request(n, RequestState.BATCHED, version=2)
                for n in range(1, members + 1)]
        await rig.batch(1, state, reqs, version=version, landed=landed)
    return seed


async def nothing(rig: Rig) -> None:
    return None


def batch_is(state: BatchState, version: int, reason: str = "",  # type: ignore[no-untyped-def]
             landed: dict[str, tuple[str, ...]] | None = None):
    async def check(rig: Rig) -> None:
        b = await rig.get_batch(1)
        assert (b.state, b.version) == (state, version)
        assert b.failure_reason == reason
        assert b.landed == (landed or {})
    return check


TABLE = StateTable(mergesignal, [
    Case("batch ``merging``", batch_in(BatchState.MERGING), OK, name="merging-succeeded",
         published=FANOUT, check=batch_is(BatchState.SUCCEEDED, 4, landed=LANDED)),
    # A member the merger named no commit for is recorded with none.
    Case("batch ``merging``", batch_in(BatchState.MERGING, members=2), OK,
         name="merging-succeeded-member-without-commits", published=FANOUT,
         check=batch_is(BatchState.SUCCEEDED, 4, landed={**LANDED, "demo/2": ()})),
    Case("batch ``merging``", batch_in(BatchState.MERGING), BAD, name="merging-failed",
         published=FANOUT,
         check=batch_is(BatchState.FAILED, 4, "merge failed: conflict in a.py")),
    Case("batch ``succeeded`` / ``failed``", batch_in(BatchState.SUCCEEDED, landed=LANDED),
         {**OK, "commits": {"demo/1": ["f" * 40]}}, name="succeeded-replays-and-keeps-its-commits",
         published=FANOUT, check=batch_is(BatchState.SUCCEEDED, 3, landed=LANDED)),
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


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, MergeSignalController, "mergesignal"))
