"""``build``'s state table, row by row (app/controllers/build.py).

Batch 2 (request 2) depends on batch 1 (request 1, two changes) and batch 3; its path
``P`` assumes batch 1 lands and batch 3 fails, so it builds on batch 1's changes. The
runner is scripted: ``trigger`` returns ``build-7`` (or raises), and every call is
recorded. The concurrent-trigger rows hand ``build`` a stale link read: the other
trigger's link is committed, but ``get_link`` read before it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

import pytest

from app.controllers import build
from app.controllers.build import BuildController
from app.db.repos import speculation as spec_repo
from app.domain.errors import NotFound
from app.domain.states import (
    Assumption,
    BatchState,
    BuildStatus,
    LandStrategy,
    PathStatus,
    RequestState,
)
from app.extensions.base import BuildRequest, MergeStep
from app.queue import LeaseLost
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
    entry,
    path,
)
from tests.support.tables import table_tests

B = batch_id(2)
P = path(2, (1, Assumption.SUCCEEDS), (3, Assumption.FAILS))
OTHER = path(2, (1, Assumption.FAILS), (3, Assumption.FAILS))
MSG = {"id": B, "queue": "demo", "path_id": P.id, "attempt": 1}
T0 = NOW_MS - 90_000  # the batches' creation time
URIS = {1: (change_uri(1), change_uri(11)), 2: (change_uri(2),), 3: (change_uri(3),)}
REQUEST = BuildRequest(queue="demo", batch_id=B, path_id=P.id, attempt=1,
                       base_changes=URIS[1], head_changes=URIS[2], batch_created_at_ms=T0,
                       steps=(MergeStep("demo/1", URIS[1], LandStrategy.REBASE),
                              MergeStep("demo/2", URIS[2], LandStrategy.REBASE)))


def signal(*builds: str) -> list[tuple[str, str, str]]:
    return [("buildsignal", b, b) for b in builds]


def world(state: BatchState = BatchState.SPECULATING, status: PathStatus | None =
          PathStatus.PENDING, *, attempt: int = 1, of: Any = P, linked: str | None = None,
          stale_link: bool = False, trigger: Any = "build-7", loser: str | None = None,
          loser_status: BuildStatus = BuildStatus.ACCEPTED) -> Seed:
    """Batches 1-3 (created at ``T0``), batch 2 in ``state`` with one entry (``of``, in
    ``status`` at ``attempt``; no path set if ``status`` is None). ``linked``: a build
    of (P, 1) stored and linked (by another trigger); ``stale_link``: ``build`` does not
    see that link; ``loser``: a build of (P, 1) stored unlinked, in ``loser_status``;
    the runner's ``trigger`` returns (or raises) ``trigger``."""
    async def seed(rig: Rig) -> None:
        rig.broker.now_ms = T0
        for n in (1, 2, 3):
            req = await rig.request(n, RequestState.BATCHED, version=3, uris=URIS[n])
            await rig.batch(n, state if n == 2 else BatchState.SPECULATING, [req],
                            dependencies=(batch_id(1), batch_id(3)) if n == 2 else ())
        rig.broker.now_ms = NOW_MS
        if status is not None:
            await rig.path_set(2, [entry(of, status, attempt)])
        if linked is not None:
            await rig.build(linked, 2, BuildStatus.RUNNING, path_id=P.id, version=2)
        if loser is not None:
            await rig.build(loser, 2, loser_status, path_id=P.id, link=False)
        if stale_link:
            rig.stack.enter_context(mock.patch.object(
                spec_repo, "get_link", new=FirstReadMisses(spec_repo.get_link)))
        rig.seam("runner").script(trigger=trigger)
    return seed


class FirstReadMisses:
    """``get_link`` whose first read (the controller's) misses the committed link; the
    link's own read-back inside ``spec_repo.link`` sees it."""

    def __init__(self, real: Callable[..., Awaitable[str | None]]) -> None:
        self.real, self.calls = real, 0

    async def __call__(self, session: Any, **kwargs: Any) -> str | None:
        self.calls += 1
        return None if self.calls == 1 else await self.real(session, **kwargs)


def lost_reply() -> Seed:
    """A first delivery sent the trigger, but its reply was lost (the runner raised
    after accepting it); the runner answers the redelivery with the build it started."""
    async def seed(rig: Rig) -> None:
        await world(trigger=TimeoutError("no reply from CI"))(rig)
        with pytest.raises(TimeoutError):
            await BuildController(rig.deps).process(FakeDelivery("build", MSG))
        rig.seam("runner").script(trigger="build-7")
    return seed


def triggered(times: int = 1) -> Check:
    """The runner was asked to build exactly ``REQUEST`` (every time the same), and
    ``build-7`` is stored ``accepted`` (v1) and linked to (P, 1)."""
    async def check(rig: Rig) -> None:
        assert rig.seam("runner").called() == [(REQUEST,)] * times
        await stored("build-7")(rig)
    return check


def stored(build_id: str, link: str | None = None) -> Check:
    async def check(rig: Rig) -> None:
        rig.stack.close()  # the race is over: real reads
        b = await rig.get_build(build_id)
        assert (b.batch_id, b.path_id, b.attempt) == (B, P.id, 1)
        if build_id == "build-7":
            assert (b.status, b.version) == (BuildStatus.ACCEPTED, 1)
        async with rig.db.read() as s:
            held = await spec_repo.get_link(s, queue="demo", path_id=P.id, attempt=1)
        assert held == (link or build_id)
        for p in rig.broker.published:
            assert p.payload == {"id": p.message_id, "queue": "demo"}
    return check


def nothing_asked(rig_calls: dict[str, list[str]] | None = None) -> Check:
    async def check(rig: Rig) -> None:
        assert rig.calls() == (rig_calls or {})
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


PENDING = "entry ``pending``, no link"
RESENT = ("entry ``pending``, no link, trigger already sent (a redelivery after a lost "
          "reply, a retryable error, or a crash before the link)")

TABLE = StateTable(build, [
    *[Case("batch halted", world(st), MSG, name=f"batch-{st.value}", published=[],
           writes_nothing=True, check=nothing_asked())
      for st in (BatchState.CANCELLING, BatchState.CANCELLED, BatchState.FAILED,
                 BatchState.SUCCEEDED)],
    Case("no path set, no entry, or another attempt", world(status=None), MSG,
         name="no-path-set", published=[], writes_nothing=True, check=nothing_asked()),
    Case("no path set, no entry, or another attempt", world(of=OTHER), MSG, name="no-entry",
         published=[], writes_nothing=True, check=nothing_asked()),
    Case("no path set, no entry, or another attempt", world(attempt=2), MSG,
         name="another-attempt", published=[], writes_nothing=True, check=nothing_asked()),
    Case(PENDING, world(), MSG, name="triggers-on-the-assumed-base", published=signal("build-7"),
         check=triggered()),
    # The other trigger linked first: both are signalled, buildsignal cancels the loser.
    Case(PENDING, world(linked="build-8", stale_link=True), MSG,
         name="a-concurrent-trigger-linked-first", published=signal("build-7", "build-8"),
         check=both(stored("build-7", link="build-8"), stored("build-8"))),
    Case(PENDING, world(), MSG, name="a-lost-lease-never-triggers",
         delivery={"lease_lost": True}, raises=LeaseLost, published=[],
         check=nothing_asked()),
    Case(PENDING, world(trigger=ConnectionError("ci down")), MSG, name="ci-down-is-retried",
         raises=ConnectionError, published=[], check=nothing_asked({"runner": ["trigger"]})),
    Case(RESENT, lost_reply(), MSG, name="same-request-after-a-lost-reply",
         delivery={"attempt": 2}, published=signal("build-7"), check=triggered(times=2)),
    # The build the runner names is the one the other run already stored and linked.
    Case(RESENT, world(linked="build-7", stale_link=True), MSG,
         name="same-build-id-stored-and-linked", published=signal("build-7"),
         writes_nothing=True, check=nothing_asked({"runner": ["trigger"]})),
    *[Case("entry live, link exists", world(status=st, linked="build-5"), MSG,
           name=f"entry-{st.value}",
           published=signal("build-5"), writes_nothing=True, check=nothing_asked())
      for st in (PathStatus.PENDING, PathStatus.BUILDING, PathStatus.CANCELLING)],
    # The state a crash leaves between a lost link race's write and its signals: the
    # loser is stored but unlinked; the redelivery signals it too, or nothing would ever
    # poll or cancel it.
    Case("entry live, link exists", world(linked="build-8", loser="build-7"), MSG,
         name="a-losing-build-left-unsignalled-is-signalled",
         published=signal("build-8", "build-7"), writes_nothing=True, check=nothing_asked()),
    Case("entry live, link exists", world(linked="build-8", loser="build-7",
                                          loser_status=BuildStatus.CANCELLED), MSG,
         name="a-finished-losing-build-is-left", published=signal("build-8"),
         writes_nothing=True, check=nothing_asked()),
    *[Case("entry ``building`` / ``cancelling``, no link", world(status=st), MSG,
           name=f"entry-{st.value}-unlinked", published=[], writes_nothing=True,
           check=nothing_asked())
      for st in (PathStatus.BUILDING, PathStatus.CANCELLING)],
    *[Case("entry terminal", world(status=st, linked="build-5"), MSG, name=f"entry-{st.value}",
           published=[], writes_nothing=True, check=nothing_asked())
      for st in (PathStatus.PASSED, PathStatus.FAILED, PathStatus.CANCELLED)],
    Case("batch missing", world(), {**MSG, "id": batch_id(9)}, raises=NotFound, published=[],
         check=nothing_asked()),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_path_and_batch_state() -> None:
    named = {c.id.removesuffix("-unlinked") for c in TABLE.cases}
    assert {s for s in PathStatus if f"entry-{s.value}" in named} == set(PathStatus)
    halted = {s for s in BatchState if f"batch-{s.value}" in named}
    assert halted == {s for s in BatchState if s.halted}


def lease_checked_before_trigger(rig: Rig, case: Case, delivery: FakeDelivery) -> None:
    """The lease is checked right before the trigger, and only when there is one to send."""
    assert delivery.lease_checks == (1 if rig.seam("runner").called("trigger")
                                     or case.raises is LeaseLost else 0)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, BuildController, "build", after=lease_checked_before_trigger))
