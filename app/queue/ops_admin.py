"""The queue's operations off the hot path, as sans-I/O generators like ``ops.py``:
dead letters (moving a message to its DLQ, requeue, discard), reading messages,
pausing and resuming consumers, settling orphans, garbage collection and the numbers
behind ``stats()``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.queue.dialect import Dialect, Stmt
from app.queue.errors import MessageNotFound, NotDeadLettered
from app.queue.ops import (
    _MESSAGE_COLUMNS,
    NewMessage,
    Op,
    Rows,
    insert_delivery,
    insert_message,
    settle_message,
)
from app.queue.records import StoredMessage


@dataclass(frozen=True, slots=True)
class DeadLetterTarget:
    """Where a failed delivery goes: the DLQ topic and its groups, or parked in place."""

    dlq_topic: str | None
    dlq_groups: Sequence[str]


def dead_letter(
    d: Dialect,
    delivery_id: int,
    token: str | None,
    *,
    target: DeadLetterTarget,
    error: str,
    detail: dict[str, Any],
    now: int,
) -> Op[bool]:
    """Move a delivery's message to ``{topic}_dlq`` atomically, or park it.

    Parking (topics without a DLQ, such as DLQ topics themselves) keeps the message
    unsettled with the failure recorded, so it is never collected until an operator
    requeues or discards it: a message is never in zero places.
    """
    owner = "AND d.lease_token = :token" if token is not None else ""
    # PostgreSQL: the message row is locked first, as an ack does (ops.ack_many), so a
    # concurrent ack of another group's delivery cannot leave the message unsettled.
    lock = "FOR UPDATE OF m" if d.is_postgres else ""
    rows = yield Stmt(
        f"""SELECT d.id AS delivery_id, d.consumer_group, d.attempts, {_MESSAGE_COLUMNS}
            FROM queue_deliveries d JOIN queue_messages m ON m.seq = d.message_seq
            WHERE d.id = :id {owner} {lock}""",
        {"id": delivery_id, "token": token},
    )
    if not rows:
        return False
    row = rows[0]
    group = str(row["consumer_group"])
    detail_json = json.dumps({**detail, "consumer_group": group}, default=str)
    if target.dlq_topic is not None:
        yield from insert_message(
            d,
            NewMessage(
                topic=target.dlq_topic,
                partition_key=row["partition_key"],
                message_id=row["message_id"],
                payload_json=row["payload"],
                metadata_json=row["metadata"],
                source_group=group,
                original_topic=row["topic"],
                failure_count=int(row["attempts"]),
                last_error=error,
                failure_detail_json=detail_json,
                failed=True,
            ),
            groups=target.dlq_groups,
            now=now,
            park_if_unread=True,
        )
    else:
        if row["original_topic"] is not None:
            # A dead letter that its reconciler could not handle: keep the original
            # failure (topic, attempts, error) and record why it is parked beside it.
            earlier = json.loads(row["failure_detail"] or "{}")
            parked_detail = json.dumps({**earlier, "parked": {
                **detail, "consumer_group": group, "error": error,
                "attempts": int(row["attempts"]), "at_ms": now}}, default=str)
            yield Stmt(
                """UPDATE queue_messages SET parked = 1, settled_at_ms = NULL,
                   failure_detail = :detail WHERE seq = :seq""",
                {"detail": parked_detail, "seq": int(row["seq"])},
            )
        else:
            yield Stmt(
                """UPDATE queue_messages
                   SET parked = 1, settled_at_ms = NULL, failed_at_ms = :now,
                       failure_count = :fcount, last_error = :err, failure_detail = :detail
                   WHERE seq = :seq""",
                {"now": now, "fcount": int(row["attempts"]), "err": error,
                 "detail": detail_json, "seq": int(row["seq"])},
            )
    yield Stmt("DELETE FROM queue_deliveries WHERE id = :id", {"id": delivery_id})
    yield settle_message(int(row["seq"]), now)
    return True


def get_message(seq: int) -> Op[StoredMessage | None]:
    rows = yield Stmt(f"SELECT {_MESSAGE_COLUMNS} FROM queue_messages m WHERE m.seq = :seq",
                      {"seq": seq})
    return StoredMessage.from_row(rows[0]) if rows else None


def latest_seq() -> Op[int]:
    """The highest sequence number stored (0 when empty). Numbers are assigned at insert
    in increasing order, so every message numbered at or below the answer got its number
    before the answer was read (on PostgreSQL a lower number may commit later)."""
    rows = yield Stmt("SELECT MAX(seq) AS seq FROM queue_messages", {}, last=True)
    top = rows[0]["seq"] if rows else None
    return int(top) if top is not None else 0


def find_message(topic: str, message_id: str) -> Op[list[StoredMessage]]:
    rows = yield Stmt(
        f"""SELECT {_MESSAGE_COLUMNS} FROM queue_messages m
            WHERE m.topic = :t AND m.message_id = :mid ORDER BY m.seq""",
        {"t": topic, "mid": message_id},
    )
    return [StoredMessage.from_row(r) for r in rows]


def list_messages(
    topic: str, *, unsettled_only: bool, before_seq: int | None, limit: int
) -> Op[list[StoredMessage]]:
    cond = "AND m.settled_at_ms IS NULL" if unsettled_only else ""
    rows = yield Stmt(
        f"""SELECT {_MESSAGE_COLUMNS} FROM queue_messages m
            WHERE m.topic = :t AND m.seq < :before {cond}
            ORDER BY m.seq DESC LIMIT :n""",
        {"t": topic, "before": before_seq if before_seq is not None else 2**62, "n": limit},
    )
    return [StoredMessage.from_row(r) for r in rows]


def requeue(
    d: Dialect, seq: int, *, topic: str, now: int
) -> Op[StoredMessage]:
    """Give a dead-lettered or parked message another attempt, keeping its message id.

    A DLQ message goes back to its original topic for the group that failed it (the
    original row is re-used, or restored if it was collected) and leaves the DLQ. A
    parked message gets a fresh delivery for the group that parked it.
    """
    rows = yield Stmt(
        f"SELECT {_MESSAGE_COLUMNS} FROM queue_messages m WHERE m.seq = :seq AND m.topic = :t",
        {"seq": seq, "t": topic},
    )
    if not rows:
        raise MessageNotFound(f"no message {seq} in topic {topic!r}")
    msg = StoredMessage.from_row(rows[0])
    if msg.original_topic is None and not msg.parked:
        raise NotDeadLettered(f"message {seq} in {topic!r} is neither dead-lettered nor parked")
    group = (msg.failure_detail or {}).get("consumer_group") or msg.source_group
    if msg.original_topic is not None:
        target_topic = msg.original_topic
        lock = d.lock_partition(target_topic, msg.partition_key)
        if lock is not None:
            yield lock
        restored = yield Stmt(
            """INSERT INTO queue_messages
                 (topic, partition_key, message_id, source_group, payload, metadata,
                  published_at_ms, settled_at_ms, parked)
               VALUES (:t, :pk, :mid, '', :payload, :md, :now, NULL, 0)
               ON CONFLICT (topic, partition_key, message_id, source_group)
               DO UPDATE SET settled_at_ms = NULL, parked = 0
               RETURNING seq""",
            {"t": target_topic, "pk": msg.partition_key, "mid": msg.message_id,
             "payload": msg.payload_json, "md": json.dumps(msg.metadata), "now": now},
        )
        target_seq = int(restored[0]["seq"])
        yield Stmt("DELETE FROM queue_messages WHERE seq = :seq", {"seq": seq})
    else:
        target_topic, target_seq = msg.topic, msg.seq
        lock = d.lock_partition(target_topic, msg.partition_key)
        if lock is not None:
            yield lock
        yield Stmt(
            """UPDATE queue_messages
               SET parked = 0, settled_at_ms = NULL, failed_at_ms = NULL, failure_count = NULL,
                   last_error = NULL, failure_detail = NULL
               WHERE seq = :seq""",
            {"seq": seq},
        )
    yield from insert_delivery(d, group=str(group), topic=target_topic, pk=msg.partition_key,
                               seq=target_seq, now=now)
    notify = d.notify(target_topic)
    if notify is not None:
        yield notify
    return msg


def discard(seq: int, *, topic: str) -> Op[StoredMessage | None]:
    """Delete a message and every pending delivery of it."""
    rows = yield Stmt(
        f"SELECT {_MESSAGE_COLUMNS} FROM queue_messages m WHERE m.seq = :seq AND m.topic = :t",
        {"seq": seq, "t": topic},
    )
    if not rows:
        return None
    yield Stmt("DELETE FROM queue_deliveries WHERE message_seq = :seq", {"seq": seq})
    yield Stmt("DELETE FROM queue_messages WHERE seq = :seq", {"seq": seq})
    return StoredMessage.from_row(rows[0])


def pause(group: str, topic: str, partition_key: str, *, now: int, reason: str) -> Op[None]:
    yield Stmt(
        """INSERT INTO queue_pauses (consumer_group, topic, partition_key, paused_at_ms, reason)
           VALUES (:g, :t, :pk, :now, :reason)
           ON CONFLICT (consumer_group, topic, partition_key) DO NOTHING""",
        {"g": group, "t": topic, "pk": partition_key, "now": now, "reason": reason},
    )


def resume(group: str, topic: str, partition_key: str) -> Op[bool]:
    rows = yield Stmt(
        """DELETE FROM queue_pauses WHERE consumer_group = :g AND topic = :t
           AND partition_key = :pk RETURNING topic""",
        {"g": group, "t": topic, "pk": partition_key},
    )
    return bool(rows)


def settle_orphans(*, now: int) -> Op[int]:
    """Settle any message left with no delivery and no settlement. Acks and
    dead-letter moves lock the message row first (ops.ack_many), so two groups
    finishing one message at once settle it; this sweep, run before each garbage
    collection, is the backstop for a row written by an older version."""
    rows = yield Stmt(
        """UPDATE queue_messages SET settled_at_ms = :now
           WHERE settled_at_ms IS NULL AND parked = 0
             AND NOT EXISTS (SELECT 1 FROM queue_deliveries d
                             WHERE d.message_seq = queue_messages.seq)
           RETURNING seq""",
        {"now": now},
    )
    return len(rows)


def collect_garbage(*, cutoff: int, batch: int = 5000) -> Op[int]:
    """Delete settled messages older than the cutoff (their ids may then be re-used)."""
    rows = yield Stmt(
        """DELETE FROM queue_messages WHERE seq IN (
             SELECT seq FROM queue_messages
             WHERE settled_at_ms IS NOT NULL AND settled_at_ms < :cutoff LIMIT :n)
           RETURNING seq""",
        {"cutoff": cutoff, "n": batch},
    )
    return len(rows)


def next_due(group: str, topic: str, *, now: int) -> Op[int | None]:
    """When the next not-yet-available delivery of a consumer becomes available."""
    rows = yield Stmt(
        """SELECT MIN(available_at_ms) AS due FROM queue_deliveries
           WHERE consumer_group = :g AND topic = :t AND available_at_ms > :now""",
        {"g": group, "t": topic, "now": now},
        last=True,
    )
    due = rows[0]["due"] if rows else None
    return int(due) if due is not None else None


def raw_stats(now: int) -> Op[tuple[Rows, Rows, Rows]]:
    deliveries = yield Stmt(
        """SELECT topic, consumer_group, COUNT(*) AS depth,
             SUM(CASE WHEN lease_token IS NOT NULL AND available_at_ms > :now
                 THEN 1 ELSE 0 END) AS in_flight,
             SUM(CASE WHEN held = 1 AND lease_token IS NULL THEN 1 ELSE 0 END) AS held,
             SUM(CASE WHEN held = 0 AND lease_token IS NULL AND available_at_ms > :now
                 THEN 1 ELSE 0 END) AS retrying,
             MIN(created_at_ms) AS oldest
           FROM queue_deliveries GROUP BY topic, consumer_group""",
        {"now": now},
    )
    unsettled = yield Stmt(
        """SELECT topic, COUNT(*) AS unsettled, SUM(parked) AS parked
           FROM queue_messages WHERE settled_at_ms IS NULL GROUP BY topic""",
        {},
    )
    pauses = yield Stmt("SELECT consumer_group, topic, partition_key FROM queue_pauses", {})
    return deliveries, unsettled, pauses


def troubles(*, limit: int) -> Op[Rows]:
    """Unsettled messages that failed at least once, newest first, one row per
    (message, pending delivery): dead letters (``original_topic`` set, parked or waiting
    for their reconciler, with ``paused`` when that consumer is paused) and deliveries
    waiting for or running a retry (``attempts`` > 0 with the last attempt's error)."""
    rows = yield Stmt(
        """SELECT m.seq, m.topic, m.partition_key, m.payload, m.parked, m.original_topic,
             m.failure_count, m.last_error AS failed_error, m.failed_at_ms,
             d.consumer_group, d.attempts, d.last_error, d.available_at_ms, d.lease_token,
             CASE WHEN d.id IS NOT NULL AND EXISTS (
               SELECT 1 FROM queue_pauses p WHERE p.consumer_group = d.consumer_group
                 AND p.topic = d.topic AND p.partition_key IN ('', d.partition_key))
               THEN 1 ELSE 0 END AS paused
           FROM queue_messages m LEFT JOIN queue_deliveries d ON d.message_seq = m.seq
           WHERE m.settled_at_ms IS NULL
             AND (m.original_topic IS NOT NULL OR m.parked = 1
                  OR (d.attempts > 0 AND d.last_error IS NOT NULL AND d.held = 0))
           ORDER BY m.seq DESC LIMIT :n""",
        {"n": limit},
    )
    return rows
