"""The admin API (``/api/v1/admin``): queue topics, dead letters and their drain,
consumer pause/resume, and the audit log of every admin action.

**Auth.** ``Authorization: Bearer <token>``: ``SQ_ADMIN_TOKEN`` (compared in constant
time) or an API token with the ``admin`` scope (``app/gateway/access.py``). Without a
token and without ``SQ_ADMIN_TOKEN`` -> 403 (``admin_disabled``) naming
``SQ_ADMIN_TOKEN``; a missing, wrong, revoked or expired token -> 401
(``unauthorized``); a token without ``admin`` -> 403 (``missing_scope``). A refused
call has no side effect and is not audited. The audit *actor* is the token's label:
``SQ_ADMIN_TOKEN`` written ``label:secret`` (e.g. ``ops-alice:s3cret``) is recorded as
``ops-alice``, any other as ``admin``; an API token as its label. The API tokens
themselves are managed under ``/tokens`` (``app/api/tokens.py``).

| Route | What |
|---|---|
| ``GET /topics`` | per topic and consumer group: depth, in flight, held, retrying, oldest age, paused; DLQ size and parked count |
| ``GET /dlq`` | every DLQ topic with its unsettled and parked counts |
| ``GET /dlq/{topic}/messages?limit&cursor`` | unsettled dead letters, newest first; ``next_cursor`` pages on |
| ``GET /dlq/{topic}/messages/{id}`` | one dead letter (``id`` = its queue sequence number) |
| ``POST /dlq/{topic}/drain`` | ``{"mode": "reconcile"|"requeue"|"discard", "message_ids": [...]|null, "reason", "limit", "cursor"}``: per-message results; audited |
| ``POST /consumers/{topic}/pause`` / ``resume`` | ``{"group"?, "partition_key"?, "reason"?}``; audited |
| ``GET /audit?limit&cursor`` | admin actions, newest first |

Drain modes: ``reconcile`` runs the topic's reconciler now and, when it succeeds,
removes the dead letter (an undecodable one is reported and kept); ``requeue`` moves
it back to its original topic with the same id; ``discard`` deletes it. ``requeue``
and ``discard`` need a ``reason``. ``message_ids: null`` drains one page (``limit``,
at most 1000) of the topic's unsettled messages and returns ``next_cursor`` while
more may remain, so a large drain is a loop of bounded calls, never a timeout.
Ids that are gone report ``not_found``, so repeating a drain is harmless.

Errors: unknown topic, or a topic that is not a DLQ where one is needed -> 404;
malformed ids or cursor, a missing reason -> 400; a body or query string holding NUL,
a control character (a reason may hold tabs and newlines) or a lone surrogate -> 422.
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.admin_schemas import (
    AuditEntryOut,
    AuditOut,
    DeadLetterOut,
    DeadLettersOut,
    DlqConsumerOut,
    DlqTopicOut,
    DlqTopicsOut,
    DrainItemOut,
    DrainOut,
    GroupStatsOut,
    OutcomeOut,
    PauseOut,
    TopicsOut,
    TopicStatsOut,
)
from app.api.auth import Credentials, authorize
from app.api.deps import ApiRuntime, RuntimeDep
from app.api.examples import ok
from app.api.schemas import ErrorOut, SafeLine, SafeText
from app.controllers.dlq import Reconciler, Undecodable
from app.controllers.dlq.reconcilers import decode_entity
from app.controllers.pipeline import build_reconcilers
from app.domain.access import Scope
from app.domain.errors import NotFound, ValidationError
from app.domain.messages import LOG
from app.gateway import audit as audit_log
from app.queue import (
    DLQ_SUFFIX,
    MessageNotFound,
    NotDeadLettered,
    StoredMessage,
    TopicSpec,
    UnknownTopic,
)

MAX_IDS = 1000
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 422, 500, 503)
}


AdminRuntime = ApiRuntime


def install_admin(app: FastAPI) -> None:
    app.include_router(router)


async def require_admin(rt: RuntimeDep, credentials: Credentials = None) -> str:
    """The caller's actor label: ``SQ_ADMIN_TOKEN`` or an API token with the ``admin``
    scope (``app/gateway/access.py``); ``AdminDisabled`` (403), ``Unauthorized`` (401)
    or ``MissingScope`` (403) otherwise."""
    return (await authorize(rt, credentials, Scope.ADMIN, None)).actor


Actor = Annotated[str, Depends(require_admin)]
Runtime = RuntimeDep
router = APIRouter(prefix="/api/v1/admin", tags=["admin"], responses=_ERRORS)


# -- helpers -------------------------------------------------------------------------


def _spec(rt: AdminRuntime, topic: str) -> TopicSpec:
    try:
        return rt.broker.topology.spec(topic)
    except UnknownTopic:
        raise NotFound(f"topic {topic!r} does not exist; see GET /api/v1/admin/topics") from None


def _dlq_spec(rt: AdminRuntime, topic: str) -> TopicSpec:
    spec = _spec(rt, topic)
    if not spec.is_dlq:
        hint = f"; did you mean {spec.dlq_name!r}?" if spec.dlq else ""
        raise NotFound(f"topic {topic!r} is not a dead-letter topic{hint}")
    return spec


_SEQ = re.compile(r"[0-9]{1,19}")


def _seq(raw: Any) -> int:
    text = str(raw).strip() if isinstance(raw, (str, int)) and not isinstance(raw, bool) else ""
    # ASCII digits only: str.isdigit() admits '²', which int() refuses
    if _SEQ.fullmatch(text) is None or not 0 < int(text) < 2**62:
        raise ValidationError(
            f"message id {raw!r} is malformed; ids are the positive integers listed as 'id'")
    return int(text)


def _payload(msg: StoredMessage) -> Any:
    try:
        return msg.payload
    except ValueError:
        return msg.payload_json


def _entity_id(msg: StoredMessage) -> str | None:
    payload = _payload(msg)
    if msg.original_topic == LOG or msg.topic == LOG + DLQ_SUFFIX:
        rid = payload.get("request_id") if isinstance(payload, dict) else None
        return rid if isinstance(rid, str) else None
    try:
        return decode_entity(msg).id
    except Undecodable:
        return None


def message_view(msg: StoredMessage) -> DeadLetterOut:
    return DeadLetterOut(
        id=msg.seq, message_id=msg.message_id, partition_key=msg.partition_key,
        payload=_payload(msg), original_topic=msg.original_topic,
        attempts=msg.failure_count, last_error=msg.last_error,
        failed_at_ms=msg.failed_at_ms, failure_detail=msg.failure_detail,
        source_group=msg.source_group, parked=msg.parked,
        settled=msg.settled_at_ms is not None, entity_id=_entity_id(msg),
    )


async def _audit(rt: AdminRuntime, *, actor: str, action: str, topic: str,
                 message_ids: list[int] | None = None, reason: str = "",
                 result: dict[str, Any] | None = None) -> int:
    return await audit_log.record(rt.db, at_ms=rt.broker.clock(), actor=actor,
                                  action=action, topic=topic, message_ids=message_ids,
                                  reason=reason, result=result)


# -- topics and dead letters ----------------------------------------------------------


@router.get("/topics", response_model=TopicsOut, summary="Every queue topic's backlog",
            responses=ok(200, "TOPICS"))
async def topics(rt: Runtime, _actor: Actor) -> TopicsOut:
    """Each topic of the durable queue (``build``, ``build_dlq``, ...) and, per consumer
    group, its depth (unsettled messages), in flight, held (postponed without spending
    an attempt, e.g. while a dependency is down; its partition waits), retrying, the
    oldest message's age and whether it is paused (the whole group or
    ``paused_partitions``); for a topic with a DLQ, the DLQ's size and parked count.
    Start here when requests stall: a growing depth or DLQ names the stage."""
    return TopicsOut(topics=[TopicStatsOut(
        topic=t.topic, serial=t.serial, is_dlq=t.is_dlq, dlq_topic=t.dlq_topic,
        dlq_size=t.dlq_size, dlq_parked=t.dlq_parked, parked=t.parked,
        groups=[GroupStatsOut(group=g.consumer_group, depth=g.depth, in_flight=g.in_flight,
                              held=g.held, retrying=g.retrying,
                              oldest_age_ms=g.oldest_age_ms, paused=g.paused,
                              paused_partitions=g.paused_partitions) for g in t.groups],
    ) for t in await rt.broker.stats()])


@router.get("/dlq", response_model=DlqTopicsOut, summary="Dead-letter topics and their sizes",
            responses=ok(200, "DLQ_TOPICS"))
async def dlq_topics(rt: Runtime, _actor: Actor) -> DlqTopicsOut:
    """Every dead-letter topic with the topic it takes failures from, how many dead
    letters it holds unsettled (``size``) and parked, and its consumers (a paused one
    keeps them for an operator instead of reconciling them)."""
    stats = {t.topic: t for t in await rt.broker.stats()}
    out = []
    for t in stats.values():
        if t.dlq_topic is None:
            continue
        dlq = stats.get(t.dlq_topic)
        out.append(DlqTopicOut(
            topic=t.dlq_topic, original_topic=t.topic, size=t.dlq_size, parked=t.dlq_parked,
            consumers=[DlqConsumerOut(group=g.consumer_group, paused=g.paused, depth=g.depth)
                       for g in (dlq.groups if dlq else [])]))
    return DlqTopicsOut(topics=out)


@router.get("/dlq/{topic}/messages", response_model=DeadLettersOut,
            summary="A DLQ topic's dead letters, newest first",
            responses=ok(200, "DEAD_LETTERS"))
async def dlq_messages(
    rt: Runtime, _actor: Actor, topic: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[SafeLine | None, Query(max_length=30)] = None,
) -> DeadLettersOut:
    """The unsettled dead letters of ``topic`` (a ``*_dlq`` topic), newest first, each
    with its payload, attempts, last error and the request or batch it names
    (``entity_id``); ``next_cursor`` pages on while the page was full. 404 for a topic
    that does not exist or is not a DLQ."""
    spec = _dlq_spec(rt, topic)
    before = _seq(cursor) if cursor else None
    msgs = await rt.broker.list_messages(spec.name, before_seq=before, limit=limit)
    return DeadLettersOut(items=[message_view(m) for m in msgs],
                          next_cursor=str(msgs[-1].seq) if len(msgs) == limit else None)


async def _load(rt: AdminRuntime, topic: str, seq: int) -> StoredMessage | None:
    try:
        msg = await rt.broker.get_message(seq)
    except MessageNotFound:
        return None
    return msg if msg.topic == topic else None


@router.get("/dlq/{topic}/messages/{message_id}", response_model=DeadLetterOut,
            summary="One dead letter in full", responses=ok(200, "DEAD_LETTER"))
async def dlq_message(rt: Runtime, _actor: Actor, topic: str, message_id: str) -> DeadLetterOut:
    """One dead letter by its ``id`` (the queue's sequence number, as listed), settled or
    not: payload, failure detail (exception type, retryable, why it was dead-lettered)
    and the consumer group it failed in. 404 once it was drained."""
    spec = _dlq_spec(rt, topic)
    msg = await _load(rt, spec.name, _seq(message_id))
    if msg is None:
        raise NotFound(f"no message {message_id} in {topic!r} (drained or never there)")
    return message_view(msg)


# -- drain ----------------------------------------------------------------------------


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"mode": "reconcile", "message_ids": [65]},
        {"mode": "discard", "reason": "poison: the batch was deleted by hand", "limit": 200},
    ]})
    mode: Literal["reconcile", "requeue", "discard"]
    message_ids: list[Any] | None = Field(default=None, max_length=MAX_IDS)
    reason: SafeText = Field(default="", max_length=2000)
    limit: int = Field(default=200, ge=1, le=MAX_IDS)
    cursor: SafeLine | None = Field(default=None, max_length=30)


async def _drain_one(rt: AdminRuntime, body: DrainBody, topic: str, seq: int,
                     actor: str, reconciler: Reconciler | None) -> DrainItemOut:
    msg = await _load(rt, topic, seq)
    if msg is None:
        return DrainItemOut(id=seq, result="not_found")
    if body.mode == "discard":
        await rt.broker.discard(topic, seq, reason=f"{actor}: {body.reason}")
        return DrainItemOut(id=seq, result="discarded")
    if msg.settled_at_ms is not None:
        return DrainItemOut(id=seq, result="already_settled")
    if body.mode == "requeue":
        try:
            moved = await rt.broker.requeue(topic, seq)
        except (MessageNotFound, NotDeadLettered) as exc:
            return DrainItemOut(id=seq, result="failed", error=str(exc))
        return DrainItemOut(id=seq, result="requeued", to=moved.original_topic or moved.topic)
    if reconciler is None:
        return DrainItemOut(id=seq, result="failed", error=f"no reconciler for {topic!r}")
    try:
        outcome = await reconciler.reconcile(msg)
    except Undecodable as exc:
        return DrainItemOut(id=seq, result="undecodable", error=str(exc))
    except Exception as exc:
        return DrainItemOut(id=seq, result="failed", error=f"{type(exc).__name__}: {exc}")
    await rt.broker.discard(topic, seq, reason=f"reconciled by {actor}: {outcome.action}")
    return DrainItemOut(id=seq, result="reconciled", outcome=OutcomeOut(**outcome.as_dict()))


@router.post("/dlq/{topic}/drain", response_model=DrainOut,
             summary="Reconcile, requeue or discard dead letters", responses=ok(200, "DRAIN"))
async def drain(rt: Runtime, actor: Actor, topic: str, body: DrainBody) -> DrainOut:
    """``reconcile`` runs the topic's reconciler on each message now (it settles the
    request or batch the message names, e.g. fails a batch whose build could not be
    triggered) and removes the dead letter when it succeeds; ``requeue`` moves it back
    to its original topic under the same id (after a fix); ``discard`` deletes it.
    ``requeue`` and ``discard`` need a ``reason``. With ``message_ids: null`` one page
    (``limit``, at most 1000) of the topic is drained and ``next_cursor`` says whether
    to call again. Each message reports its result; gone ids say ``not_found``, so a
    repeat is harmless. Audited (``audit_id``)."""
    spec = _dlq_spec(rt, topic)
    if body.mode in ("requeue", "discard") and not body.reason.strip():
        raise ValidationError(f"mode {body.mode!r} needs a reason (what was fixed, or why "
                              "the messages are unprocessable)")
    next_cursor: str | None = None
    if body.message_ids is not None:
        seqs = list(dict.fromkeys(_seq(i) for i in body.message_ids))
    else:
        before = _seq(body.cursor) if body.cursor else None
        page = await rt.broker.list_messages(spec.name, before_seq=before, limit=body.limit)
        seqs = [m.seq for m in page]
        next_cursor = str(page[-1].seq) if len(page) == body.limit else None
    reconciler = build_reconcilers(rt.deps).get(spec.name) if body.mode == "reconcile" else None
    results = [await _drain_one(rt, body, spec.name, s, actor, reconciler) for s in seqs]
    counts: dict[str, int] = {}
    for r in results:
        counts[r.result] = counts.get(r.result, 0) + 1
    audit_id = await _audit(rt, actor=actor, action=f"drain:{body.mode}", topic=spec.name,
                            message_ids=seqs, reason=body.reason,
                            result={"counts": counts,
                                    "results": [r.model_dump(mode="json") for r in results]})
    return DrainOut(topic=spec.name, mode=body.mode, results=results, counts=counts,
                    next_cursor=next_cursor, audit_id=audit_id)


# -- consumers ------------------------------------------------------------------------


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"reason": "inspect before draining"},
        {"group": "orchestrator", "partition_key": "demo/batch/3",
         "reason": "hold this batch while its CI is fixed"},
    ]})
    group: SafeLine | None = Field(default=None, max_length=255)
    partition_key: SafeLine | None = Field(default=None, min_length=1, max_length=255)
    reason: SafeText = Field(default="", max_length=2000)


def _group(rt: AdminRuntime, spec: TopicSpec, group: str | None) -> str:
    groups = rt.broker.topology.groups(spec.name)
    if group is not None:
        if group not in groups:
            raise NotFound(f"group {group!r} does not consume {spec.name!r} (groups: {groups})")
        return group
    if len(groups) != 1:
        raise ValidationError(f"topic {spec.name!r} has groups {groups}; name one in 'group'")
    return groups[0]


async def _pause_or_resume(rt: AdminRuntime, actor: str, topic: str, body: PauseBody | None,
                           pause: bool) -> PauseOut:
    body = body or PauseBody()
    spec = _spec(rt, topic)
    group = _group(rt, spec, body.group)
    if pause:
        await rt.broker.pause(group, spec.name, body.partition_key, reason=body.reason)
        changed = True
    else:
        changed = await rt.broker.resume(group, spec.name, body.partition_key)
    result = PauseOut(topic=spec.name, group=group, partition_key=body.partition_key,
                      paused=pause, changed=changed)
    await _audit(rt, actor=actor, action="pause" if pause else "resume", topic=spec.name,
                 reason=body.reason, result=result.model_dump(mode="json"))
    return result


@router.post("/consumers/{topic}/pause", response_model=PauseOut,
             summary="Pause a topic's consumer group (or one partition)",
             responses=ok(200, "PAUSED"))
async def pause_consumer(rt: Runtime, actor: Actor, topic: str,
                         body: PauseBody | None = None) -> PauseOut:
    """Stop handing out ``topic``'s messages to ``group`` (default: the topic's only
    group), or only those of ``partition_key``; they wait, none is lost. Pausing a DLQ
    keeps its dead letters for inspection instead of reconciling them. Takes effect in
    every process; audited with ``reason``."""
    return await _pause_or_resume(rt, actor, topic, body, pause=True)


@router.post("/consumers/{topic}/resume", response_model=PauseOut,
             summary="Resume a paused consumer group (or partition)",
             responses=ok(200, "RESUMED"))
async def resume_consumer(rt: Runtime, actor: Actor, topic: str,
                          body: PauseBody | None = None) -> PauseOut:
    """Undo a pause of the same ``group`` and ``partition_key``; ``changed: false`` when
    it was not paused. The waiting messages are handed out again. Audited."""
    return await _pause_or_resume(rt, actor, topic, body, pause=False)


# -- audit ----------------------------------------------------------------------------


@router.get("/audit", response_model=AuditOut, summary="The admin actions, newest first",
            responses=ok(200, "AUDIT"))
async def audit(
    rt: Runtime, _actor: Actor, limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[SafeLine | None, Query(max_length=30)] = None,
) -> AuditOut:
    """Every admin action (drains, pauses, resumes, token creations and revocations)
    with who did it (the token's label), when, on what, why and what came of it;
    ``next_cursor`` pages on. Refused calls are not recorded."""
    before = _seq(cursor) if cursor else None
    entries = await audit_log.entries(rt.db, before_id=before, limit=limit)
    return AuditOut(items=[AuditEntryOut(**e.__dict__) for e in entries],
                    next_cursor=str(entries[-1].id) if len(entries) == limit else None)
