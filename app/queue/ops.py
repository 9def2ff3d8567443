"""The queue's operations as sans-I/O generators over SQL statements.

Each operation yields ``Stmt`` objects and receives the rows (a list of dicts)
back; a backend drives it inside one transaction. Both backends run the very same
operations, so SQLite and PostgreSQL behave alike by construction. The only
difference: on PostgreSQL, publishing one message, claiming and acking are each one
statement (data-modifying CTEs doing the same steps), so they cost one round trip.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from app.queue.dialect import Dialect, Stmt
from app.queue.records import ClaimedDelivery, StoredMessage

T = TypeVar("T")
Rows = list[dict[str, Any]]
Op = Generator[Stmt, Rows, T]

_MESSAGE_COLUMNS = (
    "m.seq, m.topic, m.partition_key, m.message_id, m.source_group, m.payload, m.metadata, "
    "m.published_at_ms, m.settled_at_ms, m.parked, m.original_topic, m.failed_at_ms, "
    "m.failure_count, m.last_error, m.failure_detail"
)


@dataclass(frozen=True, slots=True)
class NewMessage:
    topic: str
    partition_key: str
    message_id: str
    payload_json: str
    metadata_json: str
    source_group: str = ""
    original_topic: str | None = None
    failure_count: int | None = None
    last_error: str | None = None
    failure_detail_json: str | None = None
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Publication:
    message: NewMessage
    groups: Sequence[str]
    park_if_unread: bool = False


def insert_messages(
    d: Dialect,
    items: Sequence[Publication],
    *,
    now: int,
    last: bool = False,
    notify: bool = True,
) -> Op[list[int | None]]:
    """Store messages in order, in one transaction; ``None`` marks a duplicate.

    On PostgreSQL every partition touched is locked first, in sorted order (so two
    batches cannot deadlock), which makes ids commit in order within a partition.
    ``last``: nothing else runs in this transaction (a plain publish). ``notify``:
    wake consumers of other processes at commit; a caller passing ``False`` sends
    the notification itself after the commit (see ``Dialect.notify_alone``).
    """
    if d.is_postgres and len(items) == 1:
        rows = yield _insert_one_pg(d, items[0], now=now, last=last, notify=notify)
        seq = rows[0]["seq"] if rows else None
        return [int(seq) if seq is not None else None]
    for topic, pk in sorted({(i.message.topic, i.message.partition_key) for i in items}):
        lock = d.lock_partition(topic, pk)
        if lock is not None:
            yield lock
    seqs: list[int | None] = []
    if len(items) == 1:
        seqs.append((yield from _insert_one(d, items[0], now=now)))
    else:
        for start in range(0, len(items), _ROWS_PER_STATEMENT):
            chunk = items[start:start + _ROWS_PER_STATEMENT]
            seqs.extend((yield from _insert_many(d, chunk, now=now)))
    for topic in sorted({i.message.topic for i in items if i.groups and notify}):
        stmt = d.notify(topic)
        if stmt is not None:
            yield stmt
    return seqs


def insert_message(
    d: Dialect, msg: NewMessage, *, groups: Sequence[str], now: int, park_if_unread: bool
) -> Op[int | None]:
    """Store one message once and create a delivery for each group (see insert_messages)."""
    seqs = yield from insert_messages(d, [Publication(msg, groups, park_if_unread)], now=now)
    return seqs[0]


_INSERT_MESSAGE = """INSERT INTO queue_messages
             (topic, partition_key, message_id, source_group, payload, metadata,
              published_at_ms, settled_at_ms, parked, original_topic, failed_at_ms,
              failure_count, last_error, failure_detail)
           {source}
           ON CONFLICT (topic, partition_key, message_id, source_group) DO NOTHING
           RETURNING {returning}"""
_MESSAGE_VALUES = """:topic, :pk, :mid, :sg, :payload, :md, :now, :settled, :parked, :orig,
                   :failed_at, :fcount, :lerr, :fdetail"""

# PostgreSQL, one message in one statement, doing what insert_messages does: the
# INSERT reads from the partition lock's CTE (volatile, so evaluated first), hence
# draws its id under the lock; deliveries are created only if the message is new,
# in group order; NOTIFY is delivered at commit, as before.
_INSERT_ONE_PG = """WITH lk AS ({lock}),
ins AS ({insert}),
dl AS (INSERT INTO queue_deliveries
         (consumer_group, topic, partition_key, message_seq, available_at_ms, attempts,
          held, created_at_ms)
       SELECT u.g, :topic, :pk, ins.seq, :now, 0, 0, :now
       FROM ins CROSS JOIN unnest(CAST(:groups AS text[])) WITH ORDINALITY AS u(g, o)
       ORDER BY u.o
       ON CONFLICT (consumer_group, message_seq) DO NOTHING)
SELECT (SELECT seq FROM ins) AS seq{notify}"""


def _message_params(item: Publication, now: int) -> dict[str, Any]:
    msg, groups = item.message, item.groups
    parked = 1 if (item.park_if_unread and not groups) else 0
    settled = now if (not groups and not parked) else None
    return {
        "topic": msg.topic,
        "pk": msg.partition_key,
        "mid": msg.message_id,
        "sg": msg.source_group,
        "payload": msg.payload_json,
        "md": msg.metadata_json,
        "now": now,
        "settled": settled,
        "parked": parked,
        "orig": msg.original_topic,
        "failed_at": now if msg.failed else None,
        "fcount": msg.failure_count,
        "lerr": msg.last_error,
        "fdetail": msg.failure_detail_json,
    }


def _insert_one_pg(
    d: Dialect, item: Publication, *, now: int, last: bool, notify: bool
) -> Stmt:
    msg = item.message
    lock = d.lock_partition(msg.topic, msg.partition_key)
    wake = d.notify(msg.topic) if item.groups and notify else None
    assert lock is not None and (wake is None or wake.params == {"topic": msg.topic})
    sql = _INSERT_ONE_PG.format(
        lock=lock.sql,
        insert=_INSERT_MESSAGE.format(source=f"SELECT {_MESSAGE_VALUES} FROM lk",
                                      returning="seq"),
        notify=f", ({wake.sql}) AS notified" if wake is not None else "",
    )
    params = {**_message_params(item, now), **lock.params, "groups": list(item.groups)}
    return Stmt(sql, params, last=last)


def _insert_one(d: Dialect, item: Publication, *, now: int) -> Op[int | None]:
    msg, groups = item.message, item.groups
    rows = yield Stmt(
        _INSERT_MESSAGE.format(source=f"VALUES ({_MESSAGE_VALUES})", returning="seq"),
        _message_params(item, now)
    )
    if not rows:
        return None
    seq = int(rows[0]["seq"])
    for group in groups:
        yield from insert_delivery(d, group=group, topic=msg.topic, pk=msg.partition_key,
                                   seq=seq, now=now)
    return seq


# Several messages: one statement stores them all and one creates all their
# deliveries, whatever their number (a transaction's outbox often holds a dozen). The
# rows travel as one JSON array (SQLite) or one array per column (PostgreSQL), so the
# statement's text is the same for every count. Rows are inserted in the order given,
# so ids follow it; a duplicate (stored before, or earlier in the same list) gets none.
_ROWS_PER_STATEMENT = 500
_MESSAGE_FIELDS = ("topic", "pk", "mid", "sg", "payload", "md", "now", "settled", "parked",
                   "orig", "failed_at", "fcount", "lerr", "fdetail")
_PG_MESSAGE_TYPES = ("text", "text", "text", "text", "text", "text", "bigint", "bigint",
                     "int", "text", "bigint", "int", "text", "text")
_DELIVERY_FIELDS = ("g", "t", "pk", "seq")
_PG_DELIVERY_TYPES = ("text", "text", "text", "bigint")
_MESSAGE_KEY_COLUMNS = "seq, topic, partition_key, message_id, source_group"


def _rows_source(d: Dialect, fields: Sequence[str], types: Sequence[str],
                 extra: str = "") -> str:
    """A ``SELECT`` of the bound rows, one column per field and then ``extra``, in the
    rows' order (``WHERE true``: SQLite's upsert needs one after a ``SELECT``)."""
    if d.is_postgres:
        arrays = ", ".join(f"CAST(:{f} AS {t}[])" for f, t in zip(fields, types, strict=True))
        columns = ", ".join(f"r.{f}" for f in fields)
        return (f"SELECT {columns}{extra} FROM unnest({arrays}) WITH ORDINALITY "
                f"AS r({', '.join(fields)}, o) WHERE true ORDER BY r.o")
    columns = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(fields)))
    return f"SELECT {columns}{extra} FROM json_each(:rows) WHERE true ORDER BY key"


def _rows_params(d: Dialect, fields: Sequence[str],
                 rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    if d.is_postgres:
        return {f: [r[i] for r in rows] for i, f in enumerate(fields)}
    return {"rows": json.dumps([list(r) for r in rows], separators=(",", ":"))}


def _insert_many(d: Dialect, items: Sequence[Publication], *, now: int) -> Op[list[int | None]]:
    values = [_message_params(item, now) for item in items]
    insert = _INSERT_MESSAGE.format(source=_rows_source(d, _MESSAGE_FIELDS, _PG_MESSAGE_TYPES),
                                    returning=_MESSAGE_KEY_COLUMNS)
    rows = yield Stmt(insert, _rows_params(
        d, _MESSAGE_FIELDS, [[v[f] for f in _MESSAGE_FIELDS] for v in values]))
    stored = {(r["topic"], r["partition_key"], r["message_id"], r["source_group"]):
              int(r["seq"]) for r in rows}
    seqs: list[int | None] = []
    deliveries: list[tuple[str, str, str, int]] = []
    for item in items:
        msg = item.message
        seq = stored.pop((msg.topic, msg.partition_key, msg.message_id, msg.source_group), None)
        seqs.append(seq)
        if seq is not None:
            deliveries += [(g, msg.topic, msg.partition_key, seq) for g in item.groups]
    if deliveries:
        source = _rows_source(d, _DELIVERY_FIELDS, _PG_DELIVERY_TYPES, ", :now, 0, 0, :now")
        yield Stmt(
            f"""INSERT INTO queue_deliveries
                 (consumer_group, topic, partition_key, message_seq, available_at_ms,
                  attempts, held, created_at_ms)
               {source}
               ON CONFLICT (consumer_group, message_seq) DO NOTHING""",
            {**_rows_params(d, _DELIVERY_FIELDS, deliveries), "now": now},
        )
    return seqs


def notify_alone(d: Dialect, topics: Sequence[str]) -> Op[None]:
    """Wake consumers of ``topics`` in every process, after the fact (PostgreSQL)."""
    stmt = d.notify_alone(sorted(set(topics)))
    if stmt is not None:
        yield stmt


def insert_delivery(d: Dialect, *, group: str, topic: str, pk: str, seq: int, now: int) -> Op[None]:
    yield Stmt(
        """INSERT INTO queue_deliveries
             (consumer_group, topic, partition_key, message_seq, available_at_ms, attempts,
              held, created_at_ms)
           VALUES (:g, :t, :pk, :seq, :now, 0, 0, :now)
           ON CONFLICT (consumer_group, message_seq) DO NOTHING""",
        {"g": group, "t": topic, "pk": pk, "seq": seq, "now": now},
    )


def claim(
    d: Dialect,
    *,
    group: str,
    topic: str,
    serial: bool,
    limit: int,
    now: int,
    lease_until: int,
    token: str,
    consumer: str,
    generation: int | None = None,
) -> Op[list[ClaimedDelivery]]:
    """Lease up to ``limit`` deliveries; attempts are counted durably at claim time.

    ``consumer`` (the member id, or the process's name) and ``generation`` (the
    member's incarnation) are recorded with the lease, so a restart of the member can
    take its claims back (``app/queue/members.py``)."""
    params = {"g": group, "t": topic, "now": now, "n": limit, "lease_until": lease_until,
              "token": token, "consumer": consumer, "gen": generation}
    if d.is_postgres:
        rows = yield Stmt(
            f"""WITH picked AS ({d.claim_candidates(serial)}),
            claimed AS (
              UPDATE queue_deliveries d
              SET available_at_ms = :lease_until, lease_token = :token, leased_by = :consumer,
                  lease_generation = :gen, attempts = d.attempts + 1
              FROM picked WHERE d.id = picked.id AND d.available_at_ms <= :now
              RETURNING d.id AS delivery_id, d.attempts, d.message_seq)
            SELECT c.delivery_id, c.attempts, {_MESSAGE_COLUMNS}
            FROM claimed c JOIN queue_messages m ON m.seq = c.message_seq
            ORDER BY c.delivery_id""",
            params,
            last=True,
        )
    else:
        updated = yield Stmt(
            f"""UPDATE queue_deliveries
                SET available_at_ms = :lease_until, lease_token = :token, leased_by = :consumer,
                    lease_generation = :gen, attempts = attempts + 1
                WHERE id IN ({d.claim_candidates(serial)}) AND available_at_ms <= :now
                RETURNING id""",
            params,
        )
        if not updated:
            return []
        rows = yield Stmt(
            f"""SELECT d.id AS delivery_id, d.attempts, {_MESSAGE_COLUMNS}
                FROM queue_deliveries d JOIN queue_messages m ON m.seq = d.message_seq
                WHERE d.consumer_group = :g AND d.topic = :t AND d.available_at_ms = :lease_until
                  AND d.lease_token = :token
                ORDER BY d.id""",
            {"g": group, "t": topic, "lease_until": lease_until, "token": token},
        )
    return [
        ClaimedDelivery(
            delivery_id=int(r["delivery_id"]),
            consumer_group=group,
            lease_token=token,
            lease_until_ms=lease_until,
            attempt=int(r["attempts"]),
            message=StoredMessage.from_row(r),
        )
        for r in rows
    ]


def _owned(delivery_id: int, token: str) -> dict[str, Any]:
    return {"id": delivery_id, "token": token}


def settle_message(seq: int, now: int) -> Stmt:
    """Mark a message settled once no delivery of it is left (parked ones stay)."""
    return Stmt(
        """UPDATE queue_messages SET settled_at_ms = :now
           WHERE seq = :seq AND parked = 0 AND settled_at_ms IS NULL
             AND NOT EXISTS (SELECT 1 FROM queue_deliveries WHERE message_seq = :seq)""",
        {"seq": seq, "now": now},
    )


# PostgreSQL, before an ack: lock the messages of the deliveries acked, in id order.
# Two groups acking the last two deliveries of one message at once would otherwise
# each see the other's delivery still there (its delete not yet committed) and
# neither would settle the message (write skew under READ COMMITTED). With the lock
# the second waits for the first's commit, and its ack statement, which takes a new
# snapshot, sees that delete. dead_letter takes the same lock first.
_LOCK_ACKED_MESSAGES_PG = """SELECT m.seq FROM queue_messages m
  WHERE m.seq IN (SELECT q.message_seq FROM queue_deliveries q
                  WHERE q.id = ANY(CAST(:ids AS bigint[])))
  ORDER BY m.seq FOR UPDATE OF m"""

# PostgreSQL: acks in one statement. Its parts share one snapshot, so the settle step
# does not see the deletes yet and leaves the deleted deliveries out explicitly.
_ACK_MANY_PG = """WITH del AS (
  DELETE FROM queue_deliveries q
  USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[])) AS a(id, token)
  WHERE q.id = a.id AND q.lease_token = a.token
  RETURNING q.id, q.message_seq),
settle AS (
  UPDATE queue_messages m SET settled_at_ms = :now
  WHERE m.seq IN (SELECT message_seq FROM del) AND m.parked = 0 AND m.settled_at_ms IS NULL
    AND NOT EXISTS (SELECT 1 FROM queue_deliveries x
                    WHERE x.message_seq = m.seq AND x.id NOT IN (SELECT id FROM del)))
SELECT id FROM del"""


def ack(d: Dialect, delivery_id: int, token: str, now: int) -> Op[bool]:
    """Settle a delivery we hold the lease of (``False``: the lease was lost)."""
    if d.is_postgres:
        acked = yield from ack_many(d, [(delivery_id, token)], now=now)
        return delivery_id in acked
    rows = yield Stmt(
        """DELETE FROM queue_deliveries WHERE id = :id AND lease_token = :token
           RETURNING message_seq""",
        _owned(delivery_id, token),
    )
    if not rows:
        return False
    yield settle_message(int(rows[0]["message_seq"]), now)
    return True


def ack_many(d: Dialect, leases: Sequence[tuple[int, str]], *, now: int) -> Op[set[int]]:
    """Several acks in one transaction (on PostgreSQL: the message lock, then one
    statement): the ids of the ``(delivery_id, lease_token)`` pairs that were still
    held and are now settled."""
    if not d.is_postgres:
        done: set[int] = set()
        for delivery_id, token in leases:
            if (yield from ack(d, delivery_id, token, now)):
                done.add(delivery_id)
        return done
    pairs = sorted(leases)
    ids = [i for i, _ in pairs]
    yield Stmt(_LOCK_ACKED_MESSAGES_PG, {"ids": ids})
    rows = yield Stmt(_ACK_MANY_PG, {"ids": ids, "tokens": [t for _, t in pairs], "now": now})
    return {int(r["id"]) for r in rows}


def retry(delivery_id: int, token: str, *, at: int, error: str) -> Op[bool]:
    rows = yield Stmt(
        """UPDATE queue_deliveries
           SET available_at_ms = :at, lease_token = NULL, leased_by = NULL, lease_generation = NULL,
               held = 0, last_error = :err
           WHERE id = :id AND lease_token = :token RETURNING id""",
        {**_owned(delivery_id, token), "at": at, "err": error},
        last=True,
    )
    return bool(rows)


def hold(delivery_id: int, token: str, *, at: int) -> Op[bool]:
    """Postpone without spending an attempt; the partition waits behind it."""
    rows = yield Stmt(
        """UPDATE queue_deliveries
           SET available_at_ms = :at, lease_token = NULL, leased_by = NULL, lease_generation = NULL,
               held = 1, attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
           WHERE id = :id AND lease_token = :token RETURNING id""",
        {**_owned(delivery_id, token), "at": at},
        last=True,
    )
    return bool(rows)


def release(delivery_id: int, token: str, *, now: int) -> Op[bool]:
    """Give a delivery back unprocessed (shutdown): visible now, attempt not spent."""
    rows = yield Stmt(
        """UPDATE queue_deliveries
           SET available_at_ms = :now, lease_token = NULL, leased_by = NULL,
               lease_generation = NULL,
               attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
           WHERE id = :id AND lease_token = :token RETURNING id""",
        {**_owned(delivery_id, token), "now": now},
        last=True,
    )
    return bool(rows)


def extend(delivery_id: int, token: str, *, until: int) -> Op[bool]:
    rows = yield Stmt(
        """UPDATE queue_deliveries SET available_at_ms = :until
           WHERE id = :id AND lease_token = :token RETURNING id""",
        {**_owned(delivery_id, token), "until": until},
        last=True,
    )
    return bool(rows)
