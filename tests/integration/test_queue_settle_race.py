"""Two consumer groups settling the last two deliveries of one message at the same
moment (PostgreSQL, READ COMMITTED): each transaction deletes its own delivery, and
before the lock on the message row each one's settle check still saw the other's
delivery (its delete not yet committed), so neither settled the message. It stayed
unsettled with no delivery left, counted as pending forever (seen by the chaos test
as "pending 1; deliveries_left 0"). The ack and the dead-letter move now lock the
message row first, so the second waits for the first's commit and settles it.

The transactions are driven by hand on two connections so the interleaving is the
racy one every time: the first has run all its statements but not committed when
the second starts.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import asyncpg
import pytest

from app.queue import TopicSpec, ops, ops_admin
from app.queue.backends import postgres_dsn_from_url
from app.queue.dialect import POSTGRES, to_positional
from app.queue.ops import Op
from tests.conftest import BACKENDS
from tests.integration.queue_support import started_broker, topology

T = TypeVar("T")
PG_ONLY = [p for p in BACKENDS if p.id == "postgres"]


async def _run_until_commit(conn: asyncpg.Connection, op: Op[T], ran: asyncio.Event,
                            commit: asyncio.Event) -> T:
    """Run every statement of ``op`` in one transaction, then wait for ``commit``."""
    async with conn.transaction():
        rows: list[dict[str, Any]] | None = None
        try:
            while True:
                stmt = op.send(rows)  # type: ignore[arg-type]
                sql, order = to_positional(stmt.sql)
                got = await conn.fetch(sql, *[stmt.params[n] for n in order])
                rows = [dict(r) for r in got]
        except StopIteration as stop:
            result: T = stop.value
        ran.set()
        await commit.wait()
    return result


async def _settled(conn: asyncpg.Connection, message_id: str) -> tuple[Any, int]:
    row = await conn.fetchrow(
        "SELECT seq, settled_at_ms FROM queue_messages WHERE message_id = $1"
        " AND original_topic IS NULL", message_id)  # not its dead-letter copy
    assert row is not None
    left = await conn.fetchval(
        "SELECT COUNT(*) FROM queue_deliveries WHERE message_seq = $1", row["seq"])
    return row["settled_at_ms"], int(left)


async def _race(database_url: str, second: str) -> tuple[Any, int]:
    """Two groups claim one message; group a acks; group b acks (``second="ack"``)
    or dead-letters its delivery (``"dead_letter"``) while a's ack is uncommitted."""
    topo = topology(TopicSpec("fanout", max_attempts=3), groups=("a", "b"))
    async with started_broker(database_url, topo) as broker:
        await broker.publish("fanout", {"x": 1}, partition_key="p", message_id="m1")
        (da,) = await broker.claim("a", "fanout", 1)
        (db,) = await broker.claim("b", "fanout", 1)
    dsn = postgres_dsn_from_url(database_url)
    c1, c2, check = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        ran1, commit1, ran2, commit2 = (asyncio.Event() for _ in range(4))
        op_b: Op[Any]
        if second == "ack":
            op_b = ops.ack_many(POSTGRES, [(db.delivery_id, db.lease_token)], now=2)
        else:
            op_b = ops_admin.dead_letter(
                POSTGRES, db.delivery_id, db.lease_token,
                target=ops_admin.DeadLetterTarget("fanout_dlq", ()), error="boom",
                detail={}, now=2)
        first = asyncio.create_task(_run_until_commit(
            c1, ops.ack_many(POSTGRES, [(da.delivery_id, da.lease_token)], now=1),
            ran1, commit1))
        await asyncio.wait_for(ran1.wait(), 10)
        commit2.set()
        later = asyncio.create_task(_run_until_commit(c2, op_b, ran2, commit2))
        # unfixed, the second runs through at once; fixed, it waits on the message lock
        await asyncio.wait([later], timeout=0.5)
        commit1.set()
        assert await asyncio.wait_for(first, 10) == {da.delivery_id}
        await asyncio.wait_for(later, 10)
        return await _settled(check, "m1")
    finally:
        for c in (c1, c2, check):
            await c.close()


@pytest.mark.parametrize("database_url", PG_ONLY, indirect=True)
async def test_two_groups_acking_one_message_at_once_settle_it(database_url: str) -> None:
    settled_at, left = await _race(database_url, "ack")
    assert left == 0
    assert settled_at is not None, "both acks committed but the message was left unsettled"


@pytest.mark.parametrize("database_url", PG_ONLY, indirect=True)
async def test_an_ack_beside_a_dead_letter_move_settles_the_message(
    database_url: str
) -> None:
    settled_at, left = await _race(database_url, "dead_letter")
    assert left == 0
    assert settled_at is not None, "the ack and the dead-letter move left it unsettled"
