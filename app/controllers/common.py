"""What every controller shares: its dependencies, publishing, logs, terminal writes,
and the metrics observer (``PipelineMetrics``; a no-op unless the composition root
wires one, so controllers never import a metrics library)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.engine import Database
from app.db.repos import requests as request_repo
from app.domain.checkrun import CheckFacts
from app.domain.entities import LandRequest, RequestLog, RequestSummary
from app.domain.errors import NotFound
from app.domain.freeze import FreezeWindowConfig
from app.domain.messages import LOG, SPECULATE, LogMsg, log_id
from app.domain.states import LogType, PublicStatus, RequestState
from app.extensions.base import QueueExtensions
from app.queue import Broker, Delivery, Outgoing, PublishResult, Staged

T = TypeVar("T")
#: (queue, sqid, log id) -> what the request page shows of the request, or None while
#: the request log does not hold that entry yet
FactsSource = Callable[[str, str, str], Awaitable[CheckFacts | None]]
Timed = Literal["speculation", "planner", "merge"]


class PipelineMetrics(Protocol):
    """What controllers report. Implementations must be cheap and must not raise."""

    def timed(self, what: Timed, queue: str, seconds: float, ok: bool) -> None:
        """A speculation run, its planner or a merger call took ``seconds`` (``ok``: it
        returned)."""

    def merge_finished(self, queue: str, outcome: str) -> None:
        """A batch's merge outcome (``succeeded``/``failed``) was written, once per batch."""

    def untested_tree(self, queue: str, *, moved: bool) -> None:
        """A merge was refused ``untested_tree`` (``moved``: the target moved outside
        the queue, a new trunk epoch)."""

    def rebuilt_after_move(self, queue: str, count: int) -> None:
        """``count`` paths were refuted and rebuilt because the target moved."""

    def log_folded(self, entry: RequestLog, before: RequestSummary | None) -> None:
        """The gateway folded ``entry``; ``before`` is the summary it replaced, or None
        when the entry did not win (see ``persist_log``)."""


class NoMetrics:
    """The default observer: records nothing."""

    def timed(self, what: Timed, queue: str, seconds: float, ok: bool) -> None:
        return None

    def merge_finished(self, queue: str, outcome: str) -> None:
        return None

    def untested_tree(self, queue: str, *, moved: bool) -> None:
        return None

    def rebuilt_after_move(self, queue: str, count: int) -> None:
        return None

    def log_folded(self, entry: RequestLog, before: RequestSummary | None) -> None:
        return None


def finished_request(entry: RequestLog, before: RequestSummary | None) -> tuple[str, float] | None:
    """``(terminal status, seconds since receipt)`` when this fold moved a request from a
    non-terminal to a terminal status, else None. A request is counted once: later
    repairs of a terminal status fold onto a summary that is already terminal."""
    if before is None or entry.type is not LogType.STATUS:
        return None
    if entry.status not in _PUBLIC_TERMINAL or before.status in _PUBLIC_TERMINAL:
        return None
    return entry.status, max(0, entry.timestamp_ms - before.received_at_ms) / 1000


_PUBLIC_TERMINAL = frozenset(s.value for s in PublicStatus if s.terminal)


def log_ids(payload: Any) -> Mapping[str, Any]:
    """Log ids named by a pipeline message payload: ``queue`` and its entity id, bound
    as ``sqid``, ``batch_id`` or ``entity_id`` (builds and others)."""
    if not isinstance(payload, Mapping):
        return {}
    out: dict[str, Any] = {}
    queue, ident = payload.get("queue"), payload.get("id", payload.get("request_id"))
    if isinstance(queue, str):
        out["queue"] = queue
    if isinstance(ident, str):
        if isinstance(queue, str) and ident.startswith(f"{queue}/batch/"):
            out["batch_id"] = ident
        elif isinstance(queue, str) and ident.startswith(f"{queue}/") and ident.count("/") == 1:
            out["sqid"] = ident
        else:
            out["entity_id"] = ident
    return out


@dataclass
class Deps:
    db: Database
    broker: Broker
    extensions: Callable[[str], QueueExtensions]
    metrics: PipelineMetrics = field(default_factory=NoMetrics)
    # each queue's scheduled freezes (queues.yaml; app/controllers/freeze.py)
    freeze_windows: Mapping[str, tuple[FreezeWindowConfig, ...]] = field(default_factory=dict)
    freeze_recheck_ms: int = 2000  # how often a merge held by a freeze looks again
    # what the request page shows of one request, for its GitHub check-run (the
    # composition root passes app/views/checkfacts.py; None: this process writes none)
    check_facts: FactsSource | None = None

    def now(self) -> int:
        return self.broker.clock()

    async def timed(self, what: Timed, queue: str, work: Awaitable[T]) -> T:
        """Await ``work`` and report its duration to the metrics observer."""
        started = time.perf_counter()
        ok = False
        try:
            result = await work
            ok = True
            return result
        finally:
            self.metrics.timed(what, queue, time.perf_counter() - started, ok)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[AsyncSession, Outbox]]:
        """A write transaction and its outbox: what the block publishes through the
        outbox is stored with its writes, and wakes consumers once they committed."""
        async with self.db.write() as s:
            outbox = Outbox(self, s)
            yield s, outbox
        outbox.committed()

    async def publish(self, topic: str, msg: BaseModel, *, message_id: str) -> PublishResult:
        """Publish ``msg`` on ``topic``, partitioned as the stage registry says
        (``app/controllers/stages.py``): no publisher chooses a partition key."""
        return await self.broker.publish(topic, msg.model_dump(mode="json"),
                                         partition_key=_key(topic, msg), message_id=message_id)

    async def publish_all(self, items: Sequence[Dispatch]) -> None:
        """Publish ``items`` (any topics) in one queue operation, in order."""
        if items:
            await self.broker.publish_many(outgoing(items))

    async def publish_logs(self, entries: Sequence[RequestLog]) -> None:
        await self.publish_all(log_items(entries))


Dispatch = tuple[str, BaseModel, str]  # topic, message, message id


def log_items(entries: Sequence[RequestLog]) -> list[Dispatch]:
    return [(LOG, x, x.log_id) for x in map(LogMsg.of, entries)]


def outgoing(items: Sequence[Dispatch]) -> list[Outgoing]:
    return [Outgoing(topic, msg.model_dump(mode="json"), _key(topic, msg), mid)
            for topic, msg, mid in items]


class Outbox:
    """Messages published in a write transaction, with its writes (a transactional
    outbox, ``Broker.publish_within``): stored if and only if the transaction commits,
    so a controller that writes a state and announces it cannot stop in between.

    ``speculate`` wake-ups are never published here: a speculate run skips a message
    numbered at or below the highest number it read before its snapshot, which is only
    sound when the write a wake-up announces committed before the wake-up got its
    number (see ``app/controllers/speculate.py``)."""

    def __init__(self, deps: Deps, session: AsyncSession) -> None:
        self._deps = deps
        self._session = session
        self._staged: list[Staged] = []

    async def _execute(self, sql: str, params: Any) -> list[dict[str, Any]]:
        return await self._deps.db.execute_raw(self._session, sql, params)

    async def publish(self, topic: str, msg: BaseModel, *, message_id: str) -> PublishResult:
        return (await self.publish_many([(topic, msg, message_id)]))[0]

    async def publish_many(self, items: Sequence[Dispatch]) -> list[PublishResult]:
        if not items:
            return []
        if any(topic == SPECULATE for topic, _, _ in items):
            raise ValueError("speculate wake-ups are published after the commit")
        staged = await self._deps.broker.publish_within(self._execute, outgoing(items))
        self._staged.append(staged)
        return staged.results

    async def logs(self, entries: Sequence[RequestLog]) -> None:
        await self.publish_many(log_items(entries))

    def committed(self) -> None:
        for staged in self._staged:
            staged.committed()
        self._staged.clear()


class StageController:
    """Base of the pipeline's controllers: each holds the shared dependencies."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps


def unique_id(base: str) -> str:
    """A message id for a hand-off that must not be deduplicated (no stable cause)."""
    return f"{base}@{uuid.uuid4().hex[:16]}"


def status_log(
    queue: str, sqid: str, status: str, *, now: int, version: int = 0, last_error: str = "",
    metadata: dict[str, Any] | None = None, occurrence: str | None = None,
) -> RequestLog:
    return RequestLog(
        queue=queue, request_id=sqid, timestamp_ms=now, type=LogType.STATUS, status=status,
        request_version=version, last_error=last_error, metadata=dict(metadata or {}),
        log_id=log_id(sqid, status, occurrence),
    )


def event_log(
    queue: str, sqid: str, event: str, *, now: int, occurrence: str,
    metadata: dict[str, Any] | None = None,
) -> RequestLog:
    return RequestLog(
        queue=queue, request_id=sqid, timestamp_ms=now, type=LogType.EVENT, event=event,
        metadata=dict(metadata or {}), log_id=log_id(sqid, event, occurrence),
    )


async def terminate_request(
    deps: Deps, *, queue: str, sqid: str, target: RequestState, last_error: str = "",
    metadata: dict[str, Any] | None = None, expected: LandRequest | None = None,
) -> str:
    """The only writer of terminal request states.

    ``expected``: the request as the caller loaded and classified it. The decision and
    the write are then made on exactly that version: the write is conditional on it,
    so a request that moved on since (a batch claimed it, a cancel made it
    ``cancelling``) raises ``VersionMismatch`` (retryable; the caller's next attempt
    reloads and classifies again) instead of being overwritten. Without ``expected``
    the request is reloaded here, for callers whose authority does not depend on what
    they read before (a terminal batch concluding its members).

    | Loaded (or expected) request | Action | Returns |
    |---|---|---|
    | missing | raise ``NotFound`` | - |
    | already ``target`` | skip the write, re-publish the terminal log (repair) | ``repaired`` |
    | another terminal state | leave it | ``diverged`` |
    | otherwise | conditional write (v+1), then publish the terminal log | ``terminated`` |
    | ``expected`` no longer current | raise ``VersionMismatch`` (nothing written) | - |
    """
    assert target.terminal
    if expected is None:
        async with deps.db.read() as s:
            current = await request_repo.get(s, queue=queue, id=sqid)
    elif (expected.queue, expected.id) != (queue, sqid):
        raise ValueError(f"expected request {expected.id} is not {sqid} of {queue}")
    else:
        current = expected
    if current.state is target:
        await deps.publish_logs([_terminal_log(current, metadata, deps.now())])
        return "repaired"
    if current.state.terminal:
        return "diverged"
    new = replace(current, state=target, version=current.version + 1, last_error=last_error)
    async with deps.db.write() as s:
        await request_repo.update(s, old=current, new=new, now_ms=deps.now())
    await deps.publish_logs([_terminal_log(new, metadata, deps.now())])
    return "terminated"


async def repair_terminal(deps: Deps, req: LandRequest,
                          metadata: dict[str, Any] | None = None) -> None:
    """Re-publish a terminal request's terminal log (same log id: a no-op if it was
    published). For controllers that find a request terminal on redelivery: the
    process that wrote the terminal state may have died before publishing its log.
    ``metadata``: what the writer's log carried, when the caller knows it."""
    if req.state.terminal:
        await deps.publish_logs([_terminal_log(req, metadata, deps.now())])


def _terminal_log(req: LandRequest, metadata: dict[str, Any] | None, now: int) -> RequestLog:
    return status_log(req.queue, req.id, req.state.value, now=now, version=req.version,
                      last_error=req.last_error, metadata=metadata)


async def load_request(deps: Deps, queue: str, sqid: str) -> LandRequest | None:
    try:
        async with deps.db.read() as s:
            return await request_repo.get(s, queue=queue, id=sqid)
    except NotFound:
        return None



KeyOf = Callable[[str, BaseModel], str]
_key_of: list[KeyOf] = []


def use_registry(key_of: KeyOf) -> None:
    """Publishing takes each topic's partition key from ``key_of``: the stage registry
    (``app/controllers/stages.py``) registers itself here when it loads. (The registry
    imports every controller and every controller imports this module, so the registry
    is handed in rather than imported.)"""
    _key_of[:] = [key_of]


def _key(topic: str, msg: BaseModel) -> str:
    if not _key_of:
        raise RuntimeError("no stage registry: import app.controllers.stages (the pipeline "
                           "and the runtime do) before publishing")
    return _key_of[0](topic, msg)


def tapped_entry(delivery: Delivery) -> RequestLog | None:
    """The log entry a tap on ``log`` (notify, GitHub check-run relays) was handed;
    None, with a warning, for a message that is not one: the gateway's own group
    dead-letters the same message, so a tap only acks it."""
    try:
        return LogMsg.model_validate(delivery.payload).entry()
    except (ValueError, PydanticValidationError):
        logging.getLogger("submitqueue.taps").warning(
            "not a log entry; left to the gateway's dead letters",
            extra={"topic": delivery.topic, "message_id": delivery.message_id})
        return None
