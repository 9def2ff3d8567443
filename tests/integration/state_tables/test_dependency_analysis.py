"""``dependency_analysis``'s state table, row by row (app/controllers/dependency_analysis.py).

The analysed batch is batch 5 (requests 5 and 6); batches 1-4 are ahead of it, each
with one request of the same number. Changed files are claimed with the requests, and
the demo queue's analyzer (``pathoverlap`` by directory) decides the conflicts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any
from unittest import mock

from app.controllers import dependency_analysis
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import requests as request_repo
from app.domain.entities import ChangeDetails, ChangedFile, LandRequest
from app.domain.errors import NotFound, VersionMismatch
from app.domain.queue_config import BatchingConfig
from app.domain.states import BatchState, LandStrategy, RequestState
from app.extensions.base import BatchChanges
from tests.support.controllers import (
    NOW_MS,
    Case,
    Check,
    FakeDelivery,
    Rig,
    Seed,
    StateTable,
    batch_id,
    change_uri,
)
from tests.support.tables import table_tests

B = batch_id(5)
MSG = {"id": B, "queue": "demo"}
T0 = NOW_MS - 60_000  # batch 5 created
T1 = NOW_MS - 30_000  # batch 5 made ``created`` (when seeded past ``creating``)
V = RequestState.VALIDATED
Member = tuple[RequestState, int] | None  # (state, version), or no request row


async def claim_files(rig: Rig, n: int, *files: str) -> None:
    async with rig.db.write() as s:
        await change_repo.claim(s, queue="demo", request_id=f"demo/{n}", details=[
            ChangeDetails(uri=change_uri(n), changed_files=tuple(ChangedFile(f) for f in files))
        ], now_ms=T0)


def world(state: BatchState, members: Sequence[Member] = ((V, 2), (V, 2)), *,
          ahead: Sequence[tuple[BatchState, str]] = (), dependencies: tuple[str, ...] = (),
          stale: dict[int, LandRequest] | None = None,
          batching: BatchingConfig | None = None, newer: bool = False,
          part: bool = False) -> Seed:
    """Batch 5 in ``state`` holding requests 5 and 6 (``members``: each one's state and
    version) that change ``a/new.py`` and ``c/other.py``; ``ahead``: batches 1, 2, ...
    each in its state, with one request changing the file named. Batch 5 is created at
    ``T0``; seeded past ``creating`` it was made ``created`` at ``T1`` (v2), with
    ``dependencies``. ``stale``: ``get_many`` hands out these copies instead.
    ``batching``: the queue's setting; ``newer``: an empty ``creating`` batch 7 is newer;
    ``part``: batch 5 is a bisection part of batch 4 (its members claimed ``split:4``)."""
    async def seed(rig: Rig) -> None:
        if batching is not None:
            rig.configure(batching=batching)
        rig.broker.now_ms = T0
        for n, (st, file) in enumerate(ahead, start=1):
            req = await rig.request(n, RequestState.BATCHED, version=3)
            await claim_files(rig, n, file)
            await rig.batch(n, st, [req])
        contains = []
        for n, m in zip((5, 6), members, strict=True):
            contains.append(f"demo/{n}")
            if m is not None:
                await rig.request(n, m[0], version=m[1])
                await claim_files(rig, n, "a/new.py" if n == 5 else "c/other.py")
        batch = await rig.batch(5, BatchState.CREATING if state is BatchState.CREATING
                                else BatchState.CREATED, contains)
        if newer:
            await rig.batch(7, BatchState.CREATING, [])
        if part:
            async with rig.db.write() as s:
                for m in contains:
                    await batch_repo.claim(s, queue="demo", request_id=m, cause="split:4",
                                           batch_id=B, now_ms=T0)
        if state is not BatchState.CREATING:
            async with rig.db.write() as s:
                await batch_repo.update(s, old=batch, new=replace(
                    batch, state=state, version=2, dependencies=dependencies), now_ms=T1)
        rig.broker.now_ms = NOW_MS
        if stale:
            rig.stack.enter_context(mock.patch.object(
                request_repo, "get_many", new=Stale(request_repo.get_many, stale)))
    return seed


class Stale:
    def __init__(self, real: Callable[..., Awaitable[dict[str, LandRequest]]],
                 copies: dict[int, LandRequest]) -> None:
        self.real, self.copies = real, copies

    async def __call__(self, session: Any, **kwargs: Any) -> dict[str, LandRequest]:
        found = await self.real(session, **kwargs)
        return {**found, **{c.id: c for c in self.copies.values() if c.id in found}}


def stale_validated(n: int) -> dict[int, LandRequest]:
    """Request ``n`` as it was before a cancel (``validated`` v2)."""
    return {n: LandRequest(queue="demo", id=f"demo/{n}", change_uris=(change_uri(n),),
                           strategy=LandStrategy.REBASE, state=V, version=2)}


def logged(*, speculate: bool = True,
           members: Sequence[int] = (5, 6)) -> list[tuple[str, str, str]]:
    logs = [("log", f"demo/{n}", f"demo/{n}/batched/{B}") for n in members]
    return [*logs, ("speculate", "demo", B)] if speculate else logs


def enrolled(*dependencies: int, members: Sequence[int] = (5, 6), version: int = 3) -> Check:
    """Batch 5 is ``created`` (v2, written now) with these direct dependencies, holding
    ``members``, each ``batched`` (``version``); the logs and the wake-up say so."""
    deps = [batch_id(d) for d in dependencies]

    async def check(rig: Rig) -> None:
        rig.stack.close()
        b = await rig.get_batch(5)
        assert (b.state, b.version, list(b.dependencies), b.updated_at_ms, b.contains) == (
            BatchState.CREATED, 2, deps, NOW_MS, tuple(f"demo/{n}" for n in members))
        for n in members:
            r = await rig.get_request(n)
            assert (r.state, r.version) == (RequestState.BATCHED, version)
        await batched_logs(NOW_MS, deps, members)(rig)
        assert rig.broker.payload("speculate", B) == {"id": B, "queue": "demo"}
        async with rig.db.read() as s:
            for n in {5, 6} - set(members):  # left the batch
                assert B not in [x.id for x in await batch_repo.for_request(
                    s, queue="demo", request_id=f"demo/{n}")]
    return check


def batched_logs(at_ms: int, deps: list[str], members: Sequence[int] = (5, 6)) -> Check:
    async def check(rig: Rig) -> None:
        for n in members:
            p = rig.broker.payload("log", f"demo/{n}/batched/{B}")
            assert (p["status"], p["timestamp_ms"], p["metadata"]) == (
                "batched", at_ms, {"batch_id": B, "dependencies": deps})
    return check


def analysed(*ahead: int) -> Check:
    """The analyzer saw batch 5's files against exactly these in-flight batches."""
    async def check(rig: Rig) -> None:
        (call,) = rig.seam("analyzer").called("analyze")
        candidate, in_flight = call
        assert candidate == BatchChanges(B, ("a/new.py", "c/other.py"))
        assert [b.batch_id for b in in_flight] == [batch_id(n) for n in ahead]
    return check


def untouched(state: BatchState = BatchState.CREATING, analyser: bool = False) -> Check:
    async def check(rig: Rig) -> None:
        rig.stack.close()
        assert (await rig.get_batch(5)).state is state
        if not analyser:
            assert rig.calls() == {}
    return check


async def retry_drops_the_cancelled(rig: Rig) -> None:
    """The retry reads the cancel: request 6 leaves, request 5 is enrolled alone."""
    rig.stack.close()
    await DependencyAnalysisController(rig.deps).process(
        FakeDelivery("dependency_analysis", MSG, attempt=2))
    assert rig.broker.keys() == logged(members=(5,))
    await enrolled(members=(5,))(rig)
    assert (await rig.get_request(6)).state is RequestState.CANCELLING


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


SP, MG, CR = BatchState.SPECULATING, BatchState.MERGING, BatchState.CREATED
AHEAD = ((SP, "a/x.py"), (MG, "b/y.py"), (CR, "a/z.py"), (BatchState.FAILED, "a/w.py"))
ENROL = "batch ``creating``, members ``validated`` (a bisection part's: ``batched``)"
SOME = ("batch ``creating``, some members halted or not ``validated``/``batched`` as "
        "above, some ready")
ABANDON = "batch ``creating``, no member ready"
FORMING = ("batch ``creating`` of new requests still forming: ``batching.max_size`` > 1, "
           "``normal``, fewer members than the size limit, younger than ``max_wait_ms``, "
           "no newer ``creating`` batch in the queue")
WAITS = BatchingConfig(max_size=4, max_wait_ms=120_000)  # batch 5 has 60 s left
REPLAYS = "batch ``speculating`` / ``merging`` / ``cancelling``"

BEHIND = "batch ``creating`` as above, newer ``creating`` batches behind it"


def behind(*waiting: tuple[int, RequestState, str], left: int = 0) -> Seed:
    """``world`` (batch 5 ``creating``, batch 1 speculating on ``a/x.py`` ahead), and
    behind batch 5 the ``creating`` batches ``n``, each holding request ``n`` in its
    state and changing the file named; batch ``left`` also holds request 9, which a
    cancel halted."""
    base = world(BatchState.CREATING, ahead=((SP, "a/x.py"),))

    async def seed(rig: Rig) -> None:
        await base(rig)
        rig.broker.now_ms = T0
        for n, st, file in waiting:
            req = await rig.request(n, st, version=2)
            await claim_files(rig, n, file)
            extra = [await rig.request(9, RequestState.CANCELLING)] if n == left else []
            await rig.batch(n, BatchState.CREATING, [req, *extra])
        rig.broker.now_ms = NOW_MS
    return seed


def enrolled_behind(created: dict[int, list[int]], creating: Sequence[int] = ()) -> Check:
    """Batch 5 enrolled (depending on batch 1), and behind it the ``created`` batches
    with their dependencies and the ``creating`` ones left alone (their wake-ups are
    the row's ``published``)."""
    async def check(rig: Rig) -> None:
        await enrolled(1)(rig)
        for n, deps in created.items():
            b = await rig.get_batch(n)
            assert (b.state, list(b.dependencies)) == (
                BatchState.CREATED, [batch_id(d) for d in deps])
            assert (await rig.get_request(n)).state is RequestState.BATCHED
        for n in creating:
            assert (await rig.get_batch(n)).state is BatchState.CREATING
    return check


def logged_behind(*enrolled_ns: int, woken: bool = True) -> list[tuple[str, str, str]]:
    """``woken`` false: what a redelivery after a crash before the wake-ups repairs
    alone (the batches enrolled ahead are woken by their own deliveries' replays)."""
    logs = [("log", f"demo/{n}", f"demo/{n}/batched/{B}") for n in (5, 6)]
    logs += [("log", f"demo/{n}", f"demo/{n}/batched/{batch_id(n)}") for n in enrolled_ns]
    return [*logs, ("speculate", "demo", B),
            *(("speculate", "demo", batch_id(n)) for n in enrolled_ns if woken)]


TABLE = StateTable(dependency_analysis, [
    Case(ENROL, world(BatchState.CREATING), MSG, name="alone", published=logged(),
         check=both(enrolled(), analysed())),
    # Only in-flight batches count (a failed one does not); of those, the ones sharing
    # a directory with batch 5 (``a/``) are its dependencies, in queue order.
    Case(ENROL, world(BatchState.CREATING, ahead=AHEAD), MSG,
         name="depends-on-the-conflicting-in-flight-batches", published=logged(),
         check=both(enrolled(1, 3), analysed(1, 2, 3))),
    Case(ENROL, world(BatchState.CREATING, ahead=((BatchState.CANCELLING, "a/x.py"),
                                                  (BatchState.CREATING, "a/y.py"))), MSG,
         name="cancelling-and-creating-batches-are-not-in-flight", published=logged(),
         check=both(enrolled(), analysed())),
    Case("batch ``creating``, the claim loses a race (``VersionMismatch``: a cancel, say)",
         world(BatchState.CREATING, ((V, 2), (RequestState.CANCELLING, 3)),
               stale=stale_validated(6)), MSG, raises=VersionMismatch, published=[],
         check=retry_drops_the_cancelled),
    *[Case(SOME, world(BatchState.CREATING, ((V, 2), m)), MSG,
           name=f"member-{m[0].value if m else 'missing'}", published=logged(members=(5,)),
           check=enrolled(members=(5,)))
      for m in [(RequestState.CANCELLING, 3), (RequestState.ERROR, 3),
                (RequestState.STARTED, 1), (RequestState.BATCHED, 3), None]],
    # Batch 7 shares ``a/`` with batches 1 and 5; batch 8 touches nothing in flight.
    Case(BEHIND, behind((7, V, "a/q.py"), (8, V, "z/r.py")), MSG,
         name="enrolled-on-one-read", published=logged_behind(7, 8),
         repaired_as={"speculate": logged_behind(7, 8, woken=False)},
         check=enrolled_behind({7: [1, 5], 8: []})),
    Case(BEHIND, behind((7, RequestState.CANCELLED, "a/q.py"), (8, V, "a/r.py")), MSG,
         name="an-abandoned-one-is-skipped", published=logged_behind(8),
         repaired_as={"speculate": logged_behind(8, woken=False)},
         check=enrolled_behind({8: [1, 5]}, creating=[7])),
    Case(BEHIND, behind((7, V, "a/q.py"), (8, V, "z/r.py"), left=7), MSG,
         name="stops-at-one-a-member-left", published=logged_behind(),
         check=enrolled_behind({}, creating=[7, 8])),
    Case(ABANDON, world(BatchState.CREATING, ((RequestState.CANCELLED, 3), None)), MSG,
         name="none-ready", published=[], writes_nothing=True, check=untouched()),
    # A bisection part's members are ``batched`` already; a ``validated`` one is not its.
    Case(ENROL, world(BatchState.CREATING, ((RequestState.BATCHED, 3),) * 2, part=True),
         MSG, name="a-bisection-part", published=logged(), check=enrolled(version=4)),
    Case(ABANDON, world(BatchState.CREATING, ((V, 2), (V, 2)), part=True), MSG,
         name="a-part-of-validated-requests", published=[], writes_nothing=True,
         check=untouched()),
    Case(FORMING, world(BatchState.CREATING, batching=WAITS), MSG, name="waits-for-more",
         published=[], held=250, writes_nothing=True, check=untouched()),
    Case(FORMING, world(BatchState.CREATING, batching=BatchingConfig(
        max_size=4, max_wait_ms=60_100)), MSG, name="waits-what-is-left", published=[],
         held=100, writes_nothing=True, check=untouched()),
    # Not forming any more: it closes and is analysed.
    *[Case(ENROL, world(BatchState.CREATING, batching=cfg, newer=newer), MSG,
           name=name, published=logged(), check=enrolled())
      for name, cfg, newer in [
          ("waited-long-enough", BatchingConfig(max_size=4, max_wait_ms=60_000), False),
          ("full", BatchingConfig(max_size=2, max_wait_ms=120_000), False),
          ("a-newer-batch-closes-it", WAITS, True),
          ("batching-off", BatchingConfig(max_size=1, max_wait_ms=120_000), False)]],
    Case("batch ``created``", world(CR, ((RequestState.BATCHED, 3),) * 2,
                                    dependencies=(batch_id(1),)), MSG,
         published=logged(), writes_nothing=True,
         check=both(batched_logs(T1, [batch_id(1)]), untouched(CR))),
    # Stamped with the batch's creation time: a late replay never rolls the gateway's
    # projection back past a later status of the batch.
    *[Case(REPLAYS, world(st, ((RequestState.BATCHED, 3),) * 2, dependencies=(batch_id(1),)),
           MSG, name=st.value, published=logged(speculate=False), writes_nothing=True,
           check=both(batched_logs(T0, [batch_id(1)]), untouched(st)))
      for st in (SP, MG, BatchState.CANCELLING)],
    *[Case("batch terminal", world(st, ((RequestState.BATCHED, 3),) * 2), MSG, name=st.value,
           published=[], writes_nothing=True, check=untouched(st))
      for st in (BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLED)],
    Case("batch missing", lambda rig: rig.request(5, V), MSG, raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, DependencyAnalysisController, "dependency_analysis"))


async def test_a_batch_in_flight_has_its_files_read_once_per_process(rig: Rig) -> None:
    """Batch 5 is analysed, then batch 7 by the same controller: the second analysis
    reads the change details of batch 7's member only (batches 1, 2 and 5 are kept by
    id and members), and still finds every conflict, batch 5's included."""
    await world(BatchState.CREATING, ahead=[(BatchState.SPECULATING, "a/x.py"),
                                            (BatchState.CREATED, "c/y.py")])(rig)
    controller = DependencyAnalysisController(rig.deps)
    await controller.process(FakeDelivery("dependency_analysis", MSG))
    req = await rig.request(7, V, version=2)
    await claim_files(rig, 7, "c/w.py")
    await rig.batch(7, BatchState.CREATING, [req])
    asked: list[list[str]] = []
    real = change_repo.details_for

    async def spy(session: Any, **kwargs: Any) -> Any:
        asked.append(list(kwargs["request_ids"]))
        return await real(session, **kwargs)

    with mock.patch.object(change_repo, "details_for", new=spy):
        await controller.process(FakeDelivery("dependency_analysis",
                                              {"id": batch_id(7), "queue": "demo"}))
    assert asked == [["demo/7"]]
    seven = await rig.get_batch(7)
    assert seven.state is BatchState.CREATED and set(seven.dependencies) == {batch_id(2), B}


async def test_batches_waiting_behind_are_enrolled_on_one_read_of_the_queue(rig: Rig) -> None:
    """A backlog of ``creating`` batches costs one read of the batches in flight per
    pass, not one per batch: the queue's depth is paid once for up to ``ENROL_AHEAD``."""
    await behind((7, V, "a/q.py"), (8, V, "z/r.py"))(rig)
    reads = 0
    real = batch_repo.list_kept

    async def spy(session: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(session, **kwargs)

    with mock.patch.object(batch_repo, "list_kept", new=spy):
        await DependencyAnalysisController(rig.deps).process(
            FakeDelivery("dependency_analysis", MSG))
    assert reads == 1
    assert [(await rig.get_batch(n)).state for n in (5, 7, 8)] == [BatchState.CREATED] * 3
