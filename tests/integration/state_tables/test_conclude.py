"""``conclude``'s state table, row by row (app/controllers/conclude.py)."""

from __future__ import annotations

from typing import Any

from app.controllers import conclude
from app.controllers.conclude import ConcludeController
from app.db.repos import batches as batch_repo
from app.db.repos.counters import next_number
from app.domain.errors import InvalidState, NotFound
from app.domain.states import BATCH_TO_REQUEST_TERMINAL, BatchState, RequestState
from tests.support.controllers import (
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
)
from tests.support.tables import table_tests

B = "demo/batch/1"
MSG = {"id": B, "queue": "demo"}
REASON = "no speculation path could pass; every candidate build failed"
TERMINAL = (BatchState.SUCCEEDED, BatchState.FAILED, BatchState.CANCELLED)
LIVE = (BatchState.CREATING, BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING,
        BatchState.CANCELLING)


def log(n: int, status: str) -> tuple[str, str, str]:
    return ("log", f"demo/{n}", f"demo/{n}/{status}")


def batch_of(state: BatchState, *members: tuple[RequestState, int] | str,
             reason: str = "") -> Seed:
    """Batch 1 in ``state`` holding requests 1, 2, ... (``(state, version)``, or a sqid
    with no request row)."""
    async def seed(rig: Rig) -> None:
        contains: list[Any] = []
        for n, m in enumerate(members, start=1):
            contains.append(m if isinstance(m, str) else
                            await rig.request(n, m[0], version=m[1], last_error=""))
        landed = {sqid: commits(sqid) for sqid in (c if isinstance(c, str) else c.id
                                                     for c in contains)}
        await rig.batch(1, state, contains, version=5, failure_reason=reason,
                        landed=landed if state is BatchState.SUCCEEDED else None)
        async with rig.db.write() as s:  # batch number 1 is spent
            await next_number(s, queue="demo", domain="batch")
    return seed


def commits(sqid: str) -> tuple[str, ...]:
    """The commit a succeeded batch recorded for ``sqid``'s one change."""
    return (f"{int(sqid.rsplit('/', 1)[1]):040x}",)


def requests_are(*expected: tuple[RequestState, int, str]) -> Check:
    async def check(rig: Rig) -> None:
        for n, (state, version, error) in enumerate(expected, start=1):
            r = await rig.get_request(n)
            assert (r.state, r.version, r.last_error) == (state, version, error), r
        b = await rig.get_batch(1)
        assert b.version == 5  # conclude never writes the batch
    return check


def terminal_logs(target: RequestState, version: int, error: str, *members: int) -> Check:
    """Each member's terminal log carries its version, the reason and the batch id; a
    ``landed`` one also the commits its batch landed it as."""
    async def check(rig: Rig) -> None:
        for n in members:
            p = rig.broker.payload("log", f"demo/{n}/{target.value}")
            metadata: dict[str, Any] = {"batch_id": B}
            if target is RequestState.LANDED:
                metadata["commits"] = list(commits(f"demo/{n}"))
            assert (p["type"], p["status"], p["request_version"], p["last_error"],
                    p["metadata"]) == ("status", target.value, version, error, metadata)
    return check


def parts_are(*parts: tuple[int, tuple[int, ...]], failed: str) -> Check:
    """Batch 1's bisection parts: batch ``n`` ``creating`` with members ``m, ...``, each
    claimed under ``split:1`` and still ``batched``; each member's ``batching`` log names
    its part and the batch it was split from (``failed``: why it did not land)."""
    async def check(rig: Rig) -> None:
        for i, (n, members) in enumerate(parts, start=1):
            b = await rig.get_batch(n)
            assert (b.state, b.contains) == (
                BatchState.CREATING, tuple(f"demo/{m}" for m in members))
            for m in members:
                async with rig.db.read() as s:
                    assert await batch_repo.claimed(
                        s, queue="demo", request_id=f"demo/{m}", cause="split:1"
                    ) == f"demo/batch/{n}"
                assert (await rig.get_request(m)).state is RequestState.BATCHED
                md = rig.broker.payload("log", f"demo/{m}/batching/demo/batch/{n}")["metadata"]
                assert (md["batch_id"], md["split_from"], md["part"], md["parts"]) == (
                    f"demo/batch/{n}", B, i, len(parts))
                assert failed in md["reason"], md["reason"]
            assert rig.broker.payload("dependency_analysis", f"demo/batch/{n}") == {
                "id": f"demo/batch/{n}", "queue": "demo"}
    return check


def parted(n: int, *members: int) -> list[tuple[str, str, str]]:
    return [*[("log", f"demo/{m}", f"demo/{m}/batching/demo/batch/{n}") for m in members],
            ("dependency_analysis", "demo", f"demo/batch/{n}")]


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


def reason_of(state: BatchState) -> str:
    return REASON if state is BatchState.FAILED else ""


AT = "batch ``succeeded`` / ``failed`` / ``cancelled`` (otherwise)"
BISECT = "batch ``failed`` or ``cancelled`` with several members, some ``batched``"
B2 = RequestState.BATCHED, 2
C3 = RequestState.CANCELLING, 3
FAILED = BatchState.FAILED


def members_of(st: BatchState) -> int:
    """How many ``batched`` members a terminating batch of ``st`` holds (a failed or
    cancelled one of several would be bisected instead)."""
    return 2 if st is BatchState.SUCCEEDED else 1


TABLE = StateTable(conclude, [
    *[Case(AT, batch_of(st, *[B2] * members_of(st), reason=reason_of(st)), MSG,
           name=f"{st.value}-terminates",
           published=[log(n, t.value) for n in range(1, members_of(st) + 1)],
           check=both(requests_are(*[(t, 3, reason_of(st))] * members_of(st)),
                      terminal_logs(t, 3, reason_of(st), *range(1, members_of(st) + 1))))
      for st, t in BATCH_TO_REQUEST_TERMINAL.items()],
    # A cancelled batch of several whose members all left ends them.
    Case(AT, batch_of(BatchState.CANCELLED, C3, C3), MSG, name="cancelled-all-cancelling",
         published=[log(1, "cancelled"), log(2, "cancelled")],
         check=requests_are((RequestState.CANCELLED, 4, ""), (RequestState.CANCELLED, 4, ""))),
    Case(BISECT, batch_of(FAILED, B2, B2, B2, B2, reason=REASON), MSG,
         name="failed-of-four-splits-in-two", published=[*parted(2, 1, 2), *parted(3, 3, 4)],
         check=parts_are((2, (1, 2)), (3, (3, 4)), failed=REASON)),
    # The one member left is tried alone; the cancelling one ends ``cancelled``.
    Case(BISECT, batch_of(FAILED, C3, B2, reason=REASON), MSG,
         name="failed-with-one-left-tries-it-alone",
         published=[*parted(2, 2), log(1, "cancelled")],
         check=both(parts_are((2, (2,)), failed=REASON),
                    terminal_logs(RequestState.CANCELLED, 4, REASON, 1))),
    Case(BISECT, batch_of(BatchState.CANCELLED, B2, C3, B2), MSG,
         name="cancelled-batches-the-rest-again",
         published=[*parted(2, 1, 3), log(2, "cancelled")],
         check=parts_are((2, (1, 3)), failed="cancelled for another member")),
    # A failed batch of one member: its verdict (no bisection named: it was no part).
    Case(AT, batch_of(FAILED, (RequestState.CANCELLING, 3), reason=REASON), MSG,
         name="failed-of-one-cancelling", published=[log(1, "error")],
         check=requests_are((RequestState.ERROR, 4, REASON))),
    # The message's reason (the merger's) wins over the batch's.
    Case(AT, batch_of(BatchState.FAILED, B2, reason="the batch's reason"),
         {**MSG, "failure_reason": "merge failed: conflict in a.py"},
         name="failed-with-the-messages-reason", published=[log(1, "error")],
         check=requests_are((RequestState.ERROR, 3, "merge failed: conflict in a.py"))),
    # A merge that won a cancel's race still lands its members.
    Case(AT, batch_of(BatchState.SUCCEEDED, (RequestState.CANCELLING, 3)), MSG,
         name="cancelling-member-still-lands", published=[log(1, "landed")],
         check=requests_are((RequestState.LANDED, 4, ""))),
    *[Case(AT, batch_of(st, (t, 3), *[B2] * (members_of(st) - 1), reason=reason_of(st)),
           MSG, name=f"{st.value}-member-already-there-is-repaired",
           published=[log(n, t.value) for n in range(1, members_of(st) + 1)],
           check=both(requests_are((t, 3, ""), *[(t, 3, reason_of(st))] * (members_of(st) - 1)),
                      terminal_logs(t, 3, "", 1),
                      terminal_logs(t, 3, reason_of(st), *range(2, members_of(st) + 1))))
      for st, t in BATCH_TO_REQUEST_TERMINAL.items()],
    Case("member already in another terminal state",
         batch_of(BatchState.SUCCEEDED, (RequestState.CANCELLED, 3), B2), MSG,
         name="landing-leaves-a-cancelled-member", published=[log(2, "landed")],
         check=requests_are((RequestState.CANCELLED, 3, ""), (RequestState.LANDED, 3, ""))),
    Case("member already in another terminal state",
         batch_of(BatchState.FAILED, (RequestState.LANDED, 3), reason=REASON), MSG,
         name="failing-leaves-a-landed-member", published=[], writes_nothing=True,
         check=requests_are((RequestState.LANDED, 3, ""))),
    Case("member missing", batch_of(BatchState.SUCCEEDED, "demo/9"), MSG,
         name="only-member-missing", raises=NotFound, published=[]),
    # Members are concluded in order: the ones before the missing one are terminated.
    Case("member missing", batch_of(BatchState.SUCCEEDED, B2, "demo/9"), MSG,
         name="second-member-missing", raises=NotFound, writes_nothing=False,
         published=[log(1, "landed")], check=requests_are((RequestState.LANDED, 3, ""))),
    *[Case("batch not terminal", batch_of(st, B2), MSG, name=st.value, raises=InvalidState,
           published=[], check=requests_are((*B2, "")))
      for st in LIVE],
    Case("batch missing", lambda rig: rig.request(1, RequestState.BATCHED), MSG,
         raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_batch_state() -> None:
    assert {*TERMINAL, *LIVE} == set(BatchState)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, ConcludeController, "conclude"))
