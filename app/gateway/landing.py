"""Accepting a land: each change lands at most once per queue, and an
``Idempotency-Key`` gives a resent land its first answer back.

One transaction (``accept``): mint the sqid; bind the idempotency key (if any) with
the SHA-256 of the body; claim every change of the stack by its identity
(``ChangeURI.identity``; ``app/db/repos/claims.py``); store the hidden ``accepting``
summary with its change-URI mappings. Any refusal rolls all of it back, so a stack is
claimed all or nothing and a refused land leaves nothing behind. Then ``start`` is
published (id = sqid) and ``accepted`` recorded.

| Found in the transaction | Answer |
|---|---|
| every change free | 202, a new sqid |
| a change claimed by a landed request | 409 ``change_landed``: "already landed as <commit> by <sqid>" |
| a change claimed by a live request | 409 ``change_in_flight`` naming that sqid |
| the key bound, same body | 202 with the first sqid and its current status (header ``Idempotent-Replayed: true``); nothing new is stored or published, except that a receipt still hidden (its ``start`` publish may have been lost) is handed on again |
| the key bound, another body | 422 ``idempotency_key_reused`` |
| the holder let go while we looked | retried (a few times), then 409 ``version_mismatch`` |
| the actor's quota of the queue used up (``quotas:`` in queues.yaml; checked after the key, so a replay is never refused) | 429 ``quota_exceeded`` with ``Retry-After`` |

A hidden receipt whose ``start`` publish failed gives its claims and key back (the
client was told 503, "try again"). One orphaned by a crash between commit and publish
is handed on (its ``start`` published, ``accepted`` recorded; both idempotent by id)
by the first land that meets its claim once it is ``ORPHAN_GRACE_MS`` old, or at once
by a replay of its key. Idempotency keys do not expire.

The quotas count the actor's summaries in the same transaction, after the sqid is
minted: minting updates the queue's counter row, which serializes the lands of a queue
(a row lock on PostgreSQL, the write lock on SQLite), so two lands racing for the last
unit of a quota cannot both pass. The summary records ``submitted_by`` (the actor).
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.controllers.stages import partition_key
from app.db.engine import Database
from app.db.repos import claims, counters
from app.db.repos import request_log as repo
from app.domain.access import ANONYMOUS
from app.domain.change_uri import stack_identities, validate_stack
from app.domain.entities import RequestSummary
from app.domain.errors import (
    ChangeInFlight,
    ChangeLanded,
    IdempotencyKeyReused,
    QuotaExceeded,
    ServiceUnavailable,
    ValidationError,
    VersionMismatch,
)
from app.domain.ids import request_id, request_number
from app.domain.messages import START, LandRequestMsg, accepted_entry
from app.domain.queue_config import QueueConfig
from app.domain.states import LandStrategy, Priority, PublicStatus
from app.queue import Broker

log = logging.getLogger("submitqueue.api")

REQUEST_DOMAIN = "request"
ORPHAN_GRACE_MS = 10_000
HOUR_MS = 3_600_000
IN_FLIGHT_RETRY_S = 30
LAND_ATTEMPTS = 5
MAX_KEY_LENGTH = 255
ACCEPTING = PublicStatus.ACCEPTING.value
ACCEPTED = PublicStatus.ACCEPTED.value


class LandRuntime(Protocol):
    """What accepting a land needs (the composition root's ``Runtime`` offers it)."""

    @property
    def db(self) -> Database: ...

    @property
    def broker(self) -> Broker: ...


@dataclass(frozen=True, slots=True)
class Landed:
    sqid: str
    status: str
    replayed: bool = False


class _Replay(Exception):
    """Rolls the land's transaction back: the key is bound to an earlier request."""

    def __init__(self, record: claims.IdempotencyRecord) -> None:
        super().__init__(record.key)
        self.record = record


def check_key(key: str | None) -> str | None:
    """The ``Idempotency-Key`` header, validated (None when absent)."""
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ValidationError(
            f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} visible ASCII characters without "
            "spaces (e.g. a UUID); send the same key again only with the same body"
        )
    return key


def body_digest(change_uris: list[str], strategy: LandStrategy | None,
                priority: Priority = Priority.NORMAL) -> str:
    """SHA-256 of the body as sent (the stack in order and the strategy, null kept; the
    priority unless ``normal``, so keys bound before priorities existed still match)."""
    body: dict[str, object] = {"change_uris": change_uris,
                               "strategy": strategy.value if strategy else None}
    if priority is not Priority.NORMAL:
        body["priority"] = priority.value
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


async def accept(runtime: LandRuntime, *, queue: str, config: QueueConfig,
                 change_uris: list[str], strategy: LandStrategy | None,
                 key: str | None, actor: str = ANONYMOUS,
                 priority: Priority = Priority.NORMAL, origin: str = "") -> Landed:
    """Accept the stack ``change_uris`` for ``queue`` from ``actor`` (see the module
    docstring); ``strategy`` None = the queue's default; ``origin`` (kept in the
    request's metadata when set) says how GitHub asked: ``label`` or ``comment``.
    Whether ``actor`` may ask for ``priority`` is the caller's check
    (``app/domain/access.py``, ``hotfix_refusal``)."""
    key = check_key(key)
    identities = stack_identities(validate_stack(change_uris))
    digest = body_digest(change_uris, strategy, priority)
    strategy = strategy or config.default_strategy
    for attempt in range(1, LAND_ATTEMPTS + 1):
        received_ms = runtime.broker.clock()
        try:
            async with runtime.db.write() as s:
                sqid = request_id(queue, await counters.next_number(
                    s, queue=queue, domain=REQUEST_DOMAIN))
                if key is not None:
                    bound = await claims.reserve_key(s, queue=queue, key=key, request_id=sqid,
                                                     body_sha256=digest, now_ms=received_ms)
                    if bound is not None:
                        raise _Replay(bound)
                await check_quotas(s, config, actor=actor, now_ms=received_ms)
                await claims.claim_stack(
                    s, queue=queue, request_id=sqid,
                    changes=list(zip(identities, change_uris, strict=True)),
                    now_ms=received_ms)
                await repo.create_summary(s, queue=queue, request_id=sqid,
                                          change_uris=change_uris,
                                          received_at_ms=received_ms,
                                          metadata={"strategy": strategy.value,
                                                    **({"origin": origin} if origin else {})},
                                          submitted_by=actor, priority=priority)
        except _Replay as replay:
            return await _replay(runtime, replay.record, digest, strategy)
        except claims.ClaimHeld as held:
            raise await _refusal(runtime, held.claim, change_uris, identities) from None
        except VersionMismatch:
            if attempt == LAND_ATTEMPTS:
                raise
            continue
        break
    msg = LandRequestMsg(id=sqid, queue=queue, change_uris=change_uris, strategy=strategy,
                         received_at_ms=received_ms, submitted_by=actor, priority=priority)
    try:
        await hand_off(runtime, msg)
    except ServiceUnavailable:
        await _give_back(runtime, queue=queue, sqid=sqid, key=key)
        raise
    return Landed(sqid=sqid, status=ACCEPTED)


async def check_quotas(s: AsyncSession, config: QueueConfig, *, actor: str,
                       now_ms: int) -> None:
    """``QuotaExceeded`` if one more land would break ``actor``'s quotas in the queue."""
    quotas = config.quotas
    if quotas.in_flight is None and quotas.per_hour is None:
        return
    in_flight, recent, oldest = await repo.actor_usage(
        s, queue=config.name, actor=actor, since_ms=now_ms - HOUR_MS + 1)
    if quotas.in_flight is not None and in_flight >= quotas.in_flight:
        raise QuotaExceeded(
            f"{actor} has {in_flight} requests in flight in queue {config.name!r}, the most "
            f"its quota allows ({quotas.in_flight}); try again when one of them ends",
            limit="in_flight", retry_after_s=IN_FLIGHT_RETRY_S)
    if quotas.per_hour is not None and recent >= quotas.per_hour:
        wait_s = -(-((oldest or now_ms) + HOUR_MS - now_ms) // 1000)
        raise QuotaExceeded(
            f"{actor} sent {recent} land requests to queue {config.name!r} in the last hour, "
            f"the most its quota allows ({quotas.per_hour}); the next one is allowed in "
            f"{wait_s} s", limit="per_hour", retry_after_s=wait_s)


async def hand_off(runtime: LandRuntime, msg: LandRequestMsg) -> None:
    """Publish ``start`` (id = sqid: a repeat is stored once), then record ``accepted``
    (a failure there is only logged: ``start`` records ``accepted`` too)."""
    try:
        await runtime.broker.publish(START, msg.model_dump(mode="json"),
                                     partition_key=partition_key(START, msg),
                                     message_id=msg.id)
    except Exception as exc:
        log.warning("publish failed", exc_info=exc,
                    extra={"topic": START, "message_id": msg.id})
        raise ServiceUnavailable(f"could not hand {msg.id!r} to the {START!r} topic") from exc
    accepted = accepted_entry(msg)
    try:
        await repo.persist_log(runtime.db, accepted)
    except Exception:
        log.exception("could not record 'accepted'; the request is in the pipeline anyway",
                      extra={"queue": msg.queue, "sqid": msg.id})


async def _give_back(runtime: LandRuntime, *, queue: str, sqid: str, key: str | None) -> None:
    """A receipt whose ``start`` was not published releases its claims and its key."""
    try:
        async with runtime.db.write() as s:
            await claims.release(s, queue=queue, request_id=sqid)
            if key is not None:
                await claims.forget_key(s, queue=queue, key=key, request_id=sqid)
    except Exception:
        log.exception("could not release the claims of an unpublished receipt",
                      extra={"queue": queue, "sqid": sqid})


async def _summary(runtime: LandRuntime, queue: str, sqid: str) -> RequestSummary | None:
    async with runtime.db.read() as s:
        return await repo.find_summary(s, queue=queue, request_id=sqid)


async def _complete(runtime: LandRuntime, summary: RequestSummary,
                    strategy: LandStrategy) -> None:
    """Hand a hidden receipt on: publish its ``start`` and record ``accepted``."""
    await hand_off(runtime, LandRequestMsg(
        id=summary.request_id, queue=summary.queue, change_uris=list(summary.change_uris),
        strategy=strategy, received_at_ms=summary.received_at_ms,
        submitted_by=summary.submitted_by, priority=summary.priority))


def _strategy_of(summary: RequestSummary, default: LandStrategy) -> LandStrategy:
    try:
        return LandStrategy(summary.metadata.get("strategy", default))
    except ValueError:
        return default


async def _replay(runtime: LandRuntime, record: claims.IdempotencyRecord, digest: str,
                  strategy: LandStrategy) -> Landed:
    if record.body_sha256 != digest:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {record.key!r} was first sent with another body (it created "
            f"{record.request_id}); resend that body to get {record.request_id} back, or use "
            "a new key for a different land"
        )
    summary = await _summary(runtime, record.queue, record.request_id)
    if summary is None:  # the key and the summary are written in one transaction
        raise ServiceUnavailable(f"request {record.request_id} is not readable yet")
    if summary.status == ACCEPTING:
        await _complete(runtime, summary, _strategy_of(summary, strategy))
        return Landed(sqid=record.request_id, status=ACCEPTED, replayed=True)
    return Landed(sqid=record.request_id, status=summary.status, replayed=True)


async def _refusal(runtime: LandRuntime, claim: claims.Claim, uris: list[str],
                   identities: list[str]) -> ChangeLanded | ChangeInFlight:
    """The 409 for a change ``claim`` holds (handing an orphaned hidden holder on)."""
    mine = uris[identities.index(claim.change_key)]
    alias = "" if claim.change_uri == mine else f" (as {claim.change_uri})"
    owner = claim.request_id
    if claim.state == claims.LANDED:
        commit = f" as {claim.landed_commit}" if claim.landed_commit else ""
        return ChangeLanded(
            f"change {mine} already landed{commit} by {owner}{alias}; it cannot land twice",
            sqid=owner, commit=claim.landed_commit)
    summary = await _summary(runtime, claim.queue, owner)
    status = summary.status if summary is not None else ACCEPTING
    orphaned = summary is not None and status == ACCEPTING and (
        runtime.broker.clock() - summary.received_at_ms >= ORPHAN_GRACE_MS)
    if orphaned and summary is not None:
        try:
            await _complete(runtime, summary, _strategy_of(summary, LandStrategy.REBASE))
            status = ACCEPTED
        except ServiceUnavailable:
            log.warning("could not hand an orphaned receipt on",
                        extra={"queue": claim.queue, "sqid": owner})
    where = f"/api/v1/queues/{claim.queue}/requests/{request_number(owner)}"
    state = "being accepted right now" if status == ACCEPTING else f"now {status}"
    return ChangeInFlight(
        f"change {mine} is already in flight as {owner}{alias} ({state}); follow it at "
        f"{where}, or cancel it (POST {where}/cancel) before landing the change again",
        sqid=owner)
