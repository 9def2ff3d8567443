"""``validate``'s state table, row by row (app/controllers/validate.py).

The provider is the demo queue's fake (a ``provider-error`` marker makes it reject a
change); the race row hands ``validate`` a stale copy of the request (``started`` at
v2) while a cancel has already made it ``cancelling`` (v3).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from unittest import mock

from app.controllers import validate
from app.controllers.validate import ValidateController
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain.entities import LandRequest
from app.domain.errors import NotFound, VersionMismatch
from app.domain.states import RequestState
from tests.support.controllers import (
    Case,
    Check,
    FakeDelivery,
    Rig,
    Seed,
    StateTable,
    change_uri,
)
from tests.support.tables import table_tests

R = "demo/1"
MSG = {"id": R, "queue": "demo"}
URI = change_uri(1)
REJECTED = change_uri(1, fake="provider-error")
VALIDATING = ("log", R, f"{R}/validating")
CHECKED = [VALIDATING, ("mergecheck", R, R)]
FAILED = [VALIDATING, ("log", R, f"{R}/error")]


def request_in(state: RequestState, *, version: int = 2, uri: str = URI,
               other: RequestState | None = None, claimed_by_self: bool = False,
               provider_error: Exception | None = None) -> Seed:
    """Request 1 (one change, ``uri``); with ``other``, request 2 in that state has
    claimed the same change; ``claimed_by_self``: request 1 claimed it already; the
    provider raises ``provider_error``."""
    async def seed(rig: Rig) -> None:
        if provider_error is not None:
            rig.seam("provider").script(get=provider_error)
        await rig.request(1, state, version=version, uris=(uri,))
        if other is not None:
            await rig.request(2, other, version=3, uris=(uri,))
            await rig.claim(2, [uri])
        if claimed_by_self:
            await rig.claim(1, [uri])
    return seed


def cancelled_meanwhile() -> Seed:
    """Request 1 is ``cancelling`` (v3) in the database, but ``validate``'s read returned
    the copy from before the cancel (``started``, v2); later reads see the cancel."""
    async def seed(rig: Rig) -> None:
        req = await rig.request(1, RequestState.CANCELLING, version=3, uris=(REJECTED,))
        stale = replace(req, state=RequestState.STARTED, version=2)
        rig.stack.enter_context(mock.patch.object(
            request_repo, "get", new=FirstReadStale(request_repo.get, stale)))
    return seed


class FirstReadStale:
    def __init__(self, real: Callable[..., Awaitable[LandRequest]], stale: LandRequest) -> None:
        self.real, self.stale, self.calls = real, stale, 0

    async def __call__(self, session: Any, **kwargs: Any) -> LandRequest:
        self.calls += 1
        return self.stale if self.calls == 1 else await self.real(session, **kwargs)


def claims(*owners: str, uri: str = URI) -> Check:
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            assert await change_repo.claimants(s, queue="demo", uris=[uri]) == list(owners)
    return check


def request_is(state: RequestState, version: int, error: str = "") -> Check:
    async def check(rig: Rig) -> None:
        r = await rig.get_request(1)
        assert (r.state, r.version) == (state, version)
        assert error in r.last_error and bool(error) == bool(r.last_error), r.last_error
    return check


def provider(called: bool) -> Check:
    async def check(rig: Rig) -> None:
        assert rig.calls() == ({"provider": ["get"]} if called else {})
        if called:
            assert rig.seam("provider").called("get") == [("demo", (URI,))]
    return check


def error_log(error: str) -> Check:
    async def check(rig: Rig) -> None:
        p = rig.broker.payload("log", f"{R}/error")
        assert (p["status"], p["request_version"]) == ("error", 3) and error in p["last_error"]
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


async def retry_finds_it_halted(rig: Rig) -> None:
    """The retry (no stale read now) acks: the cancel decides."""
    rig.stack.close()
    before = rig.broker.keys()
    await ValidateController(rig.deps).process(FakeDelivery("validate", MSG, attempt=2))
    assert rig.broker.keys() == before
    await request_is(RequestState.CANCELLING, 3)(rig)


STARTED = "request ``started``"
DUPLICATE = f"duplicate of in-flight request demo/2: it already claims {URI}"

TABLE = StateTable(validate, [
    *[Case("request halted (terminal or cancelling)", request_in(st), MSG, name=st.value,
           published=[("log", R, f"{R}/{st.value}")], writes_nothing=True,
           check=provider(called=False))
      for st in (RequestState.LANDED, RequestState.ERROR, RequestState.CANCELLED)],
    Case("request halted (terminal or cancelling)", request_in(RequestState.CANCELLING), MSG,
         name="cancelling", published=[], writes_nothing=True, check=provider(called=False)),
    *[Case("request ``validated`` / ``batched``", request_in(st), MSG, name=st.value,
           published=[], writes_nothing=True, check=provider(called=False))
      for st in (RequestState.VALIDATED, RequestState.BATCHED)],
    Case(STARTED, request_in(RequestState.STARTED), MSG, name="claims-and-asks-for-mergecheck",
         published=CHECKED,
         check=both(claims(R), request_is(RequestState.STARTED, 2), provider(called=True))),
    Case(STARTED, request_in(RequestState.STARTED, other=RequestState.BATCHED), MSG,
         name="duplicate-of-a-live-request-ends-error", published=FAILED,
         check=both(claims("demo/2"), request_is(RequestState.ERROR, 3, DUPLICATE),
                    error_log(DUPLICATE), provider(called=False))),
    Case(STARTED, request_in(RequestState.STARTED, other=RequestState.CANCELLING), MSG,
         name="duplicate-of-a-cancelling-request-ends-error", published=FAILED,
         check=request_is(RequestState.ERROR, 3, DUPLICATE)),
    # A change a terminal request once claimed is free again.
    Case(STARTED, request_in(RequestState.STARTED, other=RequestState.ERROR), MSG,
         name="claim-of-a-terminal-request-is-no-duplicate", published=CHECKED,
         check=both(claims("demo/1", "demo/2"), request_is(RequestState.STARTED, 2))),
    # A redelivery after the claim (the process died before ``mergecheck``).
    Case(STARTED, request_in(RequestState.STARTED, claimed_by_self=True), MSG,
         name="own-claim-is-no-duplicate", published=CHECKED, writes_nothing=True,
         check=claims(R)),
    Case(STARTED, request_in(RequestState.STARTED, uri=REJECTED), MSG,
         name="provider-rejects-ends-error", published=FAILED,
         check=both(claims(uri=REJECTED), request_is(RequestState.ERROR, 3, REJECTED),
                    error_log(REJECTED))),
    # An infrastructure error is the queue's to retry: nothing is decided.
    Case(STARTED, request_in(RequestState.STARTED, provider_error=ConnectionError("down")),
         MSG, name="provider-down-is-retried", raises=ConnectionError, published=[VALIDATING],
         check=claims()),
    Case("request ``started`` when read, ``cancelling`` by the time of the ``error`` write",
         cancelled_meanwhile(), MSG, raises=VersionMismatch, published=[VALIDATING],
         check=retry_finds_it_halted),
    Case("request missing", lambda rig: rig.request(2, RequestState.STARTED), MSG,
         raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, ValidateController, "validate"))
