"""``batch``'s state table, row by row (app/controllers/batch.py).

The claim row that is "found in that transaction" is the run that raced another run of
the same message: its first read saw no batch (``for_request`` is handed an empty
list), and the other run's claim and batch are already committed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

from app.controllers import batch
from app.controllers.batch import BatchController
from app.db.repos import batches as batch_repo
from app.db.repos.counters import next_number
from app.domain.errors import InvalidState, NotFound
from app.domain.queue_config import BatchingConfig
from app.domain.states import BatchState, RequestState
from tests.support.controllers import (
    NOW_MS,
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
    batch_id,
)
from tests.support.tables import table_tests

R = "demo/1"
MSG = {"id": R, "queue": "demo"}
CAUSE = "validated@v2"
T0 = NOW_MS - 30_000  # when a batch seeded before the run was created


def handed_off(n: int) -> list[tuple[str, str, str]]:
    return [("log", R, f"{R}/batching/{batch_id(n)}"),
            ("dependency_analysis", "demo", batch_id(n))]


def request_in(state: RequestState, *, minted: int = 0,
               batches: tuple[tuple[int, BatchState], ...] = (),
               claim: int | None = None, stale: str | None = None) -> Seed:
    """Request 1 (v2); ``minted`` batch numbers already handed out; ``batches`` of it
    created at ``T0``; ``claim``: the batch claimed for (request 1, ``CAUSE``);
    ``stale``: ``for_request`` reads no batch, or (``claimed``) the claim lookup
    before the insert misses the committed claim once."""
    async def seed(rig: Rig) -> None:
        req = await rig.request(1, state, version=2)
        async with rig.db.write() as s:
            for _ in range(minted):
                await next_number(s, queue="demo", domain="batch")
        rig.broker.now_ms = T0
        for n, st in batches:
            await rig.batch(n, st, [req])
        rig.broker.now_ms = NOW_MS
        if claim is not None:
            async with rig.db.write() as s:
                await batch_repo.claim(s, queue="demo", request_id=R, cause=CAUSE,
                                       batch_id=batch_id(claim), now_ms=T0)
        if stale == "for_request":
            rig.stack.enter_context(mock.patch.object(
                batch_repo, "for_request", new=mock.AsyncMock(return_value=[])))
        elif stale == "claimed":
            rig.stack.enter_context(mock.patch.object(
                batch_repo, "claimed", new=MissesOnce(batch_repo.claimed)))
    return seed


class MissesOnce:
    def __init__(self, real: Callable[..., Awaitable[str | None]]) -> None:
        self.real, self.calls = real, 0

    async def __call__(self, session: Any, **kwargs: Any) -> str | None:
        self.calls += 1
        return None if self.calls == 1 else await self.real(session, **kwargs)


def batches_are(*expected: tuple[int, BatchState]) -> Check:
    """Request 1's batches, with their states (each holds request 1 only, v1)."""
    async def check(rig: Rig) -> None:
        rig.stack.close()  # the race is over: real reads
        async with rig.db.read() as s:
            found = await batch_repo.for_request(s, queue="demo", request_id=R)
        assert [(b.id, b.state, b.contains, b.version) for b in found] == [
            (batch_id(n), st, (R,), 1) for n, st in expected]
    return check


def claimed(n: int | None) -> Check:
    async def check(rig: Rig) -> None:
        rig.stack.close()
        async with rig.db.read() as s:
            got = await batch_repo.claimed(s, queue="demo", request_id=R, cause=CAUSE)
        assert got == (None if n is None else batch_id(n))
    return check


def batching_log(n: int, at_ms: int) -> Check:
    """The ``batching`` log names batch ``n``, stamped with its creation time; the
    hand-off names it too."""
    async def check(rig: Rig) -> None:
        p = rig.broker.payload("log", f"{R}/batching/{batch_id(n)}")
        assert (p["status"], p["timestamp_ms"], p["request_version"], p["metadata"]) == (
            "batching", at_ms, 2, {"batch_id": batch_id(n)})
        assert rig.broker.payload("dependency_analysis", batch_id(n)) == {
            "id": batch_id(n), "queue": "demo"}
    return check


def open_batch(*, age_ms: int = 30_000, size: int = 1, max_size: int = 4,
               max_wait_ms: int = 60_000) -> Seed:
    """Request 1 (v2, validated) and the queue's newest ``creating`` batch 4 holding
    ``size`` other validated requests (2, 3, ...), created ``age_ms`` ago, with 4
    batch numbers handed out; ``batching`` configured with ``max_size`` and
    ``max_wait_ms``."""
    async def seed(rig: Rig) -> None:
        rig.configure(batching=BatchingConfig(max_size=max_size, max_wait_ms=max_wait_ms))
        await rig.request(1, RequestState.VALIDATED, version=2)
        others = [await rig.request(2 + i, RequestState.VALIDATED) for i in range(size)]
        async with rig.db.write() as s:
            for _ in range(4):
                await next_number(s, queue="demo", domain="batch")
        rig.broker.now_ms = NOW_MS - age_ms
        await rig.batch(4, BatchState.CREATING, others)
        rig.broker.now_ms = NOW_MS
    return seed


def open_batch_is(*contains: str, version: int) -> Check:
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            got = await batch_repo.get(s, queue="demo", id=batch_id(4))
        assert (got.state, got.contains, got.version) == (CREATING, contains, version)
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


V = RequestState.VALIDATED
CREATING, FAILED = BatchState.CREATING, BatchState.FAILED
NEW = "request ``validated``, no claim and no ``creating`` batch of it"
JOIN = NEW + ", a joinable batch"
ALONE = NEW + ", none joinable"
CLAIMED = "request ``validated``, a claim for (request, cause) exists (found in that transaction)"
EXISTING = ("request ``validated``, a ``creating`` batch of it exists (also batches from "
            "before claims)")

TABLE = StateTable(batch, [
    *[Case("request halted", request_in(st), MSG, name=st.value, published=[],
           writes_nothing=True)
      for st in (RequestState.CANCELLING, RequestState.LANDED, RequestState.ERROR,
                 RequestState.CANCELLED)],
    Case(ALONE, request_in(V), MSG, name="mints-the-first-batch", published=handed_off(1),
         check=both(batches_are((1, CREATING)), claimed(1), batching_log(1, NOW_MS))),
    Case(JOIN, open_batch(), MSG, name="joins-the-open-batch", published=handed_off(4),
         check=both(open_batch_is("demo/2", R, version=2), claimed(4),
                    batching_log(4, NOW_MS))),
    Case(ALONE, open_batch(age_ms=61_000), MSG, name="the-open-batch-waited-too-long",
         published=handed_off(5),
         check=both(batches_are((5, CREATING)), claimed(5),
                    open_batch_is("demo/2", version=1))),
    Case(ALONE, open_batch(size=4), MSG, name="the-open-batch-is-full",
         published=handed_off(5),
         check=both(batches_are((5, CREATING)), claimed(5),
                    open_batch_is("demo/2", "demo/3", "demo/4", "demo/5", version=1))),
    Case(ALONE, open_batch(max_size=1), MSG, name="batching-is-off",
         published=handed_off(5), check=both(batches_are((5, CREATING)), claimed(5))),
    Case(ALONE, request_in(V, minted=4), MSG, name="mints-the-next-number",
         published=handed_off(5),
         check=both(batches_are((5, CREATING)), claimed(5), batching_log(5, NOW_MS))),
    # A batch of it that is no longer ``creating`` is not its batching intent.
    Case(ALONE, request_in(V, minted=2, batches=((2, FAILED),)), MSG,
         name="a-failed-batch-is-not-reused", published=handed_off(3),
         check=both(batches_are((2, FAILED), (3, CREATING)), claimed(3))),
    Case(CLAIMED, request_in(V, minted=3, batches=((3, CREATING),), claim=3,
                             stale="for_request"), MSG, name="uses-the-claimed-batch",
         published=handed_off(3), writes_nothing=True,
         check=both(batches_are((3, CREATING)), batching_log(3, T0))),
    # Both runs passed the claim lookup: the insert that loses returns the winner's batch.
    # The number this run minted is spent; no batch is created under it.
    Case(CLAIMED, request_in(V, minted=3, batches=((3, CREATING),), claim=3,
                             stale="claimed"), MSG, name="loses-the-claim-insert",
         published=handed_off(3),
         check=both(batches_are((3, CREATING)), claimed(3), batching_log(3, T0))),
    Case(EXISTING, request_in(V, minted=3, batches=((3, CREATING),)), MSG,
         name="from-before-claims", published=handed_off(3), writes_nothing=True,
         check=both(claimed(None), batching_log(3, T0))),
    Case(EXISTING, request_in(V, minted=3, batches=((3, CREATING),), claim=3), MSG,
         name="claimed", published=handed_off(3), writes_nothing=True,
         check=batching_log(3, T0)),
    Case(EXISTING, request_in(V, minted=3, batches=((2, CREATING), (3, CREATING))), MSG,
         name="the-latest-of-two", published=handed_off(3), writes_nothing=True),
    Case("request ``batched``", request_in(RequestState.BATCHED, batches=((1, CREATING),)),
         MSG, published=[], writes_nothing=True),
    Case("request ``started`` / missing", request_in(RequestState.STARTED), MSG,
         name="started", raises=InvalidState, published=[]),
    Case("request ``started`` / missing", lambda rig: rig.request(2, V), MSG, name="missing",
         raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, BatchController, "batch"))
