"""Dead-letter reconcilers: one per consumed topic's ``{topic}_dlq``, parameterised by
the kind of entity the original message was about. They never retry the failed
work; they drive the entity to its terminal failure with the pipeline's own
conditional writes, so a late primary update that got there first wins cleanly (a
lost race raises ``VersionMismatch``; the DLQ topic retries and the next attempt
finds the winner's state).

Consumer groups: ``orchestrator-dlq`` (every orchestrator topic) and ``gateway-dlq``
(``log_dlq``). DLQ topics are always retryable, 1000 attempts with backoff
(500 ms doubling to 60 s), no DLQ of their own.

Request-scoped (``start``, ``cancel``, ``validate``, ``mergecheck``,
``mergeconflictsignal``, ``batch``; the payload's ``id`` is the sqid):

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| payload has no string ``id`` and ``queue`` (``start``: or an ``id`` that is not ``<queue>/<n>``) | invalid | raise ``Undecodable`` (stays in the DLQ, visible; see below) |
| request missing, ``start`` | before | the start failed before persisting it, and the gateway says ``accepted``: create the row directly in ``error`` (v1, ``last_error`` = the failure, change URIs and strategy from the payload when readable) and publish its terminal log (``terminated``); a start requeued later finds it terminal and only re-publishes that log |
| request missing, any other topic | - | nothing to reconcile; ack (``not_found``) |
| request ``error`` | at | skip the write, republish its terminal log (``repaired``) |
| request ``landed`` / ``cancelled`` | superseded | leave it (``left``) |
| request owned by a batch: any batch of it not ``creating``/``failed``, or a ``creating`` one while the request is ``batched`` | superseded | leave it to the batch (``owned_by_batch``) |
| otherwise (``started``/``validated``/``batched``/``cancelling``) | before | ``terminate_request(error)`` with ``last_error`` naming the original topic, attempts and error (``terminated``), conditional on the request version classified |
| not owned when read, claimed by a batch before the write | superseded | the write raises ``VersionMismatch`` (a claim bumps the request version); the retry finds ``owned_by_batch`` |

Batch-scoped (``dependency_analysis``, ``speculate``, ``build``, ``merge``, ``conclude``,
``mergesignal``: payload ``id`` is the batch id; ``buildsignal``: payload ``id`` is a
build id, the batch is the build's):

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| payload names no batch or build (no string ``id`` and ``queue``) | invalid | raise ``Undecodable`` (stays in the DLQ, visible) |
| batch (or build) missing | - | nothing to reconcile; ack (``not_found``) |
| batch ``succeeded`` / ``cancelled`` | superseded | leave it (``left``); for ``conclude`` only, finish the fan-out it failed to do: terminate each non-terminal member with the batch's own outcome, as ``conclude`` does (its reason; a ``landed`` log carries the member's commits) |
| batch ``failed`` | at | keep it; re-fan-out ``error`` to every member and re-publish the ``speculate`` wake-up (same id) (``repaired``): the reconciliation that failed it may have died before either |
| batch ``merging``, any topic but ``merge`` / ``mergesignal`` | superseded | leave it (``left``): its merge decides (a dead build poll of a sibling path must not fail a batch whose change is being pushed) |
| batch ``merging``, ``merge`` | before | publish a ``failed`` result to ``mergesignal`` under the merge's own message id (the batch id), which fails the batch there (``failed``); if the merge already published its result under that id (it pushed, then a later attempt died), the publish is a no-op and that result decides (``left``) |
| batch live (``creating`` .. ``speculating``, ``cancelling``; ``merging`` for ``mergesignal``) | before | conditional write ``failed`` with the failure reason; ``error`` to every member (a ``cancelling`` one too); a ``speculate`` wake-up so the rest of the queue re-plans (``failed``) |

``speculate`` fails only the batches the failure is about, never the batch the message
happened to name (a speculate run plans the whole queue):

| Dead letter | Action |
|---|---|
| failure ``subjects`` name batches (``PlanRejected`` / ``PlanInvariantError``: the offending heads) | each one as a batch above, with its own subject's reason (a ``merging`` one is left: its merge decides); when any changed or was already failed (a reconciliation that failed it may have died before waking the queue), a ``speculate`` run (unique id) for the queue's oldest active batch (``failed``) |
| no batch subject, the error was not retryable (a bug, a poison payload) | fail nothing; raise ``Unattributed`` (``park = True``): parked in ``speculate_dlq`` for an operator, counted by ``submitqueue_queue_dlq_parked`` |
| no batch subject, retryable attempts exhausted (the database was away) | fail nothing; log a warning and ack (``unattributed``); the next wake-up or the periodic resync re-plans |

``log`` (gateway):

| Dead letter | Action |
|---|---|
| a ``LogMsg`` of a request the gateway has a summary of | persist it through the materializer (``persist_log``; ``persisted``); its errors propagate and are retried with backoff |
| a ``LogMsg`` of a request the gateway has no summary of | raise ``Undecodable``, parked: the gateway records every request it accepts before anything logs for it, so no retry helps |
| not a ``LogMsg`` (not JSON, or not a log entry) | raise ``Undecodable``, parked |

**Undecodable messages.** A reconciler raises ``Undecodable`` (``park = True``): the
queue parks the message at once, keeping its original failure (topic, attempts,
error) and recording why it was parked. It stays visible in the admin API and leaves
only through an operator's ``discard`` (``reconcile`` reports ``undecodable`` and keeps
it; ``requeue`` sends it back to a topic that will dead-letter it again).
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from app.controllers import bisect
from app.controllers.common import Deps, load_request, repair_terminal, terminate_request, unique_id
from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import requests as request_repo
from app.db.repos import speculation as spec_repo
from app.db.repos.request_log import persist_log
from app.domain import messages as m
from app.domain.entities import Batch, LandRequest
from app.domain.errors import NotFound
from app.domain.errors import Unattributed as Unattributed  # re-exported
from app.domain.errors import Undecodable as Undecodable  # re-exported
from app.domain.messages import EntityMsg, LogMsg
from app.domain.states import BATCH_TO_REQUEST_TERMINAL, BatchState, LandStrategy, RequestState
from app.queue import DLQ_SUFFIX, Delivery, StoredMessage

log = logging.getLogger("submitqueue.controllers")

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)


@dataclass(frozen=True)
class Outcome:
    """What a reconciler did with one dead letter; ``changed`` = it wrote something."""

    action: str
    entity: str = ""
    detail: str = ""
    changed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "entity": self.entity, "detail": self.detail,
                "changed": self.changed}


def original_topic(msg: StoredMessage) -> str:
    if msg.original_topic:
        return msg.original_topic
    return msg.topic.removesuffix(DLQ_SUFFIX)


def failure_text(msg: StoredMessage) -> str:
    """``dead-lettered from build after 10 attempts: ConnectionError: ...``; for a
    message the outage guard gave up on, its own text (``dependency unavailable: ...``,
    the typed reason ``dependency_unavailable``)."""
    if (msg.failure_detail or {}).get("reason") == "dependency_unavailable" and \
            msg.last_error:
        return msg.last_error
    n = msg.failure_count or 0
    attempts = f"{n} attempt{'' if n == 1 else 's'}"
    return (f"dead-lettered from {original_topic(msg)} after {attempts}: "
            f"{msg.last_error or 'unknown error'}")


def failure_metadata(msg: StoredMessage) -> dict[str, Any]:
    return {"dlq_topic": msg.topic, "dlq_original_topic": original_topic(msg),
            "dlq_failure_count": msg.failure_count or 0,
            "dlq_failed_at_ms": msg.failed_at_ms or 0}


def decode_entity(msg: StoredMessage) -> EntityMsg:
    """The ``id`` and ``queue`` every orchestrator payload carries, read leniently (the
    payload may be why the primary failed), or ``Undecodable``."""
    try:
        payload = msg.payload
    except ValueError as exc:
        raise Undecodable(f"message {msg.seq} is not JSON: {exc}") from None
    if isinstance(payload, dict):
        ident, queue = payload.get("id"), payload.get("queue")
        if isinstance(ident, str) and ident and isinstance(queue, str) and queue:
            return EntityMsg(id=ident, queue=queue)
    raise Undecodable(
        f"message {msg.seq} of {msg.topic} names no entity (needs string 'id' and 'queue')")


class Reconciler:
    """The reconciler of one DLQ topic; ``process`` for the consumer, ``reconcile`` for
    the admin API's synchronous drain."""

    def __init__(self, deps: Deps, topic: str) -> None:
        self.deps = deps
        self.topic = topic  # the original topic
        self.dlq_topic = topic + DLQ_SUFFIX

    async def process(self, delivery: Delivery) -> None:
        outcome = await self.reconcile(delivery.message)
        log.info("dead letter reconciled", extra={
            "topic": delivery.topic, "message_id": delivery.message_id, **outcome.as_dict()})

    async def reconcile(self, msg: StoredMessage) -> Outcome:
        raise NotImplementedError


class RequestReconciler(Reconciler):
    async def reconcile(self, msg: StoredMessage) -> Outcome:
        ent = decode_entity(msg)
        if self.topic == m.START:
            return await fail_start(self.deps, queue=ent.queue, sqid=ent.id, msg=msg)
        return await fail_request(self.deps, queue=ent.queue, sqid=ent.id, msg=msg)


class BatchReconciler(Reconciler):
    async def reconcile(self, msg: StoredMessage) -> Outcome:
        ent = decode_entity(msg)
        if self.topic == m.SPECULATE:
            return await self._speculate(ent, msg)
        if self.topic == m.MERGE:
            return await fail_merge(self.deps, queue=ent.queue, batch_id=ent.id, msg=msg)
        return await fail_batch(self.deps, queue=ent.queue, batch_id=ent.id, msg=msg,
                                conclude=self.topic == m.CONCLUDE,
                                leave_merging=self.topic != m.MERGESIGNAL)

    async def _speculate(self, ent: EntityMsg, msg: StoredMessage) -> Outcome:
        culprits = batch_subjects(msg)
        if not culprits:
            return self._unattributed(ent, msg)
        outcomes = [await fail_batch(self.deps, queue=ent.queue, batch_id=b, msg=msg,
                                     wake=False, leave_merging=True,
                                     reason=failure_text(replace(msg, last_error=reason))
                                     if reason else None)
                    for b, reason in culprits.items()]
        changed = any(o.changed for o in outcomes)
        if changed or any(o.action == "repaired" for o in outcomes):
            async with self.deps.db.read() as s:
                active = await batch_repo.list_by_states(s, queue=ent.queue, states=ACTIVE)
            if active:
                await self.deps.publish(
                    m.SPECULATE, EntityMsg(id=active[0].id, queue=ent.queue),
                    message_id=unique_id(f"{active[0].id}/dlq"))
        first = outcomes[0]
        return Outcome(first.action if len(outcomes) == 1 else "failed" if changed else "left",
                       ",".join(o.entity for o in outcomes),
                       "; ".join(o.detail for o in outcomes if o.detail), changed)

    @staticmethod
    def _unattributed(ent: EntityMsg, msg: StoredMessage) -> Outcome:
        detail = msg.failure_detail or {}
        what = (f"{failure_text(msg)}; it names no batch, so none is failed "
                f"({ent.id} is left as it is)")
        if detail.get("retryable") is True:
            log.warning("speculate dead letter names no batch; left", extra={
                "queue": ent.queue, "batch_id": ent.id, "error": msg.last_error})
            return Outcome("unattributed", ent.id, what)
        raise Unattributed(f"{what}; parked for an operator: fix the cause, then "
                           "discard it (or requeue it)")


def batch_subjects(msg: StoredMessage) -> dict[str, str]:
    """The batches a dead letter's failure is about (``subjects`` of type ``batch``, as
    the queue recorded them from the error), each with its own reason ('' if none)."""
    subjects = (msg.failure_detail or {}).get("subjects")
    out: dict[str, str] = {}
    for s in subjects if isinstance(subjects, list) else ():
        if isinstance(s, dict) and s.get("type") == "batch" and isinstance(s.get("id"), str) \
                and s["id"]:
            reason = s.get("reason")
            out.setdefault(s["id"], reason if isinstance(reason, str) else "")
    return out


class BuildReconciler(Reconciler):
    async def reconcile(self, msg: StoredMessage) -> Outcome:
        ent = decode_entity(msg)
        try:
            async with self.deps.db.read() as s:
                build = await spec_repo.get_build(s, queue=ent.queue, id=ent.id)
        except NotFound:
            return Outcome("not_found", ent.id, "build does not exist")
        return await fail_batch(self.deps, queue=ent.queue, batch_id=build.batch_id, msg=msg,
                                leave_merging=True)


class LogReconciler(Reconciler):
    """``log_dlq`` (gateway): persist a decodable entry; anything else is undecodable."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.topic = m.LOG
        self.dlq_topic = m.LOG + DLQ_SUFFIX

    async def reconcile(self, msg: StoredMessage) -> Outcome:
        try:
            entry = LogMsg.model_validate(msg.payload).entry()
        except (ValueError, PydanticValidationError) as exc:
            raise Undecodable(f"message {msg.seq} is not a log entry: {exc}") from None
        try:
            await persist_log(self.db, entry)
        except NotFound:
            # The gateway records every request it accepts before anything can log for
            # it, so no retry will find this one: park it for an operator.
            raise Undecodable(f"log entry {entry.log_id!r} names request {entry.request_id!r}, "
                              "which the gateway never received") from None
        return Outcome("persisted", entry.request_id, entry.log_id, True)


async def fail_request(deps: Deps, *, queue: str, sqid: str, msg: StoredMessage) -> Outcome:
    """Classify the request and its batches, then write ``error`` conditionally on the
    request version classified: a batch can only come to own a request through the
    claim that bumps the request's version (``dependency_analysis``), so a claim
    between this read and the write makes the write raise ``VersionMismatch`` and the
    retry finds the owner, never an ``error`` over a request its batch goes on to land."""
    async with deps.db.read() as s:
        req = (await request_repo.get_many(s, queue=queue, ids=[sqid])).get(sqid)
        batches = [] if req is None or req.state.terminal else \
            await batch_repo.for_request(s, queue=queue, request_id=sqid)
    if req is None:
        return Outcome("not_found", sqid, "request does not exist")
    if req.state.terminal and req.state is not RequestState.ERROR:
        return Outcome("left", sqid, f"request is {req.state}")
    for b in batches:
        creating = b.state is BatchState.CREATING
        if (not creating and b.state is not BatchState.FAILED) or (
                creating and req.state is RequestState.BATCHED):
            return Outcome("owned_by_batch", sqid, f"batch {b.id} is {b.state}")
    result = await terminate_request(
        deps, queue=queue, sqid=sqid, target=RequestState.ERROR, last_error=failure_text(msg),
        metadata=failure_metadata(msg), expected=req)
    action = {"terminated": "terminated", "repaired": "repaired"}.get(result, "left")
    return Outcome(action, sqid, f"request {result}", result == "terminated")


async def fail_start(deps: Deps, *, queue: str, sqid: str, msg: StoredMessage) -> Outcome:
    """``start_dlq``: a start that failed before persisting its request leaves no row,
    while the gateway reports the request ``accepted``. The reconciler creates the row
    directly in ``error`` (v1, ``last_error`` = the failure) and publishes its terminal
    log, so the projection ends ``error``; a start requeued later finds the request
    terminal and only re-publishes that log. The row is created with an insert that
    leaves an existing row alone: if a start got there first, classify that one."""
    if not _is_sqid(queue, sqid):
        raise Undecodable(f"message {msg.seq} of {msg.topic} names {sqid!r}, which is not a "
                          f"request id of queue {queue!r} ('{queue}/<n>')")
    if await load_request(deps, queue, sqid) is not None:
        return await fail_request(deps, queue=queue, sqid=sqid, msg=msg)
    payload = msg.payload if isinstance(msg.payload, dict) else {}
    uris = payload.get("change_uris")
    tomb = LandRequest(
        queue=queue, id=sqid,
        change_uris=tuple(uris) if isinstance(uris, list) and all(
            isinstance(u, str) for u in uris) else (),
        strategy=_strategy(payload.get("strategy")), state=RequestState.ERROR, version=1,
        last_error=failure_text(msg))
    async with deps.db.write() as s:
        created = await request_repo.create(s, request=tomb, now_ms=deps.now())
    if not created:
        return await fail_request(deps, queue=queue, sqid=sqid, msg=msg)
    await repair_terminal(deps, tomb, failure_metadata(msg))
    return Outcome("terminated", sqid, "request never started; recorded as error", True)


def _strategy(value: object) -> LandStrategy:
    """The payload's strategy when it names one (the payload may be why start failed)."""
    if isinstance(value, str) and value in LandStrategy.__members__.values():
        return LandStrategy(value)
    return LandStrategy.REBASE


def _is_sqid(queue: str, sqid: str) -> bool:
    head, _, tail = sqid.rpartition("/")
    return head == queue and tail.isdigit()


async def fail_batch(
    deps: Deps, *, queue: str, batch_id: str, msg: StoredMessage, conclude: bool = False,
    wake: bool = True, reason: str | None = None, leave_merging: bool = False,
) -> Outcome:
    try:
        async with deps.db.read() as s:
            batch = await batch_repo.get(s, queue=queue, id=batch_id)
    except NotFound:
        return Outcome("not_found", batch_id, "batch does not exist")
    if batch.state in (BatchState.SUCCEEDED, BatchState.CANCELLED):
        if conclude:
            await _fan_out(deps, batch, BATCH_TO_REQUEST_TERMINAL[batch.state])
        return Outcome("left", batch_id, f"batch is {batch.state}")
    if batch.state is BatchState.FAILED:
        await _fan_out(deps, batch, RequestState.ERROR)
        if wake:
            await _wake(deps, batch)
        return Outcome("repaired", batch_id, "batch already failed; members re-concluded")
    if leave_merging and batch.state is BatchState.MERGING:
        return Outcome("left", batch_id, "batch is merging; its merge decides")
    failed = replace(batch, state=BatchState.FAILED, version=batch.version + 1,
                     failure_reason=reason or failure_text(msg))
    async with deps.db.write() as s:
        await batch_repo.update(s, old=batch, new=failed, now_ms=deps.now())
    await _fan_out(deps, failed, RequestState.ERROR)
    if wake:
        await _wake(deps, failed)
    return Outcome("failed", batch_id, f"batch was {batch.state}", True)


async def fail_merge(deps: Deps, *, queue: str, batch_id: str, msg: StoredMessage) -> Outcome:
    """``merge_dlq``: a ``merging`` batch's failure goes through ``mergesignal`` under the
    merge's own message id, so a result the merge already published decides instead."""
    try:
        async with deps.db.read() as s:
            batch = await batch_repo.get(s, queue=queue, id=batch_id)
            round_ = await epoch_repo.rounds(s, queue=queue, batch_id=batch_id)
    except NotFound:
        return Outcome("not_found", batch_id, "batch does not exist")
    if batch.state is not BatchState.MERGING:
        return await fail_batch(deps, queue=queue, batch_id=batch_id, msg=msg)
    result = await deps.publish(
        m.MERGESIGNAL, m.ResultMsg(id=batch.id, queue=queue, outcome="failed",
                                   reason=failure_text(msg), round=round_),
        message_id=batch.id + epoch_repo.round_suffix(round_))
    if not result.created:
        return Outcome("left", batch_id, "the merge already reported its outcome")
    return Outcome("failed", batch_id, "a failed merge result was handed to mergesignal", True)


async def _wake(deps: Deps, batch: Batch) -> None:
    await deps.publish(m.SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
                       message_id=f"{batch.id}/dlq")


async def _fan_out(deps: Deps, batch: Batch, target: RequestState) -> None:
    """Each member's terminal state, with the terminal log ``conclude`` writes: the
    batch's reason, and for ``landed`` the member's commits. Members that went on in
    bisection parts of a failed batch are left to their parts."""
    parted = await bisect.parted(deps, batch) if batch.state is BatchState.FAILED else set()
    for sqid in batch.contains:
        if sqid in parted:
            continue
        metadata: dict[str, Any] = {"batch_id": batch.id}
        if batch.state is BatchState.SUCCEEDED:
            metadata["commits"] = list(batch.landed.get(sqid, ()))
        try:
            await terminate_request(deps, queue=batch.queue, sqid=sqid, target=target,
                                    last_error=batch.failure_reason, metadata=metadata)
        except NotFound:
            log.warning("member of a dead-lettered batch is missing",
                        extra={"batch_id": batch.id, "sqid": sqid})
