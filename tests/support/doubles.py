"""Test doubles of a controller's world: a broker that records what is published (with
a fixed clock and the queue's message sequence), a delivery that records holds and
lease checks (and can have lost its lease), extensions a case can script, and a
metrics observer that keeps what it was told.

``Scripted`` wraps one seam of the demo queue's fakes: every call is recorded, and a
method named in its outcomes returns that value instead (or raises it, when it is an
exception) — so a case can make the merger report a conflict, the runner report a
status, or a cancel fail, and can assert that an acknowledged row called nothing.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.entities import RequestLog, RequestSummary
from app.queue import LeaseLost, Outgoing, PublishResult, StoredMessage

NOW_MS = 1_700_000_000_000
QUEUE = "demo"

SEAMS = ("provider", "analyzer", "runner", "merger", "scorer")


@dataclass(frozen=True)
class Published:
    topic: str
    partition_key: str
    message_id: str
    payload: Any

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.topic, self.partition_key, self.message_id)


class SimulatedCrash(Exception):
    """The process died here (raised by ``RecordingBroker`` when told to)."""


class RecordingBroker:
    """The two publishing calls controllers make, recorded in order; a fixed clock.

    ``crash_before(topic)`` makes the next publish to ``topic`` raise ``SimulatedCrash``
    instead (what was written before it stays written): redeliver to test the repair.

    ``latest_seq()`` is the queue's highest message number: ``stored_seq`` (the messages
    stored before the case, the delivered one included) plus one per message published.
    """

    def __init__(self, now_ms: int = NOW_MS, stored_seq: int = 1) -> None:
        self.now_ms = now_ms
        self.stored_seq = stored_seq
        self.published: list[Published] = []
        self._crash: set[str] = set()

    def clock(self) -> int:
        return self.now_ms

    async def latest_seq(self) -> int:
        return self.stored_seq + len(self.published)

    def crash_before(self, topic: str) -> None:
        self._crash.add(topic)

    def _check(self, topic: str) -> None:
        if topic in self._crash:
            self._crash.discard(topic)
            raise SimulatedCrash(f"crashed before publishing to {topic}")

    async def publish(self, topic: str, payload: Any, *, partition_key: str,
                      message_id: str, **_: Any) -> PublishResult:
        """Recorded every time; ``created`` as the queue says it (a key seen before
        stores nothing)."""
        self._check(topic)
        created = (topic, partition_key, message_id) not in self.keys()
        self.published.append(Published(topic, partition_key, message_id, payload))
        return PublishResult(seq=await self.latest_seq(), created=created)

    async def publish_many(self, batch: Sequence[Outgoing]) -> None:
        for o in batch:
            self._check(o.topic)
        for o in batch:
            self.published.append(Published(o.topic, o.partition_key, o.message_id, o.payload))

    async def publish_within(self, _execute: Any, batch: Sequence[Outgoing]) -> RecordedStage:
        """The outbox's publish: recorded once the caller's transaction commits
        (``committed()``); ``crash_before`` raises inside the transaction, so its writes
        roll back with it."""
        for o in batch:
            self._check(o.topic)
        seen = set(self.keys())
        out = [Published(o.topic, o.partition_key, o.message_id, o.payload) for o in batch]
        results = []
        for i, p in enumerate(out):
            results.append(PublishResult(seq=self.stored_seq + len(self.published) + i + 1,
                                         created=p.key not in seen))
            seen.add(p.key)
        return RecordedStage(self, out, results)

    def keys(self, topic: str | None = None) -> list[tuple[str, str, str]]:
        return [p.key for p in self.published if topic is None or p.topic == topic]

    def logs(self) -> list[str]:
        """The log ids published (``<sqid>/<status or event>[/...]``), in order."""
        return [p.message_id for p in self.published if p.topic == "log"]

    def payload(self, topic: str, message_id: str) -> Any:
        """The payload of the one message published as ``(topic, message_id)``."""
        found = [p.payload for p in self.published
                 if p.topic == topic and p.message_id == message_id]
        assert len(found) == 1, (topic, message_id, self.keys())
        return found[0]


@dataclass
class RecordedStage:
    broker: RecordingBroker
    messages: list[Published]
    results: list[PublishResult]

    def committed(self) -> None:
        self.broker.published.extend(self.messages)


class FakeDelivery:
    """What a controller sees of one delivery; ``hold`` is recorded, not performed.

    ``ensure_held()`` counts its calls (``lease_checks``) and, with ``lease_lost``,
    raises ``LeaseLost`` as a holder whose lease lapsed would. ``payload_json``: the
    stored text instead of ``payload`` encoded (a payload that is not JSON)."""

    def __init__(self, topic: str, payload: Any, *, message_id: str = "m-1",
                 partition_key: str = QUEUE, attempt: int = 1, seq: int = 1,
                 published_at_ms: int = NOW_MS, failure: dict[str, Any] | None = None,
                 lease_lost: bool = False, payload_json: str | None = None) -> None:
        failure = failure or {}
        self.lease_lost = lease_lost
        self.lease_checks = 0
        self.message = StoredMessage(
            seq=seq, topic=topic, partition_key=partition_key, message_id=message_id,
            payload_json=json.dumps(payload) if payload_json is None else payload_json,
            metadata={}, published_at_ms=published_at_ms,
            original_topic=failure.get("original_topic"),
            failure_count=failure.get("failure_count"), last_error=failure.get("last_error"),
            failure_detail=failure.get("failure_detail"), failed_at_ms=failure.get("failed_at_ms"))
        self.attempt = attempt
        self.held_ms: int | None = None

    @property
    def payload(self) -> Any:
        return self.message.payload

    @property
    def message_id(self) -> str:
        return self.message.message_id

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def partition_key(self) -> str:
        return self.message.partition_key

    @property
    def metadata(self) -> dict[str, Any]:
        return self.message.metadata

    def hold(self, ms: int) -> None:
        self.held_ms = ms

    async def ensure_held(self) -> None:
        self.lease_checks += 1
        if self.lease_lost:
            raise LeaseLost(f"the lease of message {self.message_id!r} was lost")


class Scripted:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.outcomes: dict[str, Any] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def script(self, **outcomes: Any) -> Scripted:
        self.outcomes.update(outcomes)
        return self

    def called(self, method: str | None = None) -> list[tuple[Any, ...]]:
        """Arguments of each call (of ``method``, or of any method), in order."""
        return [args for name, args in self.calls if method is None or name == method]

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        if inspect.iscoroutinefunction(attr):
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, args))
                return self._outcome(name) if name in self.outcomes \
                    else await attr(*args, **kwargs)
            return call_async

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return self._outcome(name) if name in self.outcomes else attr(*args, **kwargs)
        return call

    def _outcome(self, name: str) -> Any:
        outcome = self.outcomes[name]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class RecordingMetrics:
    """A ``PipelineMetrics`` that keeps what it was told."""

    def __init__(self) -> None:
        self.folded: list[tuple[RequestLog, RequestSummary | None]] = []
        self.merges: list[tuple[str, str]] = []
        self.timings: list[tuple[str, str, bool]] = []
        self.untested: list[tuple[str, bool]] = []
        self.rebuilt: list[tuple[str, int]] = []

    def untested_tree(self, queue: str, *, moved: bool) -> None:
        self.untested.append((queue, moved))

    def rebuilt_after_move(self, queue: str, count: int) -> None:
        if count:
            self.rebuilt.append((queue, count))

    def timed(self, what: str, queue: str, seconds: float, ok: bool) -> None:
        self.timings.append((what, queue, ok))

    def merge_finished(self, queue: str, outcome: str) -> None:
        self.merges.append((queue, outcome))

    def log_folded(self, entry: RequestLog, before: RequestSummary | None) -> None:
        self.folded.append((entry, before))
