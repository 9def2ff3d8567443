"""``mergesignal``'s state table, row by row (app/controllers/mergesignal.py)."""

from __future__ import annotations

from app.controllers import mergesignal
from app.controllers.mergesignal import MergeSignalController
from app.db.repos import epochs as epoch_repo
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
             members: int = 1, landed: dict[str, tuple[str, ...]] | None = None,
             moves: int = 0):
    """Batch 1; ``moves``: how many moves of the target its merges found before."""
    async def seed(rig: Rig) -> None:
        reqs = [await rig.request(n, RequestState.BATCHED, version=2)
                for n in range(1, members + 1)]
        await rig.batch(1, state, reqs, version=version, landed=landed)
        for _ in range(moves):
            async with rig.db.write() as s:
                await epoch_repo.record(s, queue="demo", tip_sha="d" * 40, batch_id=B,
                                        now_ms=1)
    return seed


UNTESTED_MOVED = {"id": B, "queue": "demo", "outcome": "failed", "reason": "untested_tree: x",
                  "code": "untested_tree", "tip": "e" * 40, "moved": True}
SUPERSEDED = "batch ``merging``, result of an earlier round (``round`` below the batch's)"
MOVED = ("batch ``merging``, failed ``untested_tree`` with ``moved`` (the target is at a tip "
         "no passed build started from: it moved outside the queue)")
REPLAY_MOVED = ("batch ``speculating``, a move its merge found on record (an "
                "``untested_tree`` result already applied)")


def untested_logs(round_: int) -> list[tuple[str, str, str]]:
    return [("log", "demo/1", f"demo/1/untested_tree/{B}/r{round_}")]


def epoch_is(epoch: int, tip: str):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            latest = await epoch_repo.latest(s, queue="demo")
        assert (latest.epoch, latest.tip_sha) == (epoch, tip) if latest else epoch == 0
    return check


async def landed_elsewhere(rig: Rig) -> None:
    await batch_in(BatchState.MERGING)(rig)
    other = await rig.request(7, RequestState.LANDED, version=2)
    await rig.batch(7, BatchState.SUCCEEDED, [other], landed={"demo/7": ("e" * 40,)})


def own_epoch(epoch: int):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            epochs = await epoch_repo.refuting(s, queue="demo")
        assert (epochs.outside, epochs.of(B)) == (0, epoch)
    return check


def metric(expected: list[tuple[str, bool]]):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        assert rig.metrics.untested == expected
    return check


def both(*checks):  # type: ignore[no-untyped-def]
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


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
    Case("batch ``merging``, otherwise", batch_in(BatchState.MERGING), OK, name="merging-succeeded",
         published=FANOUT, check=batch_is(BatchState.SUCCEEDED, 4, landed=LANDED)),
    # A member the merger named no commit for is recorded with none.
    Case("batch ``merging``, otherwise", batch_in(BatchState.MERGING, members=2), OK,
         name="merging-succeeded-member-without-commits", published=FANOUT,
         check=batch_is(BatchState.SUCCEEDED, 4, landed={**LANDED, "demo/2": ()})),
    Case("batch ``merging``, otherwise", batch_in(BatchState.MERGING), BAD, name="merging-failed",
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
    Case(SUPERSEDED, batch_in(BatchState.MERGING, moves=1), BAD, name="an-earlier-round",
         published=[], writes_nothing=True, check=batch_is(BatchState.MERGING, 3)),
    Case(MOVED, batch_in(BatchState.MERGING), UNTESTED_MOVED, name="moved-is-a-new-epoch",
         published=[*untested_logs(0), ("log", "demo/1", "demo/1/speculating/demo/batch/1/moved/1"),
                    ("speculate", "demo", f"{B}/moved/1")],
         check=both(batch_is(BatchState.SPECULATING, 4), epoch_is(1, "e" * 40),
                    metric([("demo", True)]))),
    # The tip is one the queue landed for another batch: this batch's own epoch, no move
    # outside the queue (no notice, the move counter untouched).
    Case(MOVED, landed_elsewhere, UNTESTED_MOVED, name="a-tip-the-queue-landed-is-its-own-epoch",
         published=[*untested_logs(0), ("log", "demo/1", "demo/1/speculating/demo/batch/1/moved/1"),
                    ("speculate", "demo", f"{B}/moved/1")],
         check=both(batch_is(BatchState.SPECULATING, 4), epoch_is(0, ""),
                    own_epoch(1), metric([("demo", False)]))),
    Case(MOVED, batch_in(BatchState.MERGING, moves=1), {**UNTESTED_MOVED, "round": 1},
         name="a-second-move-a-second-epoch",
         published=[*untested_logs(1), ("log", "demo/1", "demo/1/speculating/demo/batch/1/moved/2"),
                    ("speculate", "demo", f"{B}/moved/2")],
         check=both(batch_is(BatchState.SPECULATING, 4), epoch_is(2, "e" * 40))),
    Case("batch ``merging``, otherwise", batch_in(BatchState.MERGING),
         {**UNTESTED_MOVED, "moved": False}, name="untested-tree-not-moved-fails",
         published=[*untested_logs(0), *FANOUT],
         check=both(batch_is(BatchState.FAILED, 4, "merge failed: untested_tree: x"),
                    epoch_is(0, ""), metric([("demo", False)]))),
    Case(REPLAY_MOVED, batch_in(BatchState.SPECULATING, moves=1), UNTESTED_MOVED,
         name="speculating-after-a-move-replays-its-wake-up",
         published=[("speculate", "demo", f"{B}/moved/1")], writes_nothing=True,
         check=batch_is(BatchState.SPECULATING, 3)),
    *[Case("batch ``creating`` / ``created``, or ``speculating`` with no move on record",
           batch_in(st), OK,
           name=st.value, raises=InvalidState, published=[], check=batch_is(st, 3))
      for st in (BatchState.CREATING, BatchState.CREATED, BatchState.SPECULATING)],
    Case("batch missing", nothing, OK, raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, MergeSignalController, "mergesignal"))
