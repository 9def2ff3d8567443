"""``cancel``'s state table, row by row (app/controllers/cancel.py)."""

from __future__ import annotations

from collections.abc import Sequence

from app.controllers import cancel
from app.controllers.cancel import MISSING_GRACE_MS, CancelController
from app.domain.errors import NotFound
from app.domain.states import BatchState, RequestState
from tests.support.controllers import (
    NOW_MS,
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
)
from tests.support.tables import table_tests

R = "demo/1"
MSG = {"id": R, "queue": "demo", "reason": "not needed"}
TERMINAL = (RequestState.LANDED, RequestState.ERROR, RequestState.CANCELLED)
LIVE = (RequestState.STARTED, RequestState.VALIDATED, RequestState.BATCHED,
        RequestState.CANCELLING)
CANCELLED = [("log", R, f"{R}/cancelled")]
WHY = {"reason": "not needed"}


def wake(n: int) -> tuple[str, str, str]:
    return ("speculate", "demo", f"demo/batch/{n}/cancel")


def request_in(state: RequestState, version: int = 2, batches: Sequence[
        tuple[int, BatchState]] = (), last_error: str = "") -> Seed:
    """Request 1 in ``state``, member of batches ``(number, state)`` (each at version 4)."""
    async def seed(rig: Rig) -> None:
        req = await rig.request(1, state, version=version, last_error=last_error)
        for n, st in batches:
            await rig.batch(n, st, [req], version=4)
    return seed


async def nothing(rig: Rig) -> None:
    return None


def world_is(state: RequestState, version: int, last_error: str = "",
             batches: Sequence[tuple[int, BatchState, int]] = (),
             log_metadata: dict[str, str] | None = None) -> Check:
    """Request 1 and the batches as given; each log published says the request's state,
    version and error (and carries ``log_metadata``); each wake-up names its batch."""
    async def check(rig: Rig) -> None:
        r = await rig.get_request(1)
        assert (r.state, r.version, r.last_error) == (state, version, last_error)
        for n, st, v in batches:
            b = await rig.get_batch(n)
            assert (b.state, b.version) == (st, v), b
        for p in rig.broker.published:
            if p.topic == "speculate":
                assert p.payload == {"id": p.message_id.rsplit("/", 1)[0], "queue": "demo"}
            if p.topic == "log":
                assert (p.payload["status"], p.payload["request_version"],
                        p.payload["last_error"]) == (state.value, version, last_error)
                assert p.payload["metadata"] == (log_metadata or {})
    return check


LIVE_ROW = "request live"
BATCHED = RequestState.BATCHED
CANCELLING = RequestState.CANCELLING

TABLE = StateTable(cancel, [
    Case("request missing, message younger than 5 min", nothing, MSG, name="just-published",
         held=500, published=[], writes_nothing=True),
    Case("request missing, message younger than 5 min", nothing, MSG, name="almost-5-min-old",
         held=500, published=[], writes_nothing=True,
         delivery={"published_at_ms": NOW_MS - MISSING_GRACE_MS + 1}),
    Case("request missing, older", nothing, MSG, name="exactly-5-min-old", raises=NotFound,
         published=[], delivery={"published_at_ms": NOW_MS - MISSING_GRACE_MS}),
    Case("request missing, older", nothing, MSG, name="an-hour-old", raises=NotFound,
         published=[], delivery={"published_at_ms": NOW_MS - 3_600_000}),
    # A ``cancelled`` request's log is repaired as cancel's write published it.
    *[Case("request terminal", request_in(st, 5, [(1, BatchState.SPECULATING)], "why"), MSG,
           name=f"{st.value}-repairs-its-log", published=[("log", R, f"{R}/{st.value}")],
           writes_nothing=True, check=world_is(
               st, 5, "why", log_metadata=WHY if st is RequestState.CANCELLED else None))
      for st in TERMINAL],
    # No owning batch: cancelled at once (via ``cancelling`` unless already there).
    *[Case(LIVE_ROW, request_in(st), MSG, name=f"{st.value}-without-a-batch",
           published=CANCELLED,
           check=world_is(RequestState.CANCELLED, 3 if st is CANCELLING else 4,
                          "cancelled: not needed", log_metadata=WHY))
      for st in (RequestState.STARTED, RequestState.VALIDATED, CANCELLING)],
    Case(LIVE_ROW, request_in(RequestState.VALIDATED), {**MSG, "reason": ""},
         name="no-reason-given", published=CANCELLED,
         check=world_is(RequestState.CANCELLED, 4, "cancelled", log_metadata={"reason": ""})),
    Case(LIVE_ROW, request_in(BATCHED, batches=[(1, BatchState.CREATING)]), MSG,
         name="creating-batch-does-not-own-it", published=CANCELLED,
         check=world_is(RequestState.CANCELLED, 4, "cancelled: not needed",
                        [(1, BatchState.CREATING, 4)], log_metadata=WHY)),
    # A cancellable batch takes the cancel over and owns the outcome.
    *[Case(LIVE_ROW, request_in(BATCHED, batches=[(1, st)]), MSG,
           name=f"{st.value}-batch-is-cancelled", published=[wake(1)],
           check=world_is(CANCELLING, 3, batches=[(1, BatchState.CANCELLING, 5)]))
      for st in (BatchState.CREATED, BatchState.SPECULATING)],
    Case(LIVE_ROW, request_in(CANCELLING, 3, [(1, BatchState.CANCELLING)]), MSG,
         name="cancelling-batch-is-woken-again", published=[wake(1)], writes_nothing=True,
         check=world_is(CANCELLING, 3, batches=[(1, BatchState.CANCELLING, 4)])),
    # A merging or finished batch owns the outcome already: only the intent is written.
    *[Case(LIVE_ROW, request_in(BATCHED, batches=[(1, st)]), MSG,
           name=f"{st.value}-batch-owns-it", published=[],
           check=world_is(CANCELLING, 3, batches=[(1, st, 4)]))
      for st in (BatchState.MERGING, BatchState.SUCCEEDED, BatchState.FAILED,
                 BatchState.CANCELLED)],
    Case(LIVE_ROW, request_in(CANCELLING, 3, [(1, BatchState.MERGING)]), MSG,
         name="redelivered-while-merging", published=[], writes_nothing=True,
         check=world_is(CANCELLING, 3, batches=[(1, BatchState.MERGING, 4)])),
    # Inert ``creating`` batches (batch redeliveries) sit beside the enrolled one.
    Case(LIVE_ROW, request_in(BATCHED, batches=[(2, BatchState.CREATING),
                                                (3, BatchState.SPECULATING),
                                                (10, BatchState.CREATING)]), MSG,
         name="inert-batches-beside-the-owner", published=[wake(3)],
         check=world_is(CANCELLING, 3, batches=[(2, BatchState.CREATING, 4),
                                                (3, BatchState.CANCELLING, 5),
                                                (10, BatchState.CREATING, 4)])),
    # Constructed directly (enrolment allows one live batch): oldest first, by number.
    Case(LIVE_ROW, request_in(BATCHED, batches=[(10, BatchState.CREATED),
                                                (2, BatchState.SPECULATING)]), MSG,
         name="oldest-batch-first", published=[wake(2), wake(10)],
         check=world_is(CANCELLING, 3, batches=[(2, BatchState.CANCELLING, 5),
                                                (10, BatchState.CANCELLING, 5)])),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_request_and_batch_state() -> None:
    assert {*TERMINAL, *LIVE} == set(RequestState)
    live = [c for c in TABLE.cases if c.row == LIVE_ROW]
    seen = {st for st in BatchState if any(f"{st.value}-batch" in c.id for c in live)}
    assert seen == set(BatchState)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, CancelController, "cancel"))
