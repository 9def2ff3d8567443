"""``start``'s state table, row by row (app/controllers/start.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from app.controllers import start
from app.controllers.start import StartController
from app.domain.states import LandStrategy, RequestState
from tests.support.controllers import (
    NOW_MS,
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
    change_uri,
)
from tests.support.tables import table_tests

R = "demo/1"
RECEIVED = NOW_MS - 60_000
URIS = [change_uri(1), change_uri(2)]
MSG = {"id": R, "queue": "demo", "change_uris": URIS, "strategy": "squash_rebase",
       "received_at_ms": RECEIVED}
FANOUT = [("log", R, f"{R}/accepted"), ("log", R, f"{R}/started"), ("validate", "demo", R)]
DLQ_ERROR = "dead-lettered from start after 3 attempts: ConnectionError: db away"


def request_in(state: RequestState, version: int = 4, last_error: str = "") -> Seed:
    async def seed(rig: Rig) -> None:
        await rig.request(1, state, version=version, uris=tuple(URIS), last_error=last_error)
    return seed


async def nothing(rig: Rig) -> None:
    return None


async def recorded_after_the_read(rig: Rig) -> None:
    """The start reads no row; before its create, the ``start_dlq`` reconciler records
    the request ``error`` (v1): the first read says missing, the next sees that row."""
    await rig.request(1, RequestState.ERROR, version=1, uris=tuple(URIS),
                      last_error=DLQ_ERROR)
    real = start.load_request
    calls = 0

    async def first_read_misses(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return None if calls == 1 else await real(*args, **kwargs)

    rig.stack.enter_context(mock.patch.object(start, "load_request", first_read_misses))


def started(accepted_at_ms: int = RECEIVED, strategy: LandStrategy = LandStrategy.SQUASH_REBASE,
            uris: tuple[str, ...] = tuple(URIS)) -> Check:
    """Request 1 is ``started`` v1 as the message describes it; ``accepted`` carries the
    gateway's receipt time, ``started`` v1 this run's; ``validate`` names the request."""
    async def check(rig: Rig) -> None:
        r = await rig.get_request(1)
        assert (r.state, r.version, r.change_uris, r.strategy, r.last_error) == (
            RequestState.STARTED, 1, uris, strategy, "")
        accepted = rig.broker.payload("log", f"{R}/accepted")
        assert (accepted["status"], accepted["timestamp_ms"], accepted["request_version"]) == (
            "accepted", accepted_at_ms, 0)
        begun = rig.broker.payload("log", f"{R}/started")
        assert (begun["status"], begun["timestamp_ms"], begun["request_version"]) == (
            "started", NOW_MS, 1)
        assert rig.broker.payload("validate", R) == {"id": R, "queue": "demo"}
    return check


def terminal_log(state: RequestState, version: int, last_error: str) -> Check:
    async def check(rig: Rig) -> None:
        p: dict[str, Any] = rig.broker.payload("log", f"{R}/{state.value}")
        assert (p["type"], p["status"], p["request_version"], p["last_error"]) == (
            "status", state.value, version, last_error)
        assert (await rig.get_request(1)).state is state
    return check


TABLE = StateTable(start, [
    Case("request missing", nothing, MSG, published=FANOUT, check=started()),
    # Messages from before the gateway stamped its receipt time: accepted now.
    Case("request missing", nothing, {k: v for k, v in MSG.items() if k != "received_at_ms"},
         name="no-receipt-time-accepted-now", published=FANOUT, check=started(NOW_MS)),
    Case("request missing", nothing, {**MSG, "change_uris": URIS[:1], "strategy": "rebase"},
         name="one-change-rebased", published=FANOUT,
         check=started(strategy=LandStrategy.REBASE, uris=tuple(URIS[:1]))),
    Case("request ``started``", request_in(RequestState.STARTED, version=1), MSG,
         published=FANOUT, writes_nothing=True, check=started(strategy=LandStrategy.REBASE)),
    *[Case("request terminal", request_in(st, last_error=err), MSG, name=st.value,
           published=[("log", R, f"{R}/{st.value}")], writes_nothing=True,
           check=terminal_log(st, 4, err))
      for st, err in [(RequestState.LANDED, ""), (RequestState.ERROR, "conflict"),
                      (RequestState.CANCELLED, "")]],
    # A start requeued after start_dlq recorded it: the reconciler's row (error, v1).
    Case("request terminal", request_in(RequestState.ERROR, 1, DLQ_ERROR), MSG,
         name="recorded-by-the-start-reconciler-is-not-resurrected",
         published=[("log", R, f"{R}/error")], writes_nothing=True,
         check=terminal_log(RequestState.ERROR, 1, DLQ_ERROR)),
    Case("request missing when read, present at the create (the ``start_dlq`` reconciler "
         "recorded it ``error`` meanwhile)", recorded_after_the_read, MSG,
         name="loses-to-the-start-reconcilers-row", published=[("log", R, f"{R}/error")],
         writes_nothing=True, check=terminal_log(RequestState.ERROR, 1, DLQ_ERROR)),
    *[Case("any other later state", request_in(st), MSG, name=st.value, published=[],
           writes_nothing=True)
      for st in (RequestState.VALIDATED, RequestState.BATCHED, RequestState.CANCELLING)],
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_request_state() -> None:
    seeded = {RequestState(c.id) for c in TABLE.cases if c.id in set(RequestState)}
    assert seeded | {RequestState.STARTED} == set(RequestState)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, StartController, "start"))
