"""The broker: publish, claim and settle messages, wake consumers, and operate the queue.

All durable work is delegated to the operations in ``app/queue/ops.py`` run by a
backend; this module validates input, keeps the clock, and wakes local consumers
the moment something they can take is stored.

On PostgreSQL two things are written in batches, with no added delay: acks that
arrive while an ack is being written go together in the next statement, and a
publish wakes the consumers of other processes with a NOTIFY sent after its commit,
one for all topics published while the previous one was being sent (SQLite's
backend already commits concurrent operations together).

A broker given a ``member_id`` records it (and its generation) with every claim, and
on ``start()`` takes back, fenced, the claims an earlier run of the same member still
holds (``app/queue/members.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.queue import ops, ops_admin
from app.queue.backends import Backend
from app.queue.errors import InvalidPayload, MessageNotFound, PayloadTooLarge, UnknownTopic
from app.queue.members import Membership
from app.queue.records import (
    ClaimedDelivery,
    GroupStats,
    PublishResult,
    StoredMessage,
    TopicStats,
    Trouble,
)
from app.queue.topology import TopicSpec, Topology

log = logging.getLogger("submitqueue.queue")

MAX_KEY_LENGTH = 255


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to publish: stable ``message_id`` within ``(topic, partition_key)``."""

    topic: str
    payload: Any
    partition_key: str
    message_id: str
    metadata: Mapping[str, Any] | None = None


def _check_key(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"{kind} must be a non-empty string, got {value!r}")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidPayload(f"{kind} is {len(value)} characters; the limit is {MAX_KEY_LENGTH}")
    if "\x00" in value:
        raise InvalidPayload(f"{kind} must not contain NUL characters")
    return value


def _encode(kind: str, value: Any) -> str:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{kind} is not JSON-serialisable: {exc}") from exc
    if "\x00" in text:
        raise InvalidPayload(f"{kind} must not contain NUL characters")
    return text


Execute = Callable[[str, Any], Awaitable[list[dict[str, Any]]]]


@dataclass
class Staged:
    """Messages stored in a caller's transaction (``Broker.publish_within``)."""

    broker: Broker
    topics: list[str]
    results: list[PublishResult]

    def committed(self) -> None:
        """The caller's transaction committed: count the messages and wake consumers."""
        self.broker._committed(self)


class Broker:
    def __init__(
        self,
        backend: Backend,
        topology: Topology,
        *,
        max_payload_bytes: int = 1_048_576,
        clock: Callable[[], int] = now_ms,
        consumer_name: str | None = None,
        member_id: str | None = None,
        member_heartbeat_ms: int = 10_000,
    ) -> None:
        """``member_id``: this process's stable name (see ``app/queue/members.py``); with
        it, ``start()`` takes back the claims an earlier run of the member still holds.
        ``consumer_name``: this incarnation's label (default ``host:pid``); claims record
        it as their holder when there is no member id."""
        self.backend = backend
        self.topology = topology
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.consumer_name = consumer_name or f"{socket.gethostname()}:{os.getpid()}"
        if member_id is not None:
            _check_key("member_id", member_id)
        self.membership = Membership(
            backend, member_id, incarnation=self.consumer_name, clock=clock,
            heartbeat_ms=member_heartbeat_ms) if member_id is not None else None
        self._wakers: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._started = False
        self._acks: list[tuple[ClaimedDelivery, asyncio.Future[bool]]] = []
        self._ack_writer: asyncio.Task[None] | None = None
        self._to_notify: set[str] = set()
        self._notifier: asyncio.Task[None] | None = None
        self.published: Counter[str] = Counter()  # new messages stored, per topic

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        if not self._started:
            await self.backend.start(self.wake)
            self._started = True
            if self.membership is not None:
                joined = await self.membership.join()
                for topic in {t for _, t in joined.resumed}:
                    self.wake(topic)

    @property
    def member_id(self) -> str | None:
        return self.membership.member_id if self.membership is not None else None

    @property
    def generation(self) -> int | None:
        """This start's generation of the member (``None`` without a member id)."""
        return self.membership.generation if self.membership is not None else None

    async def close(self) -> None:
        for writer in (self._ack_writer, self._notifier):
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer
        if self.membership is not None and self._started:
            await self.membership.leave()
        if self._started:
            await self.backend.close()
            self._started = False

    # -- wake-ups ----------------------------------------------------------------
    def waker(self, topic: str) -> asyncio.Event:
        """An event set whenever ``topic`` may have something new to claim."""
        event = asyncio.Event()
        self._wakers[topic].add(event)
        return event

    def drop_waker(self, topic: str, event: asyncio.Event) -> None:
        self._wakers[topic].discard(event)

    def wake(self, topic: str) -> None:
        for event in self._wakers.get(topic, ()):
            event.set()

    # -- publishing --------------------------------------------------------------
    def _prepare(self, out: Outgoing) -> tuple[ops.NewMessage, list[str], TopicSpec]:
        spec = self.topology.spec(out.topic)
        payload_json = _encode("payload", out.payload)
        size = len(payload_json.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes; the limit is {self.max_payload_bytes} "
                "(SQ_QUEUE_MAX_PAYLOAD_BYTES)"
            )
        metadata = dict(out.metadata or {})
        msg = ops.NewMessage(
            topic=spec.name,
            partition_key=_check_key("partition_key", out.partition_key),
            message_id=_check_key("message_id", out.message_id),
            payload_json=payload_json,
            metadata_json=_encode("metadata", metadata),
        )
        return msg, self.topology.groups_for(spec.name, out.payload), spec

    async def publish(
        self,
        topic: str,
        payload: Any,
        *,
        partition_key: str,
        message_id: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> PublishResult:
        """Store a message once per ``(topic, partition_key, message_id)``.

        A duplicate (also of a message already consumed, until it is collected) is
        reported with ``created=False`` and stores nothing.
        """
        results = await self.publish_many(
            [Outgoing(topic, payload, partition_key, message_id, metadata)]
        )
        return results[0]

    async def publish_many(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish several messages atomically and in order (one transaction); every
        one is validated before any is stored."""
        prepared = [self._prepare(m) for m in messages]
        items = [
            ops.Publication(msg, groups, park_if_unread=spec.is_dlq)
            for msg, groups, spec in prepared
        ]
        dialect = self.backend.dialect
        seqs = await self.backend.run(
            ops.insert_messages(dialect, items, now=self.clock(), last=True,
                                notify=not dialect.is_postgres)
        )
        for (msg, _, _), seq in zip(prepared, seqs, strict=True):
            if seq is not None:
                self.published[msg.topic] += 1
        for topic in {msg.topic for msg, _, _ in prepared}:
            self.wake(topic)
        if dialect.is_postgres:
            self._notify_others({msg.topic for msg, groups, _ in prepared if groups})
        return [PublishResult(seq=s, created=s is not None) for s in seqs]

    async def publish_within(self, execute: Execute,
                             messages: Sequence[Outgoing]) -> Staged:
        """Store ``messages`` in the caller's open transaction, through ``execute`` (a
        transactional outbox: they commit, or vanish, with the caller's own writes).

        ``execute(sql, params)`` runs one statement on the caller's connection in the
        driver's parameter style (SQLite: ``:name`` with a dict; PostgreSQL: ``$n``
        with a tuple) and returns its rows as dicts. Nothing wakes until the caller
        calls ``committed()`` on the result after its commit (on PostgreSQL the other
        processes' NOTIFY is sent by the commit itself). Deduplication is publish's:
        a duplicate stores nothing and reports ``created=False``."""
        prepared = [self._prepare(m) for m in messages]
        items = [ops.Publication(msg, groups, park_if_unread=spec.is_dlq)
                 for msg, groups, spec in prepared]
        dialect = self.backend.dialect
        op = ops.insert_messages(dialect, items, now=self.clock(), notify=True)
        try:
            stmt = op.send(None)  # type: ignore[arg-type]
            while True:
                stmt = op.send(await execute(*dialect.driver_args(stmt)))
        except StopIteration as stop:
            seqs: list[int | None] = stop.value
        results = [PublishResult(seq=s, created=s is not None) for s in seqs]
        return Staged(self, [msg.topic for msg, _, _ in prepared], results)

    def _committed(self, staged: Staged) -> None:
        for topic, result in zip(staged.topics, staged.results, strict=True):
            if result.created:
                self.published[topic] += 1
        for topic in set(staged.topics):
            self.wake(topic)

    def _notify_others(self, topics: set[str]) -> None:
        if topics:
            self._to_notify |= topics
            if self._notifier is None or self._notifier.done():
                self._notifier = asyncio.create_task(self._send_notifies())

    async def _send_notifies(self) -> None:
        while self._to_notify:
            topics, self._to_notify = sorted(self._to_notify), set()
            try:
                await self.backend.run(ops.notify_alone(self.backend.dialect, topics))
            except Exception:  # consumers elsewhere find the messages when they poll
                log.warning("could not notify other processes", exc_info=True)

    # -- consuming ---------------------------------------------------------------
    async def claim(self, group: str, topic: str, limit: int) -> list[ClaimedDelivery]:
        """Lease up to ``limit`` deliveries of ``topic`` for ``group``.

        A delivery whose leases expired more often than the topic allows (its
        handler crashed or hung each time) is dead-lettered here instead.
        """
        spec = self.topology.spec(topic)
        now = self.clock()
        claimed = await self.backend.run(
            ops.claim(
                self.backend.dialect,
                group=group,
                topic=topic,
                serial=spec.serial,
                limit=limit,
                now=now,
                lease_until=now + spec.visibility_timeout_ms,
                token=uuid.uuid4().hex,
                consumer=self.member_id or self.consumer_name,
                generation=self.generation,
            )
        )
        fresh: list[ClaimedDelivery] = []
        for cd in claimed:
            if cd.attempt > spec.max_attempts:
                await self.dead_letter(
                    cd,
                    error=(
                        f"delivery lease expired {cd.attempt - 1} times without a result "
                        "(the handler crashed or hung)"
                    ),
                    detail={"reason": "lease-expired", "retryable": True},
                )
            else:
                fresh.append(cd)
        return fresh

    async def ack(self, cd: ClaimedDelivery) -> bool:
        """Settle a delivery; ``False`` if its lease was lost (it will be redelivered)."""
        dialect = self.backend.dialect
        if not dialect.is_postgres:
            return await self.backend.run(
                ops.ack(dialect, cd.delivery_id, cd.lease_token, self.clock())
            )
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._acks.append((cd, done))
        if self._ack_writer is None or self._ack_writer.done():
            self._ack_writer = asyncio.create_task(self._write_acks())
        return await done

    async def _write_acks(self) -> None:
        """Write the waiting acks, all of them in one statement, until none are left."""
        while self._acks:
            batch, self._acks = self._acks[:1000], self._acks[1000:]
            leases = [(cd.delivery_id, cd.lease_token) for cd, _ in batch]
            try:
                acked = await self.backend.run(
                    ops.ack_many(self.backend.dialect, leases, now=self.clock())
                )
            except Exception as exc:  # every ack of the batch failed; their leases lapse
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            except BaseException:
                for _, done in batch + self._acks:
                    done.cancel()
                self._acks = []
                raise
            for cd, done in batch:
                if not done.done():
                    done.set_result(cd.delivery_id in acked)

    async def retry(self, cd: ClaimedDelivery, *, delay_ms: int, error: str) -> bool:
        at = self.clock() + max(delay_ms, 0)
        return await self.backend.run(ops.retry(cd.delivery_id, cd.lease_token, at=at,
                                                error=error))

    async def hold(self, cd: ClaimedDelivery, *, delay_ms: int) -> bool:
        at = self.clock() + max(delay_ms, 0)
        return await self.backend.run(ops.hold(cd.delivery_id, cd.lease_token, at=at))

    async def release(self, cd: ClaimedDelivery) -> bool:
        done = await self.backend.run(ops.release(cd.delivery_id, cd.lease_token,
                                                  now=self.clock()))
        self.wake(cd.message.topic)
        return done

    async def extend(self, cd: ClaimedDelivery, *, lease_ms: int) -> bool:
        until = self.clock() + max(lease_ms, 0)
        return await self.backend.run(ops.extend(cd.delivery_id, cd.lease_token, until=until))

    def _dead_letter_target(self, topic: str) -> ops_admin.DeadLetterTarget:
        spec = self.topology.spec(topic)
        if not spec.dlq:
            return ops_admin.DeadLetterTarget(dlq_topic=None, dlq_groups=())
        return ops_admin.DeadLetterTarget(
            dlq_topic=spec.dlq_name, dlq_groups=self.topology.groups(spec.dlq_name)
        )

    async def dead_letter(
        self, cd: ClaimedDelivery, *, error: str, detail: Mapping[str, Any] | None = None
    ) -> bool:
        """Move the message to ``{topic}_dlq`` (or park it) with the error and attempts."""
        topic = cd.message.topic
        target = self._dead_letter_target(topic)
        moved = await self.backend.run(
            ops_admin.dead_letter(
                self.backend.dialect,
                cd.delivery_id,
                cd.lease_token,
                target=target,
                error=error,
                detail=dict(detail or {}),
                now=self.clock(),
            )
        )
        if moved and target.dlq_topic:
            self.wake(target.dlq_topic)
        return moved

    async def next_due(self, group: str, topic: str) -> int | None:
        return await self.backend.run(ops_admin.next_due(group, topic, now=self.clock()))

    # -- operations --------------------------------------------------------------
    async def get_message(self, seq: int) -> StoredMessage:
        msg = await self.backend.run(ops_admin.get_message(seq))
        if msg is None:
            raise MessageNotFound(f"no message {seq}")
        return msg

    async def latest_seq(self) -> int:
        """The highest message sequence number stored so far, over every topic (0 when
        empty). A database sequence, not a clock: a consumer can tell whether a message
        was published before some moment without comparing process clocks."""
        return await self.backend.run(ops_admin.latest_seq())

    async def find_messages(self, topic: str, message_id: str) -> list[StoredMessage]:
        self.topology.spec(topic)
        return await self.backend.run(ops_admin.find_message(topic, message_id))

    async def list_messages(
        self, topic: str, *, unsettled_only: bool = True, before_seq: int | None = None,
        limit: int = 50,
    ) -> list[StoredMessage]:
        self.topology.spec(topic)
        return await self.backend.run(
            ops_admin.list_messages(topic, unsettled_only=unsettled_only, before_seq=before_seq,
                              limit=max(1, min(limit, 1000)))
        )

    async def requeue(self, topic: str, seq: int) -> StoredMessage:
        """Send a dead-lettered or parked message back for another attempt (same id)."""
        self.topology.spec(topic)
        msg = await self.backend.run(
            ops_admin.requeue(self.backend.dialect, seq, topic=topic, now=self.clock())
        )
        self.wake(msg.original_topic or msg.topic)
        return msg

    async def discard(self, topic: str, seq: int, *, reason: str) -> StoredMessage:
        """Delete a message and its pending deliveries; the caller records the reason."""
        if not reason.strip():
            raise InvalidPayload("discarding a message needs a reason")
        self.topology.spec(topic)
        msg = await self.backend.run(ops_admin.discard(seq, topic=topic))
        if msg is None:
            raise MessageNotFound(f"no message {seq} in topic {topic!r}")
        log.warning("message discarded", extra={"topic": topic, "seq": seq, "reason": reason})
        return msg

    async def pause(
        self, group: str, topic: str, partition_key: str | None = None, *, reason: str = ""
    ) -> None:
        self.topology.spec(topic)
        await self.backend.run(
            ops_admin.pause(group, topic, partition_key or "", now=self.clock(), reason=reason)
        )

    async def resume(self, group: str, topic: str, partition_key: str | None = None) -> bool:
        self.topology.spec(topic)
        resumed = await self.backend.run(ops_admin.resume(group, topic, partition_key or ""))
        self.wake(topic)
        return resumed

    async def collect_garbage(self, retention_ms: int) -> int:
        """Delete settled messages older than the retention window; returns how many."""
        await self.backend.run(ops_admin.settle_orphans(now=self.clock()))
        cutoff = self.clock() - retention_ms
        total = 0
        while True:
            n = await self.backend.run(ops_admin.collect_garbage(cutoff=cutoff))
            total += n
            if n < 5000:
                return total

    async def troubles(self, *, limit: int = 1000) -> list[Trouble]:
        """Unsettled messages that failed at least once (retrying or dead-lettered), newest
        first, at most ``limit`` (one statement): what the status pages show as a stage
        that is retrying or waiting in a dead-letter queue."""
        rows = await self.backend.run(ops_admin.troubles(limit=max(1, min(limit, 10_000))))
        out: dict[int, Trouble] = {}
        for r in rows:
            seq = int(r["seq"])
            try:
                payload = json.loads(r["payload"])
            except ValueError:
                payload = None
            if r["original_topic"] is not None:
                topic, dlq, state = str(r["original_topic"]), str(r["topic"]), "dead_lettered"
                attempts, error = int(r["failure_count"] or 0), str(r["failed_error"] or "")
            elif r["parked"]:
                topic, dlq, state = str(r["topic"]), None, "dead_lettered"
                attempts, error = int(r["failure_count"] or 0), str(r["failed_error"] or "")
            else:
                topic, dlq, state = str(r["topic"]), None, "retrying"
                attempts, error = int(r["attempts"] or 0), str(r["last_error"] or "")
            try:
                budget: int | None = self.topology.spec(topic).max_attempts
            except UnknownTopic:
                budget = None
            running = state == "retrying" and r["lease_token"] is not None
            due = r["available_at_ms"]
            item = Trouble(
                seq=seq, topic=topic, partition_key=str(r["partition_key"]), payload=payload,
                state=state, attempts=attempts, max_attempts=budget, last_error=error,
                next_attempt_ms=None if state != "retrying" or running or due is None
                else int(due),
                running=running, dlq_topic=dlq, failed_at_ms=r["failed_at_ms"],
                parked=bool(r["parked"]), reconciler_paused=bool(r["paused"]))
            if seq not in out or item.needs_operator:
                out[seq] = item
        return list(out.values())

    async def stats(self) -> list[TopicStats]:
        now = self.clock()
        deliveries, unsettled, pauses = await self.backend.run(ops_admin.raw_stats(now))
        by_group = {(r["topic"], r["consumer_group"]): r for r in deliveries}
        unsettled_by_topic = {r["topic"]: r for r in unsettled}
        paused: dict[tuple[str, str], list[str]] = defaultdict(list)
        for p in pauses:
            paused[(p["topic"], p["consumer_group"])].append(p["partition_key"])
        out: list[TopicStats] = []
        for spec in sorted(self.topology.topics(), key=lambda s: s.name):
            groups = sorted(
                set(self.topology.groups(spec.name))
                | {g for (t, g) in by_group if t == spec.name}
            )
            gstats = []
            for g in groups:
                row = by_group.get((spec.name, g), {})
                keys = paused.get((spec.name, g), [])
                oldest = row.get("oldest")
                gstats.append(
                    GroupStats(
                        topic=spec.name,
                        consumer_group=g,
                        depth=int(row.get("depth") or 0),
                        in_flight=int(row.get("in_flight") or 0),
                        held=int(row.get("held") or 0),
                        retrying=int(row.get("retrying") or 0),
                        oldest_age_ms=(now - int(oldest)) if oldest is not None else None,
                        paused="" in keys,
                        paused_partitions=sorted(k for k in keys if k),
                    )
                )
            dlq = unsettled_by_topic.get(spec.dlq_name, {}) if spec.dlq else {}
            own = unsettled_by_topic.get(spec.name, {})
            out.append(
                TopicStats(
                    topic=spec.name,
                    serial=spec.serial,
                    is_dlq=spec.is_dlq,
                    groups=gstats,
                    dlq_topic=spec.dlq_name if spec.dlq else None,
                    dlq_size=int(dlq.get("unsettled") or 0),
                    dlq_parked=int(dlq.get("parked") or 0),
                    parked=int(own.get("parked") or 0),
                )
            )
        return out
