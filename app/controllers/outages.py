"""The outage guard: rides out a dependency that is down instead of dead-lettering
the messages that need it (the rules: ``app/domain/outages.py``; the hook:
``app/queue/guard.py``).

Which dependencies a message needs follows from its topic and its queue (the payload's
``queue``, else the partition key's first segment):

| Topics | Needs (circuit) |
|---|---|
| ``validate``, ``mergecheck``, ``merge`` | ``repository:<queue>`` (+ ``github:<queue>`` once it failed there) |
| ``build``, ``buildsignal`` | ``builds:<queue>`` (+ ``repository:<queue>`` once it failed there) |
| every other topic | only the kinds it has failed on in this process; there, an error that names no dependency (a bare ``ConnectionError``) keeps the queue's usual budget |

| Moment | Circuit | Ruling |
|---|---|---|
| before a handler | every circuit it needs closed | run |
| before a handler | one open, probe not due | hold until the probe or the next recheck tick, whichever is first (no attempt) |
| before a handler | one open, probe due, this consumer wins ``take_probe`` | run (the probe) |
| before a handler | one open, probe due, another won it | hold until the next probe or recheck tick |
| before a handler / after a failure | open, and the message waited longer than the window | give up: dead letter with ``reason = dependency_unavailable`` (the reconciler ends the request ``error`` with that reason) |
| after a failure | the error is infrastructure (``infrastructure_kind``) | record it (may open the circuit); hold with backoff, no attempt |
| after a failure | ``database`` kind (the circuit store itself) | hold with backoff from an in-process count, no attempt |
| after a failure | logic / input error | none: the queue's usual short budget, then the DLQ |
| after a success that held (a poll) | any | nothing: inconclusive (the next probe decides) |
| after a success | a circuit it needs is open and this run was its probe | close it (one write; the next read of any process sees it) |
| after a success | a circuit it needs is closed with failures counted | reset the count |

Circuits are read through a cache refreshed at most every ``refresh_ms`` (so the hot
path costs no query), written on every failure and on the first success.
"""  # noqa: E501 - the tables read best unwrapped

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.controllers.common import Deps
from app.db.repos import circuits as circuit_repo
from app.domain import messages as m
from app.domain import outages as o
from app.domain.queue_config import OutageKnobs, QueueConfig
from app.queue.consumer import describe_error
from app.queue.guard import Ruling
from app.queue.records import ClaimedDelivery

log = logging.getLogger("submitqueue.outages")

NEEDS: dict[str, tuple[str, ...]] = {
    m.VALIDATE: (o.REPOSITORY,), m.MERGECHECK: (o.REPOSITORY,),
    m.MERGE: (o.REPOSITORY,), m.BUILD: (o.BUILDS,), m.BUILDSIGNAL: (o.BUILDS,),
}
DEFAULT_KIND = {topic: kinds[0] for topic, kinds in NEEDS.items()}

Notify = Callable[[o.Circuit, int], Any]


def policy_for(base: o.OutagePolicy, queue: QueueConfig | None, kind: str) -> o.OutagePolicy:
    """The base policy with the queue's overrides, then the dependency kind's."""
    policy = base
    if queue is None:
        return policy
    layers: list[OutageKnobs] = [queue.outages]
    per_kind = queue.outages.dependencies.get(kind)  # type: ignore[call-overload]
    if per_kind is not None:
        layers.append(per_kind)
    for k in layers:
        policy = o.OutagePolicy(
            window_ms=int(k.window_s * 1000) if k.window_s is not None else policy.window_ms,
            threshold=k.threshold if k.threshold is not None else policy.threshold,
            initial_ms=k.probe_initial_ms if k.probe_initial_ms is not None
            else policy.initial_ms,
            max_ms=k.probe_max_ms if k.probe_max_ms is not None else policy.max_ms,
            jitter=policy.jitter,
            notify_after_ms=int(k.notify_after_s * 1000) if k.notify_after_s is not None
            else policy.notify_after_ms)
    return policy


def queue_of(cd: ClaimedDelivery) -> str:
    try:
        payload = cd.message.payload
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("queue"), str):
        return str(payload["queue"])
    return cd.message.partition_key.split("/", 1)[0]


class OutageGuard:
    """The consumers' ``Guard``: one per process, shared by every consumer."""

    def __init__(self, deps: Deps, *, base: o.OutagePolicy,
                 queues: Mapping[str, QueueConfig], recheck_ms: int = 5000,
                 refresh_ms: int = 1000, notify: Notify | None = None,
                 rand: random.Random | None = None) -> None:
        self.deps = deps
        self.base = base
        self.queues = queues
        self.recheck_ms = recheck_ms
        self.refresh_ms = refresh_ms
        self.notify = notify
        self.rand = rand or random.Random()
        self._cache: dict[str, o.Circuit] = {}
        self._loaded_at = -1.0
        self._lock = asyncio.Lock()
        self._learned: dict[str, set[str]] = {}
        self._db_failures = 0
        self._probes: set[int] = set()  # delivery ids running as a probe
        self._last_error: dict[str, str] = {}  # by dependency, for a give-up's text

    # -- reading ---------------------------------------------------------------------

    async def circuits(self, *, fresh: bool = False) -> dict[str, o.Circuit]:
        """Every known circuit (the cache, refreshed when older than ``refresh_ms``)."""
        if fresh or time.monotonic() - self._loaded_at > self.refresh_ms / 1000:
            async with self._lock:
                if fresh or time.monotonic() - self._loaded_at > self.refresh_ms / 1000:
                    async with self.deps.db.read() as s:
                        self._cache = await circuit_repo.load_all(s)
                    self._loaded_at = time.monotonic()
        return self._cache

    def policy(self, dependency: str) -> o.OutagePolicy:
        kind, _, queue = dependency.partition(":")
        return policy_for(self.base, self.queues.get(queue), kind)

    def needs(self, cd: ClaimedDelivery) -> list[str]:
        topic = cd.message.topic
        kinds = [*NEEDS.get(topic, ()), *sorted(self._learned.get(topic, ()))]
        q = queue_of(cd)
        return [f"{k}:{q}" for k in dict.fromkeys(kinds)]

    # -- the Guard protocol -------------------------------------------------------------

    async def before(self, cd: ClaimedDelivery) -> Ruling | None:
        needs = self.needs(cd)
        if not needs:
            return None
        circuits = await self.circuits()
        for dep in needs:
            c = circuits.get(dep)
            if c is None or not c.is_open:
                continue
            ruling = await self._gate(c, cd)
            if ruling is not None:
                return ruling
        return None

    async def _gate(self, c: o.Circuit, cd: ClaimedDelivery) -> Ruling | None:
        now = self.deps.now()
        policy = self.policy(c.dependency)
        d = o.decide(c, now_ms=now, published_at_ms=cd.message.published_at_ms, policy=policy)
        if d.verdict is o.Verdict.GIVE_UP:
            return self._give_up(c, d.down_ms, self._last_error.get(
                c.dependency, "it did not answer the probes"))
        if d.verdict is o.Verdict.HOLD:
            return self._hold(d.hold_ms)
        if d.verdict is o.Verdict.RUN:
            return None
        nxt = now + policy.delay_ms(c.probes + 1, self.rand)
        async with self.deps.db.write() as s:
            won = await circuit_repo.take_probe(s, dependency=c.dependency,
                                                seen_ms=c.probe_at_ms, next_ms=nxt)
        self._cache = {**self._cache, c.dependency: o.Circuit(
            **{**_fields(c), "probe_at_ms": nxt})} if won else self._cache
        if won:
            self._probes.add(cd.delivery_id)
            log.info("probing a dependency", extra={"dependency": c.dependency,
                                                    "message_id": cd.message.message_id})
            return None
        fresh = (await self.circuits(fresh=True)).get(c.dependency, c)
        return self._hold(max(1, fresh.probe_at_ms - now))

    async def failed(self, cd: ClaimedDelivery, exc: BaseException) -> Ruling | None:
        self._probes.discard(cd.delivery_id)
        topic = cd.message.topic
        # a topic that calls no external system (start, batch, speculate, ...) rides out
        # only errors that name their dependency, and the database's own
        kind = o.infrastructure_kind(exc, DEFAULT_KIND.get(topic, ""))
        if not kind:
            return None
        if kind == o.DATABASE:
            self._db_failures += 1
            return Ruling.hold(self.base.delay_ms(self._db_failures - 1, self.rand))
        self._learned.setdefault(topic, set()).add(kind)
        dep = f"{kind}:{queue_of(cd)}"
        policy = self.policy(dep)
        now = self.deps.now()
        try:
            async with self.deps.db.write() as s:
                before = await circuit_repo.load(s, dependency=dep)
                c = o.record_failure(before, now_ms=now, policy=policy, rand=self.rand)
                await circuit_repo.save(s, circuit=c)
        except Exception:  # the circuit store is down too: hold, count in memory
            log.warning("could not record a circuit failure", extra={"dependency": dep},
                        exc_info=True)
            self._db_failures += 1
            return Ruling.hold(policy.delay_ms(self._db_failures - 1, self.rand))
        self._db_failures = 0
        self._cache = {**self._cache, dep: c}
        self._last_error[dep] = describe_error(exc)[:500]
        if c.is_open and not before.is_open:
            log.warning("circuit opened: dependency unreachable",
                        extra={"dependency": dep, "error": describe_error(exc)})
        await self._maybe_notify(c, now, policy)
        d = o.after_failure(c, now_ms=now, published_at_ms=cd.message.published_at_ms,
                            policy=policy, rand=self.rand)
        if d.verdict is o.Verdict.GIVE_UP:
            return self._give_up(c, d.down_ms, describe_error(exc))
        return self._hold(d.hold_ms)

    async def succeeded(self, cd: ClaimedDelivery, *, held: bool) -> None:
        probe = cd.delivery_id in self._probes
        self._probes.discard(cd.delivery_id)
        if held:
            return  # a poll that will look again (a build still running) proves nothing
        needs = self.needs(cd)
        if not needs:
            return
        circuits = await self.circuits()
        for dep in needs:
            c = circuits.get(dep)
            if c is None or (not c.failures and not c.is_open) or (c.is_open and not probe):
                continue  # a run that was not the probe proves nothing about the outage
            closed = o.record_success(c)
            async with self.deps.db.write() as s:
                await circuit_repo.save(s, circuit=closed)
            self._cache = {**self._cache, dep: closed}
            if c.is_open:
                log.warning("circuit closed: dependency reachable again",
                            extra={"dependency": dep,
                                   "down_ms": c.open_for_ms(self.deps.now())})

    # -- helpers ------------------------------------------------------------------------

    def _hold(self, ms: int) -> Ruling:
        """Hold until the probe is due, looking again at the next recheck *tick* at the
        latest. Ticks are aligned on the clock (multiples of ``recheck_ms``), so every
        message held for one outage becomes due at the same instant and the queue hands
        them out in delivery order: the queue drains in order once the circuit closes.
        (Held messages only read the cache; the one probe is won by a conditional
        write, so there is no herd to spread out with jitter.)"""
        now = self.deps.now()
        tick = max(1, self.recheck_ms)
        next_tick = (now // tick + 1) * tick
        return Ruling.hold(max(1, min(ms, next_tick - now)))

    def _give_up(self, c: o.Circuit, down_ms: int, error: str) -> Ruling:
        text = o.unavailable_text(c.dependency, down_ms, error)
        return Ruling.give_up(text, {"reason": "dependency_unavailable",
                                     "dependency": c.dependency, "down_ms": down_ms})

    async def _maybe_notify(self, c: o.Circuit, now: int, policy: o.OutagePolicy) -> None:
        if not o.should_notify(c, now_ms=now, policy=policy):
            return
        async with self.deps.db.write() as s:
            current = await circuit_repo.load(s, dependency=c.dependency)
            if current.notified or not current.is_open:
                return  # another process said so
            await circuit_repo.save(s, circuit=o.Circuit(**{**_fields(current), "notified": 1}))
        log.error("dependency unreachable past the notification threshold",
                  extra={"dependency": c.dependency, "open_for_ms": c.open_for_ms(now)})
        if self.notify is not None:
            try:
                result = self.notify(c, now)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.warning("outage notification failed", exc_info=True)

    async def sweep(self) -> None:
        """Notify about circuits open past the threshold even when nothing fails (all
        messages held); run by the scheduler."""
        now = self.deps.now()
        for c in (await self.circuits(fresh=True)).values():
            await self._maybe_notify(c, now, self.policy(c.dependency))


def webhook_notifier(url: str) -> Notify:
    """POST ``{"event": "dependency_unreachable", ...}`` to ``url`` (best effort)."""
    async def notify(c: o.Circuit, now: int) -> None:
        import httpx

        body = {"event": "dependency_unreachable", "dependency": c.dependency,
                "since_ms": c.opened_at_ms, "open_for_ms": c.open_for_ms(now),
                "text": o.waiting_text(c, now_ms=now)}
        async with httpx.AsyncClient(timeout=10) as client:
            (await client.post(url, json=body)).raise_for_status()
    return notify


def _fields(c: o.Circuit) -> dict[str, Any]:
    return {"dependency": c.dependency, "failures": c.failures,
            "opened_at_ms": c.opened_at_ms, "probe_at_ms": c.probe_at_ms,
            "probes": c.probes, "notified": c.notified}
