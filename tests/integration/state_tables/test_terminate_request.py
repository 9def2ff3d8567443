"""``terminate_request``'s table, row by row (app/controllers/common.py): the only writer
of terminal request states. Its table's header is ``Loaded (or expected) request``; the case payload
names the call's arguments, and ``returns`` checks the verdict it reports."""

from __future__ import annotations

from dataclasses import replace
from itertools import permutations
from typing import Any
from unittest import mock

from app.controllers.common import Deps, terminate_request
from app.db.repos import requests as request_repo
from app.domain.errors import NotFound, VersionMismatch
from app.domain.states import RequestState
from app.queue import Delivery
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
MD = {"batch_id": "demo/batch/1"}
TERMINAL = (RequestState.LANDED, RequestState.ERROR, RequestState.CANCELLED)
LIVE = (RequestState.STARTED, RequestState.VALIDATED, RequestState.BATCHED,
        RequestState.CANCELLING)


class Terminate:
    """``terminate_request`` as a controller: the payload holds its arguments."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def process(self, delivery: Delivery) -> str:
        p = delivery.payload
        expected = None
        if "expected_version" in p:  # the caller classified the request at that version
            async with self.deps.db.read() as s:
                current = await request_repo.get(s, queue=p["queue"], id=p["id"])
            expected = replace(current, version=p["expected_version"])
        return await terminate_request(
            self.deps, queue=p["queue"], sqid=p["id"], target=RequestState(p["target"]),
            last_error=p.get("last_error", ""), metadata=p.get("metadata"), expected=expected)


def to(target: RequestState, last_error: str = "new reason") -> dict[str, Any]:
    return {"id": R, "queue": "demo", "target": target.value, "last_error": last_error,
            "metadata": MD}


def request_in(state: RequestState, version: int = 3, last_error: str = "old reason") -> Seed:
    async def seed(rig: Rig) -> None:
        await rig.request(1, state, version=version, last_error=last_error)
    return seed


def stale_read(state: RequestState) -> Seed:
    """Request 1 at version 3, but the read hands out its copy from version 2 (another
    writer moved it in between): the write must be conditional."""
    async def seed(rig: Rig) -> None:
        req = await rig.request(1, state, version=3)
        rig.stack.enter_context(mock.patch.object(
            request_repo, "get", new=mock.AsyncMock(return_value=replace(req, version=2))))
    return seed


def request_is(state: RequestState, version: int, last_error: str,
               log: bool = True) -> Check:
    """The request as given; its terminal log (if published) says the same, with the
    call's metadata."""
    async def check(rig: Rig) -> None:
        r = await rig.get_request(1)
        assert (r.state, r.version, r.last_error) == (state, version, last_error)
        if log:
            assert rig.broker.payload("log", f"{R}/{state.value}") == {
                "queue": "demo", "request_id": R, "log_id": f"{R}/{state.value}",
                "timestamp_ms": NOW_MS, "type": "status", "status": state.value, "event": "",
                "request_version": version, "last_error": last_error, "metadata": MD}
    return check


def log(state: RequestState) -> list[tuple[str, str, str]]:
    return [("log", R, f"{R}/{state.value}")]


TABLE = StateTable(terminate_request, headers=["Loaded (or expected) request"], cases=[
    Case("missing", lambda rig: rig.request(2, RequestState.BATCHED), to(RequestState.LANDED),
         raises=NotFound, published=[]),
    # The repair republishes what was written: the stored version and reason.
    *[Case("already ``target``", request_in(t), to(t), name=f"already-{t.value}",
           returns="repaired", published=log(t), writes_nothing=True,
           check=request_is(t, 3, "old reason"))
      for t in TERMINAL],
    *[Case("another terminal state", request_in(current), to(t),
           name=f"{current.value}-stays-not-{t.value}", returns="diverged", published=[],
           writes_nothing=True, check=request_is(current, 3, "old reason", log=False))
      for current, t in permutations(TERMINAL, 2)],
    *[Case("otherwise", request_in(current), to(t), name=f"{current.value}-to-{t.value}",
           returns="terminated", published=log(t), check=request_is(t, 4, "new reason"))
      for current, t in [(RequestState.STARTED, RequestState.ERROR),
                         (RequestState.VALIDATED, RequestState.CANCELLED),
                         (RequestState.BATCHED, RequestState.LANDED),
                         (RequestState.BATCHED, RequestState.ERROR),
                         (RequestState.CANCELLING, RequestState.CANCELLED),
                         (RequestState.CANCELLING, RequestState.LANDED)]],
    Case("otherwise", request_in(RequestState.BATCHED), to(RequestState.LANDED, ""),
         name="landed-clears-the-reason", returns="terminated", published=log(
             RequestState.LANDED), check=request_is(RequestState.LANDED, 4, "")),
    Case("otherwise", stale_read(RequestState.BATCHED), to(RequestState.LANDED),
         name="lost-race-writes-and-publishes-nothing", raises=VersionMismatch, published=[]),
    *[Case("``expected`` no longer current", request_in(current),
           {**to(RequestState.ERROR), "expected_version": 2},
           name=f"{current.value}-classified-at-v2-is-not-overwritten", raises=VersionMismatch,
           published=[], writes_nothing=True)
      for current in (RequestState.BATCHED, RequestState.CANCELLING)],
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.rows() == ["missing", "already ``target``", "another terminal state",
                            "otherwise", "``expected`` no longer current"]
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_every_live_state_is_terminated() -> None:
    live = {c.id.split("-to-")[0] for c in TABLE.cases if "-to-" in c.id}
    assert live == {s.value for s in LIVE} and {*LIVE, *TERMINAL} == set(RequestState)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, Terminate, "terminate"))
