"""The consumer framework: controllers see a ``Delivery`` and never settle it themselves.

Outcome of ``await controller.process(delivery)``:

| Result | What the framework does |
|---|---|
| returns, no hold | ack |
| returns after ``delivery.hold(ms)`` | postpone ``ms`` without spending an |
| (the last call wins) | attempt; the partition waits behind it |
| raises, retryable, attempts left | retry after the topic's backoff; attempts |
| (``classify`` decides) | are counted durably |
| raises, not retryable, or | move to ``{topic}_dlq`` with the error and |
| attempts exhausted | attempt count (parked if no DLQ) |
| raises while holding | the error wins; the hold is discarded |
| a ``guard`` (``app/queue/guard.py``) | hold without running / hold instead of |
| rules on it before or after a failure | retrying (no attempt) / dead-letter at once |
| raises an error with ``park = True`` | dead-letter (or park) at once, even on an always-retry |
| (e.g. an undecodable DLQ message) | topic: retrying cannot help; an operator decides |
| its lease is lost while it runs (a | the handler is cancelled; whatever it then returns or |
| renewal or ``ensure_held()`` finds | raises is discarded: nothing is settled, no attempt |
| the receipt stale) | counted; the successor owns the message (``lease_lost``) |

A controller's exception never stops its consumer loop. While a handler runs its
lease is extended automatically, so only a crashed, hung or frozen process lets the
message come back (after the visibility timeout, or at once when the process is
restarted with the same member id). A handler about to perform an external effect
calls ``await delivery.ensure_held()`` first (see ``app/queue/delivery.py``).

Observability hooks (both optional, both generic):

- ``on_handled(topic, group, outcome, seconds)`` is called after every handler run
  with its outcome (``acked``, ``held``, ``waiting`` (the guard held it), ``retried``,
  ``dead_lettered``, ``released``, ``lease_lost``, ``error``) and wall time; an
  observer that raises is logged and ignored.
- Log context: around each handler the ids ``topic``, ``group``, ``message_id``,
  ``partition_key`` and ``attempt`` are bound with ``structlog.contextvars`` (so every
  log line the handler writes carries them), plus whatever ``log_context(payload)``
  returns (e.g. the entity ids a payload names).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from app.queue.broker import Broker
from app.queue.classify import classify
from app.queue.delivery import Delivery, Lease
from app.queue.guard import Guard, Ruling
from app.queue.records import ClaimedDelivery

log = logging.getLogger("submitqueue.queue")


class Controller(Protocol):
    async def process(self, delivery: Delivery) -> None: ...


HandledObserver = Callable[[str, str, str, float], None]
"""``(topic, group, outcome, seconds)``, called after each handler run."""

LogContext = Callable[[Any], Mapping[str, Any]]
"""Extra log ids bound around a handler, from the message payload."""


class Chaos:
    """Chaos delivery mode for tests: every handler runs twice (a redelivery), and a
    fraction of runs fail *after* their writes (a crash before the ack)."""

    def __init__(self, *, duplicate: bool = False, fail_rate: float = 0.0,
                 seed: int | None = None) -> None:
        self.duplicate = duplicate
        self.fail_rate = fail_rate
        self._random = random.Random(seed)

    @property
    def enabled(self) -> bool:
        return self.duplicate or self.fail_rate > 0

    def should_fail(self) -> bool:
        return self._random.random() < self.fail_rate


class ChaosFailure(Exception):
    """Injected by chaos mode after a handler ran; retried like a crash."""

    retryable = True


@dataclass
class ConsumerSpec:
    topic: str
    group: str
    controller: Controller
    concurrency: int = 8


@dataclass
class ConsumerCounters:
    """Outcome counts since start, for tests and metrics."""

    acked: int = 0
    held: int = 0
    waiting: int = 0  # held by the guard (a dependency is down)
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0
    errors: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Consumer:
    """One loop per (group, topic): claims what it can run and runs it."""

    def __init__(self, broker: Broker, spec: ConsumerSpec, *, poll_interval_ms: int = 500,
                 chaos: Chaos | None = None, on_handled: HandledObserver | None = None,
                 log_context: LogContext | None = None, guard: Guard | None = None) -> None:
        self.broker = broker
        self.on_handled = on_handled
        self.guard = guard if not broker.topology.spec(spec.topic).is_dlq else None
        self.log_context = log_context
        self.spec = spec
        self.topic_spec = broker.topology.spec(spec.topic)
        self.poll_interval_ms = poll_interval_ms
        self.counters = ConsumerCounters()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake = broker.waker(spec.topic)
        chaotic = chaos is not None and chaos.enabled and not self.topic_spec.is_dlq
        self.chaos = chaos if chaotic else None

    @property
    def name(self) -> str:
        return f"{self.spec.group}/{self.spec.topic}"

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def running(self) -> bool:
        """Its claim loop is alive (started, not stopped, not crashed)."""
        return self._loop_task is not None and not self._loop_task.done()

    def start(self) -> None:
        if self._loop_task is None:
            self._stopping = False
            self._loop_task = asyncio.create_task(self._run(), name=f"consumer:{self.name}")

    async def stop(self, grace_ms: int = 10_000) -> None:
        """Stop claiming; let running handlers finish within ``grace_ms``, release the rest."""
        self._stopping = True
        self._wake.set()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_ms / 1000)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        self.broker.drop_waker(self.spec.topic, self._wake)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            free = self.spec.concurrency - len(self._tasks)
            claimed: list[ClaimedDelivery] = []
            if free > 0:
                try:
                    claimed = await self.broker.claim(self.spec.group, self.spec.topic, free)
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("claim failed", extra={"consumer": self.name})
                    await asyncio.sleep(min(5.0, 0.05 * 2 ** min(failures, 7)))
                    continue
                for cd in claimed:
                    task = asyncio.create_task(self._handle(cd))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            # Full: wait for a handler to finish. Otherwise nothing more is claimable
            # now: wait for a publish, a settle, or the next held/retrying message.
            await self._idle(full=len(claimed) >= free)

    async def _idle(self, *, full: bool) -> None:
        timeout = self.poll_interval_ms / 1000
        if not full:
            try:
                due = await self.broker.next_due(self.spec.group, self.spec.topic)
            except Exception:
                due = None
            if due is not None:
                timeout = max(0.0, min(timeout, (due - self.broker.clock()) / 1000))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    async def _extend_forever(self, cd: ClaimedDelivery, lease: Lease,
                              handler: asyncio.Task[Any]) -> None:
        """Renew the lease while the handler runs; when it is lost, cancel the handler."""
        lease_ms = self.topic_spec.visibility_timeout_ms
        while not lease.lost:
            await asyncio.sleep(lease_ms / 3000)
            if lease.lost:  # the handler's own ensure_held() found out first
                return
            try:
                held = await self.broker.extend(cd, lease_ms=lease_ms)
            except Exception:
                log.warning("lease extension failed", extra={"consumer": self.name})
                continue
            if not held:
                lease.lost = True
                lease.cancelled_handler = True
                log.warning(
                    "lease lost while the handler ran; cancelling it (another consumer "
                    "holds the message now)",
                    extra={"consumer": self.name, "message_id": cd.message.message_id,
                           "attempt": cd.attempt})
                handler.cancel()
                return

    def _log_ids(self, cd: ClaimedDelivery) -> dict[str, Any]:
        ids: dict[str, Any] = {
            "topic": cd.message.topic, "group": cd.consumer_group,
            "message_id": cd.message.message_id, "partition_key": cd.message.partition_key,
            "attempt": cd.attempt,
        }
        if self.log_context is not None:
            try:
                ids.update(self.log_context(cd.message.payload))
            except Exception:
                log.warning("log context failed", extra={"consumer": self.name}, exc_info=True)
        return ids

    async def _handle(self, cd: ClaimedDelivery) -> None:
        # Each handler runs in its own task (its own copy of the context), so these
        # bindings reach only this handler's log lines.
        structlog.contextvars.bind_contextvars(**self._log_ids(cd))
        lease = Lease()
        delivery = Delivery(self.broker, cd, self.topic_spec.visibility_timeout_ms, lease)
        handler = asyncio.current_task()
        assert handler is not None
        extender = asyncio.create_task(self._extend_forever(cd, lease, handler))
        outcome = "error"
        started = time.perf_counter()
        try:
            ruling = await self._ask("before", cd)
            if ruling is not None:
                extender.cancel()
                outcome = await self._rule(cd, ruling, error=ruling.error)
                return
            try:
                try:
                    await self.spec.controller.process(delivery)
                    if self.chaos is not None:
                        delivery = await self._chaos(cd, delivery, lease)
                finally:
                    extender.cancel()  # from here on it cannot cancel the handler
            except asyncio.CancelledError:
                if not lease.lost:
                    outcome = "released"
                    await asyncio.shield(self._settle(self.broker.release(cd)))
                    raise
                outcome = "lease_lost"  # a stale receipt: nothing to release
                if not _only_our_cancel(handler, lease):
                    raise  # also cancelled from outside (shutdown)
            except Exception as exc:
                if lease.lost:  # LeaseLost, or whatever the handler made of it
                    outcome = "lease_lost"
                    _only_our_cancel(handler, lease)
                else:
                    outcome = await self._failed(cd, exc)
            else:
                if lease.lost:  # the handler swallowed LeaseLost or the cancellation
                    outcome = "lease_lost"
                    _only_our_cancel(handler, lease)
                else:
                    await self._ask("succeeded", cd, held=delivery.held_ms is not None)
                    outcome = "acked" if delivery.held_ms is None else "held"
                    ok = await self._settle(
                        self.broker.ack(cd) if delivery.held_ms is None
                        else self.broker.hold(cd, delay_ms=delivery.held_ms))
                    if ok is False:
                        outcome = "lease_lost"
        finally:
            extender.cancel()
            self._count(outcome)
            self._observe(outcome, time.perf_counter() - started)
            self._wake.set()  # a settled message may unblock its partition

    def _observe(self, outcome: str, seconds: float) -> None:
        if self.on_handled is None:
            return
        try:
            self.on_handled(self.spec.topic, self.spec.group, outcome, seconds)
        except Exception:
            log.warning("handler observer failed", extra={"consumer": self.name}, exc_info=True)

    async def _chaos(self, cd: ClaimedDelivery, first: Delivery, lease: Lease) -> Delivery:
        assert self.chaos is not None
        delivery = first
        if self.chaos.duplicate:
            delivery = Delivery(self.broker, cd, self.topic_spec.visibility_timeout_ms, lease)
            await self.spec.controller.process(delivery)
        if self.chaos.should_fail():
            raise ChaosFailure("chaos mode: failing after the handler's writes")
        return delivery

    async def _ask(self, what: str, cd: ClaimedDelivery,
                   exc: BaseException | None = None, held: bool = False) -> Ruling | None:
        """Ask the guard (if any); a guard that fails is logged and ignored."""
        if self.guard is None:
            return None
        try:
            if what == "before":
                return await self.guard.before(cd)
            if what == "failed":
                assert exc is not None
                return await self.guard.failed(cd, exc)
            await self.guard.succeeded(cd, held=held)
        except Exception:
            log.warning("consumer guard failed", extra={"consumer": self.name}, exc_info=True)
        return None

    async def _rule(self, cd: ClaimedDelivery, ruling: Ruling, *, error: str) -> str:
        """Carry out a guard's ruling: hold (``waiting``) or dead-letter at once."""
        if ruling.hold_ms is not None:
            ok = await self._settle(self.broker.hold(cd, delay_ms=ruling.hold_ms))
            return "waiting" if ok is not False else "lease_lost"
        log.warning("guard gave up on a message; dead-lettering",
                    extra={"consumer": self.name, "message_id": cd.message.message_id,
                           "error": error})
        detail = {"retryable": True, "reason": "guard", **ruling.detail}
        ok = await self._settle(self.broker.dead_letter(cd, error=error, detail=detail))
        return "dead_lettered" if ok is not False else "lease_lost"

    async def _failed(self, cd: ClaimedDelivery, exc: Exception) -> str:
        park_now = bool(getattr(exc, "park", False))
        ruling = None if park_now else await self._ask("failed", cd, exc)
        if ruling is not None:
            return await self._rule(cd, ruling, error=ruling.error or describe_error(exc))
        retryable = not park_now and (self.topic_spec.always_retry or classify(exc))
        error = describe_error(exc)
        if retryable and cd.attempt < self.topic_spec.max_attempts:
            delay = self.topic_spec.backoff.delay_ms(cd.attempt)
            log.info(
                "handler failed; will retry",
                extra={"consumer": self.name, "message_id": cd.message.message_id,
                       "attempt": cd.attempt, "error": error},
            )
            ok = await self._settle(self.broker.retry(cd, delay_ms=delay, error=error))
            return "retried" if ok is not False else "lease_lost"
        log.warning(
            "handler failed; dead-lettering",
            extra={"consumer": self.name, "message_id": cd.message.message_id,
                   "attempt": cd.attempt, "error": error, "retryable": retryable},
        )
        detail = {
            "retryable": retryable,
            "exception_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "reason": "attempts-exhausted" if retryable
            else "unprocessable" if park_now else "not-retryable",
        }
        subjects = getattr(exc, "subjects", None)
        if subjects:
            detail["subjects"] = subjects
        ok = await self._settle(self.broker.dead_letter(cd, error=error, detail=detail))
        return "dead_lettered" if ok is not False else "lease_lost"

    async def _settle(self, coro: Any) -> bool | None:
        """Run a settle operation; on a database failure the lease will lapse instead."""
        try:
            return bool(await coro)
        except Exception:
            log.exception("could not settle a delivery; it will be redelivered",
                          extra={"consumer": self.name})
            return None

    def _count(self, outcome: str) -> None:
        c = self.counters
        c.by_outcome[outcome] = c.by_outcome.get(outcome, 0) + 1
        if hasattr(c, outcome) and isinstance(getattr(c, outcome), int):
            setattr(c, outcome, getattr(c, outcome) + 1)


def _only_our_cancel(handler: asyncio.Task[Any], lease: Lease) -> bool:
    """Withdraw the cancellation the lease extender requested; ``True`` if no other
    cancellation (a shutdown) is pending, so the handler task may end normally."""
    if lease.cancelled_handler:
        lease.cancelled_handler = False
        return handler.uncancel() == 0
    return handler.cancelling() == 0


class ConsumerService:
    """Runs a set of consumers as one lifespan service (garbage collection of settled
    messages is a job of the runtime's scheduler: ``Broker.collect_garbage``)."""

    def __init__(
        self,
        broker: Broker,
        specs: list[ConsumerSpec],
        *,
        poll_interval_ms: int = 500,
        shutdown_grace_ms: int = 10_000,
        chaos: Chaos | None = None,
        on_handled: HandledObserver | None = None,
        log_context: LogContext | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.broker = broker
        self.consumers = [
            Consumer(broker, s, poll_interval_ms=poll_interval_ms, chaos=chaos,
                     on_handled=on_handled, log_context=log_context, guard=guard)
            for s in specs
        ]
        self.shutdown_grace_ms = shutdown_grace_ms

    async def start(self) -> None:
        for consumer in self.consumers:
            consumer.start()

    @property
    def running(self) -> int:
        """How many consumer loops are alive."""
        return sum(1 for c in self.consumers if c.running)

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop(self.shutdown_grace_ms) for c in self.consumers))
