"""``speculate``'s two state tables, row by row (app/controllers/speculate.py): the
pre-step on the message's batch, and the run over the queue.

A small queue is seeded directly: batch ``n`` holds request ``n`` (``batched``), its
path set and the builds linked to its paths (stored at ``T0``, before the run). The
demo queue's constant scorer (0.9) and build budget (4, or less via
``rig.configure``) decide what is funded; the runner is never called (``build``
triggers). Each case names the batch its message is about; a freshly made controller
has no coalescing mark, so every case runs; coalescing and plan errors are tested
after the tables.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.controllers import speculate
from app.controllers.speculate import CONCLUSION_GRACE_MS, SpeculateController
from app.db.repos import batches as batch_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import freezes as freeze_repo
from app.domain.errors import NotFound
from app.domain.freeze import ManualFreeze
from app.domain.states import BatchState, BuildStatus, PathStatus, RequestState
from app.speculation.core import NO_PATH_PASSED
from tests.conftest import BACKENDS
from tests.integration.state_tables.speculate_rig import (
    BUILDING,
    CANCELLING,
    CREATED,
    MERGING,
    P1,
    P2,
    P2F,
    P2S,
    PASSED,
    PENDING,
    RUNNING_1,
    SPEC,
    URL,
    B,
    E,
    S,
    admitted,
    batch_is,
    both,
    build,
    concluded,
    conclusion,
    dispatched,
    entries_are,
    event,
    log,
    merged,
    msg,
    payloads,
    queue,
    rebuilt_counted,
    repair,
    replayed_log,
)
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    FakeDelivery,
    Rig,
    StateTable,
    batch_id,
    crash_points,
    path,
    run_case,
    run_crash_repair,
    run_redelivery,
)

FAILED_BY = f"{NO_PATH_PASSED}; last builds: build-1 (failed, {URL})"
LOST_BY = f"{NO_PATH_PASSED}; last builds: build-1 (errored after 5 attempts, {URL})"
NO_CI = ("no_ci_started: none of the required checks (test) appeared on sq/demo/p-5 within "
         "600 s")
TERMINAL_LIVE = "batch terminal for longer, some member not terminal"
IN_FLIGHT = "batch terminal for less than ``CONCLUSION_GRACE_MS``, some member not terminal"
OUTDATED = ("``speculating``, a path passed or building in an older trunk epoch (its build "
            "ran on a tip the target no longer has: it moved outside the queue)")
NOTHING_YET = "batch ``creating`` / ``speculating`` / ``cancelling``"

NO_BUILDS = "any, the queue frozen with ``allow_builds`` false (``app/controllers/freeze.py``)"


def frozen(seed: Any) -> Any:
    """``seed``, in a queue frozen by hand with ``allow_builds`` false."""
    async def frozen_seed(rig: Any) -> None:
        await seed(rig)
        async with rig.db.write() as s:
            await freeze_repo.save(s, old=None, new=ManualFreeze(
                queue="demo", frozen=True, reason="incident", by="ops", since_ms=1,
                allow_builds=False, version=1, updated_at_ms=1))
    return frozen_seed


TABLE = StateTable(speculate, [
    # -- the pre-step ---------------------------------------------------------------
    *[Case(TERMINAL_LIVE, queue(B(1, st, reason=why)), msg(1), name=f"{st.value}-reconcluded",
           published=[repair(1)], writes_nothing=True, check=conclusion(1, why))
      for st, why in [(BatchState.SUCCEEDED, ""), (BatchState.FAILED, "no path passed"),
                      (BatchState.CANCELLED, "cancelled by request")]],
    # The wake-up after a merge usually runs before the merge's own conclusion ends:
    # no second ``conclude`` beside the one in flight.
    *[Case(IN_FLIGHT, queue(B(1, st), written_ms=NOW_MS - CONCLUSION_GRACE_MS + 1_000),
           msg(1), name=f"{st.value}-left-to-its-conclusion", published=[],
           writes_nothing=True)
      for st in (BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLED)],
    Case(TERMINAL_LIVE, queue(B(1, BatchState.CANCELLED, member=RequestState.CANCELLING)),
         msg(1), name="cancelling-member-reconcluded", published=[repair(1)],
         writes_nothing=True),
    Case("batch terminal, every member terminal",
         queue(B(1, BatchState.SUCCEEDED, member=RequestState.LANDED)), msg(1), published=[],
         writes_nothing=True),
    Case("batch ``created``", queue(B(1, CREATED)), msg(1), name="admitted-and-funded",
         published=[log(1, "speculating"), build(P1)],
         check=both(admitted(1), batch_is(1, SPEC, 3), entries_are(1, (P1, PENDING, 1)))),
    Case("batch ``merging``", queue(B(1, MERGING, entries=(E(P1, PASSED),))), msg(1),
         name="merge-redispatched", published=[log(1, "speculated"),
                                               ("merge", "demo", f"{batch_id(1)}/merge-dispatch")],
         writes_nothing=True, check=dispatched(1, None)),
    Case(NOTHING_YET, queue(B(1, BatchState.CREATING)), msg(1), name="creating-is-inert",
         published=[], writes_nothing=True),
    Case(NOTHING_YET, queue(RUNNING_1), msg(1), name="speculating-with-its-build-running",
         published=[], writes_nothing=True),
    # A cancelling batch whose cancelled build is still running: nothing changes (the
    # entry is not re-stamped on every run).
    Case(NOTHING_YET, queue(B(1, CANCELLING, entries=(
        E(P1, PathStatus.CANCELLING, BuildStatus.RUNNING),))), msg(1),
         name="cancelling-waits-for-its-build", published=[], writes_nothing=True),
    Case("batch missing", queue(RUNNING_1), msg(9), raises=NotFound, published=[]),
    # -- the run ----------------------------------------------------------------------
    Case("``created``", queue(RUNNING_1, B(2, CREATED)), msg(1), name="another-batch-admitted",
         published=[log(2, "speculating"), build(P2)],
         check=both(admitted(2), batch_is(2, SPEC, 3), entries_are(2, (P2, PENDING, 1)),
                    batch_is(1, SPEC, 2))),
    Case("``cancelling``", queue(B(1, CANCELLING, entries=(
        E(P1, BUILDING, BuildStatus.RUNNING),))), msg(1), name="live-build-is-stopped",
         published=[], check=both(entries_are(1, (P1, PathStatus.CANCELLING, 1)),
                                  batch_is(1, CANCELLING, 2))),
    *[Case("``cancelling``", queue(B(1, CANCELLING, entries=es)), msg(1), name=name,
           published=concluded(1),
           check=both(batch_is(1, BatchState.CANCELLED, 3, reason="cancelled by request"),
                      entries_are(1, *[(e.path, PathStatus.CANCELLED, 1) for e in es]),
                      conclusion(1, "cancelled by request")))
      for name, es in [("no-path-set-is-cancelled", ()),
                       ("unlinked-path-is-cancelled", (E(P1, PENDING),)),
                       ("ended-build-is-cancelled", (
                           E(P1, PathStatus.CANCELLING, BuildStatus.CANCELLED),))]],
    Case("``speculating``", queue(B(1, SPEC)), msg(1), name="funds-its-path",
         published=[build(P1)], check=both(entries_are(1, (P1, PENDING, 1)))),
    Case("``speculating``", queue(RUNNING_1, B(2, SPEC), budget=1), msg(2),
         name="no-free-slot-funds-nothing", published=[], writes_nothing=True),
    Case("``speculating``", queue(RUNNING_1, B(2, SPEC), budget=2), msg(2),
         name="a-free-slot-is-funded", published=[build(P2)],
         check=both(entries_are(2, (P2, PENDING, 1)))),
    Case("``speculating``", queue(B(1, SPEC, entries=(E(P1, BUILDING, BuildStatus.SUCCEEDED),))),
         msg(1), name="passed-build-merges", published=merged(1), replays_differ=replayed_log(1),
         check=both(batch_is(1, MERGING, 3), entries_are(1, (P1, PASSED, 1)),
                    dispatched(1, P1))),
    # A dependency that landed settles the path that assumed it would; the sibling that
    # assumed otherwise is stopped.
    Case("``speculating``", queue(B(1, BatchState.SUCCEEDED, member=RequestState.LANDED),
                                  B(2, SPEC, deps=(1,), entries=(
                                      E(P2S, PASSED), E(P2F, BUILDING, BuildStatus.RUNNING)))),
         msg(2), name="settled-assumptions-merge", published=merged(2),
         replays_differ=replayed_log(2),
         check=both(batch_is(2, MERGING, 3, deps=(1,)), dispatched(2, P2S),
                    entries_are(2, (P2S, PASSED, 1), (P2F, PathStatus.CANCELLING, 1)))),
    Case("``speculating``", queue(B(1, SPEC, entries=(
        E(P1, BUILDING, BuildStatus.FAILED),))), msg(1), name="every-path-failed-fails",
         published=concluded(1),
         check=both(batch_is(1, BatchState.FAILED, 3, reason=FAILED_BY),
                    entries_are(1, (P1, PathStatus.FAILED, 1)), conclusion(1, FAILED_BY))),
    Case("``speculating``", queue(B(1, SPEC, entries=(
        E(P1, BUILDING, BuildStatus.ERRORED),))), msg(1), name="errored-build-gets-attempt-2",
         published=[build(P1, 2)], check=both(entries_are(1, (P1, PENDING, 2)))),
    *[Case(OUTDATED, queue(B(1, SPEC, entries=(E(P1, st, bs),)), moved=True), msg(1),
           name=f"{st.value}-in-an-older-epoch-is-rebuilt", published=[build(P1, 2)],
           check=both(entries_are(1, (P1, PENDING, 2)), rebuilt_counted(1)))
      for st, bs in ((PASSED, BuildStatus.SUCCEEDED), (BUILDING, BuildStatus.RUNNING))],
    Case("``speculating``", queue(B(1, SPEC, entries=(
        E(P1, BUILDING, BuildStatus.ERRORED, attempt=5),))), msg(1),
         name="errored-at-the-last-attempt-fails", published=concluded(1),
         check=both(batch_is(1, BatchState.FAILED, 3, reason=LOST_BY),
                    entries_are(1, (P1, PathStatus.FAILED, 5)))),
    # No CI started for its last attempt either: the runner's words lead the failure, so
    # the removal is no_ci_started (app/domain/removals.py), not a failure of the change.
    Case("``speculating``", queue(B(1, SPEC, entries=(
        E(P1, BUILDING, BuildStatus.ERRORED, attempt=5, detail=NO_CI),))), msg(1),
         name="no-ci-started-at-the-last-attempt-fails-so", published=concluded(1),
         check=both(batch_is(1, BatchState.FAILED, 3, reason=f"{NO_CI}; {LOST_BY}"),
                    entries_are(1, (P1, PathStatus.FAILED, 5)))),
    Case("``speculating``", queue(RUNNING_1, B(2, SPEC, deps=(1,), entries=(E(P2S, PASSED),)),
                                  budget=1), msg(2), name="passed-path-waits",
         published=[log(2, "waiting", P2S.id)], writes_nothing=True,
         check=both(event(2, "waiting", P2S))),
    Case("``speculating``", queue(B(1, BatchState.FAILED, member=RequestState.ERROR),
                                  B(2, SPEC, deps=(1,), entries=(E(P2S, PASSED),))), msg(2),
         name="contradicted-passed-path-is-invalidated",
         published=[log(2, "invalidated", P2S.id), build(P2F)],
         check=both(event(2, "invalidated", P2S),
                    entries_are(2, (P2S, PASSED, 1), (P2F, PENDING, 1)))),
    # Both outcomes of batch 1 passed under batch 2: it lands first; batch 1 gains it as
    # a dependency, its old path is stopped and it rebuilds on top of batch 2.
    Case("``speculating``", queue(RUNNING_1, B(2, SPEC, deps=(1,), entries=(
        E(P2S, PASSED), E(P2F, PASSED))), coverage=True), msg(2), name="full-coverage-merges",
         published=[*merged(2), build(path(1, (2, S)))], replays_differ=replayed_log(2),
         check=both(batch_is(2, MERGING, 3, deps=(1,)), batch_is(1, SPEC, 3, deps=(2,)),
                    dispatched(2, P2F, bypass=True, overtaken=[batch_id(1)], rebuilds=1),
                    entries_are(1, (P1, PathStatus.CANCELLING, 1),
                                (path(1, (2, S)), PENDING, 1)))),
    # Frozen without builds: nothing is funded, a retry is written but not dispatched.
    Case(NO_BUILDS, frozen(queue(B(1, SPEC))), msg(1), name="frozen-funds-nothing",
         published=[], writes_nothing=True),
    Case(NO_BUILDS, frozen(queue(B(1, SPEC, entries=(E(P1, BUILDING, BuildStatus.ERRORED),)))),
         msg(1), name="frozen-retry-waits-undispatched", published=[],
         check=both(entries_are(1, (P1, PENDING, 2)))),
    # Its live path holds the only slot: batch 2 waits.
    Case("``merging``", queue(B(1, MERGING, entries=(E(P1, BUILDING, BuildStatus.RUNNING),)),
                              B(2, SPEC), budget=1), msg(2), name="holds-its-budget",
         published=[], writes_nothing=True),
])

def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_both_tables_are_read() -> None:
    rows = TABLE.rows()
    assert "batch missing" in rows and "``merging``" in rows and len(rows) == 13


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", TABLE.cases, ids=lambda c: c.id)
async def test_row(rig: Rig, case: Case) -> None:
    await run_case(rig, SpeculateController(rig.deps), "speculate", case)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
@pytest.mark.parametrize(("case", "crash"), crash_points(TABLE.cases),
                         ids=lambda x: x if isinstance(x, str) else x.id)
async def test_crash_before_publishing_is_repaired(rig: Rig, case: Case, crash: str) -> None:
    """The run publishes its plan's dispatch in the plan's transaction: a crash before
    any of it rolls the plan back, and the redelivery plans and dispatches it whole."""
    await run_crash_repair(rig, SpeculateController(rig.deps), "speculate", case, crash)


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
@pytest.mark.parametrize("case", [c for c in TABLE.cases if c.raises is None],
                         ids=lambda c: c.id)
async def test_a_duplicate_delivery_writes_nothing(rig: Rig, case: Case) -> None:
    await run_redelivery(rig, SpeculateController(rig.deps), "speculate", case)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_stale_merge_redispatch_leaves_the_next_round_its_id(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (``bench.chaos`` seed 1 left a batch ``merging`` for good): the pre-step
    read batch 1 ``merging``; before it re-dispatched, mergesignal sent the batch back to
    speculation (the target moved: an epoch names it, round 1). The stale pre-step sent
    ``merge-dispatch/r1``; the merge consumer acked it (the batch was speculating), and
    round 1's real merge, decided later, was dropped as its duplicate."""
    await queue(B(1, MERGING, entries=(E(P1, PASSED, BuildStatus.SUCCEEDED),)))(rig)
    rounds = epoch_repo.rounds
    moved: list[int] = []

    async def a_move_lands_first(session: Any, *, queue: str, batch_id: str) -> int:
        if not moved:  # mergesignal's move commits between the batch read and this one
            moved.append(1)
            old = await rig.get_batch(1)
            async with rig.db.write() as s:
                await epoch_repo.record(s, queue=queue, tip_sha="e" * 40, batch_id=batch_id,
                                        now_ms=NOW_MS)
                await batch_repo.update(s, old=old, new=replace(old, state=SPEC,
                                                                version=old.version + 1),
                                        now_ms=NOW_MS)
        return await rounds(session, queue=queue, batch_id=batch_id)

    monkeypatch.setattr(epoch_repo, "rounds", a_move_lands_first)
    controller = SpeculateController(rig.deps)
    await controller.process(FakeDelivery("speculate", msg(1)))
    assert moved and payloads(rig, "merge") == [], rig.broker.keys()
    # Round 1's merge, decided later, is dispatched under its own id.
    old = await rig.get_batch(1)
    async with rig.db.write() as s:
        await batch_repo.update(s, old=old, new=replace(old, state=MERGING,
                                                        version=old.version + 1),
                                now_ms=NOW_MS)
    await SpeculateController(rig.deps).process(FakeDelivery("speculate", msg(1)))
    assert rig.broker.payload("merge", f"{batch_id(1)}/merge-dispatch/r1") == msg(1)
