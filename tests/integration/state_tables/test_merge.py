"""``merge``'s state table, row by row (app/controllers/merge.py).

The merger is the demo queue's fake (``merge-conflict-late`` / ``merge-error-late``
markers make the push conflict or fail; a success lands each change as the SHA-1 of
its URI). Merge writes no table: its outcome travels to ``mergesignal``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from app.controllers import merge
from app.controllers.merge import MergeController
from app.db import tables
from app.db.repos import epochs as epoch_repo
from app.db.repos import freezes as freeze_repo
from app.domain.errors import InvalidState, NotFound
from app.domain.freeze import FreezeWindowConfig, ManualFreeze
from app.domain.states import BatchState, LandStrategy, RequestState
from app.extensions.base import MergeSpec, MergeStep
from app.extensions.merger.fake import landed_sha
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
)
from tests.support.tables import table_tests

B = batch_id(1)
MSG = {"id": B, "queue": "demo"}
URIS = {1: (change_uri(1), change_uri(11)), 2: (change_uri(2),)}
CONFLICT = change_uri(2, fake="merge-conflict-late", files="src/a.py")
DOWN = change_uri(2, fake="merge-error-late")
LANDING = [("log", f"demo/{n}", f"demo/{n}/landing/{B}") for n in (1, 2)]
SIGNAL = ("mergesignal", "demo", B)
Member = tuple[RequestState, int] | None
BATCHED: Member = (RequestState.BATCHED, 3)


RESULT_DEFAULTS = {"code": "", "tip": "", "moved": False, "round": 0}  # not untested_tree

def batch_in(state: BatchState, second: Member = BATCHED, *, uri: str | None = None) -> Seed:
    """Batch 1 holding request 1 (two changes) and request 2 (``second``: its state
    and version, or no row; ``uri``: its one change)."""
    async def seed(rig: Rig) -> None:
        await rig.request(1, RequestState.BATCHED, version=3, uris=URIS[1])
        if second is not None:
            await rig.request(2, second[0], version=second[1], uris=(uri or URIS[2][0],))
        await rig.batch(1, state, ["demo/1", "demo/2"], version=4)
    return seed


async def moved_back(rig: Rig) -> None:
    """Batch 1 back to ``speculating``: its merge found the target moved (epoch 1)."""
    await batch_in(BatchState.SPECULATING)(rig)
    async with rig.db.write() as s:
        await epoch_repo.record(s, queue="demo", tip_sha="e" * 40, batch_id=B, now_ms=1)


def spec(second: str = URIS[2][0]) -> MergeSpec:
    return MergeSpec(queue="demo", id=B, steps=(
        MergeStep("demo/1", URIS[1], LandStrategy.REBASE),
        MergeStep("demo/2", (second,), LandStrategy.REBASE)))


def merged(result: dict[str, Any], second: str = URIS[2][0], *, held: int = 1) -> Check:
    """The lease was checked, then the members' changes were merged as one update, in
    order; ``mergesignal`` carries ``result`` (and the landing logs name the batch)."""
    async def check(rig: Rig) -> None:
        assert rig.calls() == {"merger": ["merge"]}
        assert rig.seam("merger").called("merge") == [(spec(second),)]
        assert rig.metrics.timings[-1:] == [("merge", "demo", True)]
        p = rig.broker.payload("mergesignal", B)
        assert p == {"id": B, "queue": "demo", "reason": "", "outputs": [],
                     "conflicting_paths": [], "commits": {}, **RESULT_DEFAULTS, **result}
        for n in (1, 2):
            log = rig.broker.payload("log", f"demo/{n}/landing/{B}")
            assert (log["status"], log["timestamp_ms"], log["metadata"]) == (
                "landing", NOW_MS, {"batch_id": B})
    return check


def refused(reason: str) -> Check:
    """Nothing merged, the lease not even checked: a ``failed`` result naming why."""
    async def check(rig: Rig) -> None:
        assert rig.calls() == {}
        assert rig.broker.payload("mergesignal", B) == {
            "id": B, "queue": "demo", "outcome": "failed", "outputs": [],
            "conflicting_paths": [], "commits": {}, **RESULT_DEFAULTS,
            "reason": f"refused to land: {reason}; a batch lands only while every member "
                      "is live"}
    return check


async def ended_in_round_1(rig: Rig) -> None:
    """Request 2 ended while batch 1 was ``merging`` in its second round (its first merge
    found the target moved: epoch 1 names it)."""
    await batch_in(BatchState.MERGING, (RequestState.ERROR, 4))(rig)
    async with rig.db.write() as s:
        await epoch_repo.record(s, queue="demo", tip_sha="e" * 40, batch_id=B, now_ms=1)


async def refused_in_round_1(rig: Rig) -> None:
    """Regression: the refusal carries the round and its id (``<batch>/r1``); with the
    first round's id and ``round`` 0 it was dropped as a duplicate of round 0's result
    (or ignored as an earlier round's) and the batch stayed ``merging``."""
    assert rig.calls() == {}
    p = rig.broker.payload("mergesignal", f"{B}/r1")
    assert (p["outcome"], p["round"]) == ("failed", 1)
    assert p["reason"].startswith("refused to land: demo/2 is error")


def not_merged(rig_calls: dict[str, list[str]] | None = None) -> Check:
    async def check(rig: Rig) -> None:
        assert rig.calls() == (rig_calls or {})
    return check


def commits(*ns: int, second: str = URIS[2][0]) -> dict[str, list[str]]:
    uris = {1: URIS[1], 2: (second,)}
    return {f"demo/{n}": [landed_sha(u) for u in uris[n]] for n in ns}


SHAS = [landed_sha(u) for u in (*URIS[1], *URIS[2])]
LIVE = "batch ``merging``, every member live"
FROZEN = ("batch ``merging``, every member live, the queue frozen "
          "(``app/controllers/freeze.py``: a manual freeze or a ``freeze_windows`` window), "
          "unless the freeze has ``allow_hotfix`` and every member is a ``hotfix``")


async def in_window(rig: Rig) -> None:
    """Batch 1 ready to land inside a window of queues.yaml: NOW_MS is 2023-11-14
    22:13:20 UTC, the window runs 22:13:00-22:13:21."""
    await batch_in(BatchState.MERGING)(rig)
    rig.deps.freeze_windows = {"demo": (FreezeWindowConfig(
        cron="13 22 14 11 *", duration="21s", reason="weekly freeze"),)}


def frozen(until_ms: int = 0, *, since_ms: int = NOW_MS - 1000, hotfix: int = 0,
           allow_hotfix: bool = False) -> Seed:
    """Batch 1 ready to land in a queue frozen by hand (``until_ms`` 0: until unfrozen);
    ``hotfix`` of its two members are ``hotfix`` requests."""
    async def seed(rig: Rig) -> None:
        await batch_in(BatchState.MERGING)(rig)
        async with rig.db.write() as s:
            await freeze_repo.save(s, old=None, new=ManualFreeze(
                queue="demo", frozen=True, reason="release", by="ops", since_ms=since_ms,
                until_ms=until_ms, allow_hotfix=allow_hotfix, version=1,
                updated_at_ms=since_ms, updated_by="ops"))
            for n in range(1, hotfix + 1):
                await s.execute(sa.update(tables.requests).where(
                    tables.requests.c.id == f"demo/{n}").values(priority="hotfix"))
    return seed
ENDED = "batch ``merging``, a member terminal or missing"

TABLE = StateTable(merge, [
    Case(LIVE, batch_in(BatchState.MERGING), MSG, name="lands-with-the-commits-of-each-member",
         published=[*LANDING, SIGNAL], writes_nothing=True,
         check=merged({"outcome": "succeeded", "outputs": SHAS, "commits": commits(1, 2)})),
    # A merge that won a cancel's race still lands the cancelling member.
    Case(LIVE, batch_in(BatchState.MERGING, (RequestState.CANCELLING, 4)), MSG,
         name="a-cancelling-member-is-live", published=[*LANDING, SIGNAL],
         check=merged({"outcome": "succeeded", "outputs": SHAS, "commits": commits(1, 2)})),
    Case(LIVE, batch_in(BatchState.MERGING, uri=CONFLICT), MSG,
         name="a-conflict-is-a-failed-result-without-commits", published=[*LANDING, SIGNAL],
         check=merged({"outcome": "failed", "conflicting_paths": ["src/a.py"],
                       "reason": f"merge conflict in src/a.py (change {CONFLICT})"},
                      CONFLICT)),
    # Infrastructure errors propagate (the queue retries): no result is published.
    Case(LIVE, batch_in(BatchState.MERGING, uri=DOWN), MSG, name="merger-down-is-retried",
         raises=ConnectionError, published=LANDING, check=not_merged({"merger": ["merge"]})),
    Case(LIVE, batch_in(BatchState.MERGING), MSG, name="a-lost-lease-never-pushes",
         delivery={"lease_lost": True}, raises=LeaseLost, published=LANDING,
         check=not_merged()),
    # Frozen: held (no attempt), nothing logged, merged or published; the batch stays.
    Case(FROZEN, frozen(), MSG, name="frozen-until-unfrozen-is-held-for-the-recheck",
         published=[], held=2000, writes_nothing=True, check=not_merged()),
    Case(FROZEN, frozen(NOW_MS + 500), MSG, name="frozen-until-soon-is-held-until-then",
         published=[], held=500, writes_nothing=True, check=not_merged()),
    Case(FROZEN, in_window, MSG, name="a-window-holds-until-it-ends", published=[], held=1000,
         writes_nothing=True, check=not_merged()),
    Case(FROZEN, frozen(hotfix=2), MSG, name="hotfixes-wait-without-allow-hotfix",
         published=[], held=2000, writes_nothing=True, check=not_merged()),
    Case(FROZEN, frozen(hotfix=1, allow_hotfix=True), MSG,
         name="a-normal-member-holds-a-hotfix-batch", published=[], held=2000,
         writes_nothing=True, check=not_merged()),
    Case(LIVE, frozen(hotfix=2, allow_hotfix=True), MSG,
         name="a-batch-of-hotfixes-lands-through-allow-hotfix", published=[*LANDING, SIGNAL],
         check=merged({"outcome": "succeeded", "outputs": SHAS, "commits": commits(1, 2)})),
    Case(LIVE, frozen(NOW_MS), MSG, name="a-freeze-whose-until-passed-lands",
         published=[*LANDING, SIGNAL],
         check=merged({"outcome": "succeeded", "outputs": SHAS, "commits": commits(1, 2)})),
    *[Case(ENDED, batch_in(BatchState.MERGING, (st, 4)), MSG, name=f"member-{st.value}",
           published=[SIGNAL], writes_nothing=True, check=refused(f"demo/2 is {st.value}"))
      for st in (RequestState.ERROR, RequestState.LANDED, RequestState.CANCELLED)],
    Case(ENDED, ended_in_round_1, MSG, name="member-error-in-a-later-round",
         published=[("mergesignal", "demo", f"{B}/r1")], writes_nothing=True,
         check=refused_in_round_1),
    Case(ENDED, batch_in(BatchState.MERGING, None), MSG, name="member-missing",
         published=[SIGNAL], writes_nothing=True, check=refused("demo/2 is missing")),
    *[Case("batch terminal or halted", batch_in(st), MSG, name=st.value, published=[],
           writes_nothing=True, check=not_merged())
      for st in (BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLED,
                 BatchState.CANCELLING)],
    Case("batch ``speculating`` after a move of the target sent it back (a trunk epoch "
         "names it)", moved_back, MSG, name="a-round-a-move-ended", published=[],
         writes_nothing=True, check=not_merged()),
    *[Case("batch ``creating`` / ``created``, or ``speculating`` with no move on record",
           batch_in(st), MSG, name=st.value, raises=InvalidState, published=[],
           check=not_merged())
      for st in (BatchState.CREATING, BatchState.CREATED, BatchState.SPECULATING)],
    Case("batch missing", lambda rig: rig.request(1, RequestState.BATCHED), MSG,
         raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def lease_checked_before_merge(rig: Rig, case: Case, delivery: FakeDelivery) -> None:
    """The lease is checked right before the push, and only when there is one to make."""
    assert delivery.lease_checks == (1 if rig.seam("merger").called("merge")
                                     or case.raises is LeaseLost else 0)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, MergeController, "merge", after=lease_checked_before_merge))
