"""The gateway's request log on SQLite and PostgreSQL: ``persist_log`` (the one
materializer), the summary and list queries, and the counter."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from app.controllers.gateway_log import GatewayLogController
from app.db.engine import Database
from app.db.repos import counters
from app.db.repos import request_log as repo
from app.db.tables import request_log as log_t
from app.domain.entities import RequestLog
from app.domain.errors import AlreadyExists, NotFound, ValidationError
from app.domain.messages import log_id
from app.domain.states import LogType
from tests.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

Q = "demo"
URI = "phab://phab.example.com/D1/1"


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()


async def make_request(db: Database, n: int = 1, *, received: int = 1_000,
                       uris: tuple[str, ...] = (URI,)) -> str:
    sqid = f"{Q}/{n}"
    async with db.write() as s:
        await repo.create_summary(s, queue=Q, request_id=sqid, change_uris=list(uris),
                                  received_at_ms=received)
    return sqid


def status(sqid: str, name: str, ts: int, version: int = 0, *, occurrence: str | None = None,
           last_error: str = "", metadata: dict[str, str] | None = None) -> RequestLog:
    return RequestLog(queue=Q, request_id=sqid, timestamp_ms=ts, type=LogType.STATUS,
                      status=name, request_version=version, last_error=last_error,
                      metadata=metadata or {}, log_id=log_id(sqid, name, occurrence))


def event(sqid: str, name: str, ts: int, occurrence: str) -> RequestLog:
    return RequestLog(queue=Q, request_id=sqid, timestamp_ms=ts, type=LogType.EVENT,
                      event=name, metadata={"build_id": occurrence},
                      log_id=log_id(sqid, name, occurrence))


async def summary_of(db: Database, sqid: str) -> tuple[str, int, int]:
    async with db.read() as s:
        found = await repo.find_summary(s, queue=Q, request_id=sqid)
    assert found is not None
    return found.status, found.request_version, found.status_timestamp_ms


async def rows(db: Database, sqid: str) -> list[RequestLog]:
    async with db.read() as s:
        return await repo.history(s, queue=Q, request_id=sqid)


async def test_counter_starts_at_one_and_is_per_queue_and_domain(db: Database) -> None:
    async with db.write() as s:
        got = [await counters.next_number(s, queue=Q, domain="request") for _ in range(3)]
        other = await counters.next_number(s, queue="other", domain="request")
        batch = await counters.next_number(s, queue=Q, domain="batch")
    assert (got, other, batch) == ([1, 2, 3], 1, 1)


async def test_concurrent_counter_increments_never_repeat(db: Database) -> None:
    async def one() -> int:
        async with db.write() as s:
            return await counters.next_number(s, queue=Q, domain="request")

    got = await asyncio.gather(*(one() for _ in range(12)))
    assert sorted(got) == list(range(1, 13))


async def test_an_accepting_summary_is_invisible_until_a_status_arrives(db: Database) -> None:
    sqid = await make_request(db)
    async with db.read() as s:
        with pytest.raises(NotFound):
            await repo.get_summary(s, queue=Q, request_id=sqid)
        assert await repo.list_summaries(s, queue=Q, limit=10) == []
        assert await repo.counts_by_status(s) == {}
    await repo.persist_log(db, status(sqid, "accepted", 1_000))
    async with db.read() as s:
        visible = await repo.get_summary(s, queue=Q, request_id=sqid)
        assert visible.status == "accepted" and visible.version == 2
        assert visible.change_uris == (URI,)
        assert [x.request_id for x in await repo.summaries_by_change_uri(
            s, queue=Q, change_uri=URI)] == [sqid]
        assert await repo.counts_by_status(s) == {Q: {"accepted": 1}}


async def test_creating_a_request_twice_is_already_exists(db: Database) -> None:
    await make_request(db)
    with pytest.raises(AlreadyExists):
        await make_request(db)


async def test_redelivery_of_one_log_id_stores_one_row(db: Database) -> None:
    sqid = await make_request(db)
    entry = status(sqid, "started", 2_000, 1)
    for _ in range(3):
        await repo.persist_log(db, entry)
    assert [r.log_id for r in await rows(db, sqid)] == [f"{sqid}/started"]
    async with db.write() as s:
        assert await repo.append_log(s, entry=entry) is False
        assert await repo.append_log(s, entry=status(sqid, "validating", 1)) is True
    assert len(await rows(db, sqid)) == 2
    assert await summary_of(db, sqid) == ("started", 1, 2_000)


async def test_redelivery_repairs_a_summary_whose_write_was_lost(db: Database) -> None:
    sqid = await make_request(db)
    entry = status(sqid, "started", 2_000, 1)
    async with db.write() as s:  # the row was stored, then the process died
        assert await repo.append_log(s, entry=entry)
    assert (await summary_of(db, sqid))[0] == "accepting"
    await repo.persist_log(db, entry)
    assert await summary_of(db, sqid) == ("started", 1, 2_000)
    assert len(await rows(db, sqid)) == 1


def lifecycle(sqid: str) -> list[RequestLog]:
    return [
        status(sqid, "accepted", 1_000),
        status(sqid, "started", 1_010, 1),
        status(sqid, "validating", 1_020),
        event(sqid, "building", 1_025, "b1"),
        status(sqid, "validated", 1_030, 2),
        status(sqid, "batching", 1_040, 2, metadata={"batch_id": "demo/batch/1"}),
        status(sqid, "batched", 1_050, metadata={"batch_id": "demo/batch/1"}),
        status(sqid, "speculating", 1_060, occurrence="demo/batch/1"),
        event(sqid, "built", 1_065, "b1"),
        status(sqid, "landing", 1_070, occurrence="demo/batch/1"),
        status(sqid, "landed", 1_080, 3),
    ]


async def test_reordering_gives_the_same_summary_and_history(db: Database) -> None:
    entries = lifecycle("demo/1")
    shuffled = lifecycle("demo/2")
    random.Random(7).shuffle(shuffled)
    await make_request(db, 1)
    await make_request(db, 2)
    for e in entries:
        await repo.persist_log(db, e)
    for e in shuffled + shuffled[:4]:  # reordered, with redeliveries
        await repo.persist_log(db, e)
    assert await summary_of(db, "demo/1") == await summary_of(db, "demo/2")
    assert await summary_of(db, "demo/1") == ("landed", 3, 1_080)

    def shape(history: list[RequestLog]) -> list[tuple[int, str, str]]:
        return [(r.timestamp_ms, r.status, r.event) for r in history]

    assert shape(await rows(db, "demo/1")) == shape(await rows(db, "demo/2"))
    assert len(await rows(db, "demo/2")) == len(entries)


async def test_a_versioned_terminal_wins_over_a_later_non_terminal(db: Database) -> None:
    sqid = await make_request(db)
    await repo.persist_log(db, status(sqid, "error", 2_000, 2, last_error="build failed"))
    await repo.persist_log(db, status(sqid, "speculating", 9_000))
    await repo.persist_log(db, status(sqid, "cancelling", 9_500, metadata={"reason": "x"}))
    async with db.read() as s:
        summary = await repo.get_summary(s, queue=Q, request_id=sqid)
    assert (summary.status, summary.last_error, summary.metadata) == ("error", "build failed", {})
    assert [r.status for r in await rows(db, sqid)] == ["error", "speculating", "cancelling"]


async def test_events_are_stored_but_never_change_the_status(db: Database) -> None:
    sqid = await make_request(db)
    await repo.persist_log(db, status(sqid, "speculating", 2_000, occurrence="b"))
    before = await summary_of(db, sqid)
    await repo.persist_log(db, event(sqid, "building", 3_000, "build-1"))
    await repo.persist_log(db, event(sqid, "built", 4_000, "build-1"))
    assert await summary_of(db, sqid) == before
    history = await rows(db, sqid)
    assert [(r.type, r.event) for r in history[1:]] == [
        (LogType.EVENT, "building"), (LogType.EVENT, "built")]
    assert history[1].metadata == {"build_id": "build-1"}


async def test_concurrent_entries_for_one_request_end_in_the_winner(db: Database) -> None:
    sqid = await make_request(db)
    entries = [
        status(sqid, "accepted", 1_000),
        status(sqid, "started", 1_010, 1),
        status(sqid, "validating", 1_020),
        status(sqid, "validated", 1_030, 2),
        status(sqid, "batching", 1_040, 2),
        status(sqid, "cancelling", 1_045),
        event(sqid, "waiting", 1_050, "p1"),
        status(sqid, "batched", 1_060),
    ]
    await asyncio.gather(*(repo.persist_log(db, e) for e in entries + entries[:3]))
    assert await summary_of(db, sqid) == ("batched", 0, 1_060)
    assert len(await rows(db, sqid)) == len(entries)
    await asyncio.gather(
        repo.persist_log(db, status(sqid, "cancelled", 1_070, 3)),
        repo.persist_log(db, status(sqid, "speculating", 1_080, occurrence="b")),
        repo.persist_log(db, status(sqid, "error", 1_075, 3)),
    )
    assert await summary_of(db, sqid) == ("error", 3, 1_075)


async def test_a_log_for_a_missing_request_is_not_found_and_stores_nothing(
    db: Database,
) -> None:
    with pytest.raises(NotFound):
        await repo.persist_log(db, status("demo/404", "started", 1, 1))
    async with db.read() as s:
        assert (await s.execute(sa.select(sa.func.count()).select_from(log_t))).scalar() == 0


@pytest.mark.parametrize("bad", [
    RequestLog(queue=Q, request_id="demo/1", timestamp_ms=1, type=LogType.STATUS,
               status="started", log_id=""),
    RequestLog(queue=Q, request_id="demo/1", timestamp_ms=1, type=LogType.STATUS,
               status="accepting", log_id="demo/1/accepting"),
    RequestLog(queue=Q, request_id="demo/1", timestamp_ms=1, type=LogType.STATUS,
               status="bogus", log_id="demo/1/bogus"),
    RequestLog(queue=Q, request_id="demo/1", timestamp_ms=1, type=LogType.EVENT,
               log_id="demo/1/x"),
])
async def test_malformed_entries_are_rejected(db: Database, bad: RequestLog) -> None:
    await make_request(db)
    with pytest.raises(ValidationError):
        await repo.persist_log(db, bad)
    assert await rows(db, "demo/1") == []


class FakeDelivery:
    def __init__(self, payload: object) -> None:
        self.payload = payload


async def test_the_log_controller_folds_a_message_and_rejects_garbage(db: Database) -> None:
    import pydantic

    sqid = await make_request(db)
    controller = GatewayLogController(db)
    payload = {"queue": Q, "request_id": sqid, "log_id": f"{sqid}/started",
               "timestamp_ms": 5, "type": "status", "status": "started", "request_version": 1}
    await controller.process(FakeDelivery(payload))  # type: ignore[arg-type]
    assert await summary_of(db, sqid) == ("started", 1, 5)
    with pytest.raises(pydantic.ValidationError):
        await controller.process(FakeDelivery({**payload, "type": "nope"}))  # type: ignore[arg-type]


def started(sqid: str, ts: int) -> FakeDelivery:
    return FakeDelivery({"queue": Q, "request_id": sqid, "log_id": f"{sqid}/started",
                         "timestamp_ms": ts, "type": "status", "status": "started",
                         "request_version": 1})


async def test_concurrent_log_deliveries_are_folded_in_one_transaction(db: Database) -> None:
    """Entries that arrive while a fold is being written share the next transaction:
    ten concurrent deliveries cost one commit or two (the first may go alone), not
    ten, and every summary moved."""
    sqids = [await make_request(db, n) for n in range(1, 11)]
    controller = GatewayLogController(db)
    commits = db.stats.transactions["commit"]
    await asyncio.gather(*(controller.process(started(s, 5))  # type: ignore[arg-type]
                           for s in sqids))
    assert 1 <= db.stats.transactions["commit"] - commits <= 2
    for sqid in sqids:
        assert await summary_of(db, sqid) == ("started", 1, 5)


async def test_a_failing_entry_among_concurrent_ones_fails_only_its_own_delivery(
    db: Database
) -> None:
    """The shared transaction rolls back whole when one entry fails; each is then folded
    on its own, so only the bad one raises (NotFound: a request with no summary) and
    the others are stored once."""
    sqids = [await make_request(db, n) for n in range(1, 6)]
    controller = GatewayLogController(db)
    deliveries = [started(s, 7) for s in sqids]
    deliveries.insert(3, started(f"{Q}/99", 7))
    outcomes = await asyncio.gather(*(controller.process(d)  # type: ignore[arg-type]
                                      for d in deliveries), return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == \
        ["NoneType"] * 3 + ["NotFound"] + ["NoneType"] * 2
    for sqid in sqids:
        assert await summary_of(db, sqid) == ("started", 1, 7)
        assert [r.status for r in await rows(db, sqid)] == ["started"]


async def test_list_is_newest_first_with_keyset_pages_and_filters(db: Database) -> None:
    ids = []
    for n, received in zip(range(1, 6), [10, 20, 20, 30, 40], strict=True):
        uris = (URI,) if n in (2, 4) else (f"phab://phab.example.com/D{n}/9",)
        sqid = await make_request(db, n, received=received, uris=uris)
        await repo.persist_log(db, status(sqid, "accepted", received))
        ids.append(sqid)
    await repo.persist_log(db, status("demo/3", "cancelling", 50))
    pages: list[list[str]] = []
    after = None
    async with db.read() as s:
        while True:
            got = await repo.list_summaries(s, queue=Q, limit=3, after=after)
            page = got[:2]
            pages.append([x.request_id for x in page])
            if len(got) <= 2:
                break
            after = (page[-1].received_at_ms, page[-1].request_id)
        assert pages == [["demo/5", "demo/4"], ["demo/3", "demo/2"], ["demo/1"]]
        only = await repo.list_summaries(s, queue=Q, limit=10, status="cancelling")
        assert [x.request_id for x in only] == ["demo/3"]
        window = await repo.list_summaries(s, queue=Q, limit=10, since_ms=20, until_ms=40)
        assert [x.request_id for x in window] == ["demo/4", "demo/3", "demo/2"]
        by_uri = await repo.list_summaries(s, queue=Q, limit=10, change_uri=URI)
        assert [x.request_id for x in by_uri] == ["demo/4", "demo/2"]
        assert await repo.counts_by_status(s, queues=[Q]) == {
            Q: {"accepted": 4, "cancelling": 1}}
        assert await repo.counts_by_status(s, queues=["other"]) == {}



async def test_folding_entries_together_is_folding_them_one_by_one_in_few_statements(
        db: Database) -> None:
    """``persist_logs``: the same summaries, history and return values as ``persist_log``
    entry by entry (an older status loses, an event is kept, a repeat is stored once),
    in one statement appending, one reading and one write per summary changed."""
    def entries(a: str, b: str) -> list[RequestLog]:
        return [status(a, "started", 10), status(b, "started", 11),
                status(a, "validating", 12, 1), event(a, "building", 13, "b-1"),
                status(a, "started", 9), status(b, "validating", 14, 1),
                status(a, "validating", 12, 1), status(a, "landed", 15, 2,
                                                        metadata={"k": "v"})]

    async def state(sqids: tuple[str, ...]) -> list[object]:
        async with db.read() as s:
            out: list[object] = []
            for sqid in sqids:
                summary = await repo.find_summary(s, queue=Q, request_id=sqid)
                assert summary is not None
                out.append((summary.status, summary.version, summary.metadata))
                out.append([e.log_id for e in await repo.history(s, queue=Q, request_id=sqid)])
            return out

    alone = (await make_request(db, 1), await make_request(db, 2))
    together = (await make_request(db, 3), await make_request(db, 4))
    one_by_one = [await repo.persist_log(db, e) for e in entries(*alone)]
    before = sum(db.stats.statements.values())
    folded = await repo.persist_logs(db, entries(*together))
    spent = sum(db.stats.statements.values()) - before

    def shape(results: list[object]) -> list[object]:
        return [None if r is None else (r.status, r.version) for r in results]  # type: ignore[attr-defined]

    assert shape(list(folded)) == shape(list(one_by_one))
    renamed = [str(x).replace(f"{Q}/1", f"{Q}/3").replace(f"{Q}/2", f"{Q}/4")
               for x in await state(alone)]
    assert [str(x) for x in await state(together)] == renamed
    # BEGIN, one INSERT, one SELECT, two UPDATEs (one per request), the landed claims read
    assert spent <= 6, db.stats.statements
