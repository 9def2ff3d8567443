"""Land requests over HTTP (``/api/v1``): land, cancel, read a summary or its history,
list a queue's requests, and list the configured queues with their counts.

The gateway is the sole writer of the request log and its projections. It writes
``accepted`` and ``cancelling`` itself, through the same materializer
(``persist_log``) that folds the orchestrator's ``log`` messages; everything else
reaches the orchestrator through the ``start`` and ``cancel`` topics.

Land, in order: unknown queue -> 404 (before an id is minted); invalid stack ->
400; in one transaction mint the sqid, bind the ``Idempotency-Key`` (a replay -> the
first sqid), claim every change (one held by a live or landed request -> 409 naming
it) and store the summary ``accepting`` with its change-URI mappings; publish
``start`` (a failure -> 503, the receipt stays invisible and gives its claims back);
persist ``accepted`` (a failure is only logged: the request is already in the
pipeline, and ``start`` logs ``accepted`` too, under the same log id, so a gateway
that dies between the publish and this write loses nothing). The details are in
``app/gateway/landing.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response

from app.api.auth import Canceller, Lander, Reader
from app.api.deps import RuntimeDep, queue_config
from app.api.examples import ok
from app.api.schemas import (
    CancelAccepted,
    CancelBody,
    ErrorOut,
    HistoryEventOut,
    HistoryOut,
    LandAccepted,
    LandBody,
    ListOut,
    QueueOut,
    QueuesOut,
    RequestSummaryOut,
    SafeLine,
)
from app.domain.access import hotfix_refusal
from app.domain.errors import HotfixNotAllowed, QuotaExceeded, ValidationError
from app.domain.ids import request_id
from app.domain.states import Priority, PublicStatus
from app.domain.text import check_line
from app.gateway import landing
from app.gateway import requests as gateway

VISIBLE_STATUSES = tuple(s.value for s in PublicStatus if s is not PublicStatus.ACCEPTING)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut}
    for code in (400, 401, 403, 404, 409, 413, 415, 422, 429, 500, 503)
}

router = APIRouter(prefix="/api/v1", tags=["requests"], responses=_ERRORS)

MAX_INT64 = 2**63 - 1  # the widest integer both databases store
RequestNumber = Annotated[int, Path(ge=1, le=MAX_INT64,
                                    description="The number in the sqid `<queue>/<n>`.")]
MAX_CURSOR_ID = 255


@router.post("/queues/{queue}/requests", status_code=202, response_model=LandAccepted,
             summary="Land a stack of changes", responses=ok(202, "LAND_ACCEPTED"))
async def land(
    queue: str, body: LandBody, runtime: RuntimeDep, response: Response, caller: Lander,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", max_length=landing.MAX_KEY_LENGTH,
        description="Resend a land with the same key (and body) to get the same sqid back.",
    )] = None,
) -> LandAccepted:
    """Submit a stack of changes to land; answers with the new request's sqid.

    Each change lands at most once per queue: a change that a live request carries or
    that already landed is refused with 409 naming that request (``app/gateway/landing.py``).
    Needs the scope ``land`` (under ``SQ_AUTH=required``); the caller's actor is recorded
    as ``submitted_by`` and its quotas (``quotas:`` in queues.yaml) apply: 429 with
    ``Retry-After`` when one is used up, and nothing is stored. ``priority`` ``hotfix``
    needs the admin token or the caller's actor on the queue's ``hotfix_allowed``
    (403 ``hotfix_not_allowed`` otherwise).
    """
    config = queue_config(runtime, queue)
    if body.priority is Priority.HOTFIX:
        refusal = hotfix_refusal(caller, config.hotfix_allowed, queue)
        if refusal is not None:
            runtime.metrics.auth_refused("hotfix", HotfixNotAllowed.code)
            raise HotfixNotAllowed(refusal)
    try:
        landed = await landing.accept(runtime, queue=queue, config=config,
                                      change_uris=body.change_uris, strategy=body.strategy,
                                      key=idempotency_key, actor=caller.actor,
                                      priority=body.priority)
    except QuotaExceeded as exc:
        runtime.metrics.quota_refused(queue, exc.limit)
        raise
    if landed.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        runtime.metrics.land_accepted(queue, body.priority.value)
    return LandAccepted(sqid=landed.sqid, queue=queue, status=landed.status)


@router.get("/queues/{queue}/requests/{n}", response_model=RequestSummaryOut,
            summary="One request's status", responses=ok(200, "SUMMARY"))
async def get_request(queue: str, n: RequestNumber, runtime: RuntimeDep,
                      _caller: Reader) -> RequestSummaryOut:
    """The current status of one request (``<queue>/<n>``): its changes, public status,
    last error, who submitted it, ``metadata`` (``batch_id``, landed ``commits``, a
    cancel's ``reason``) and, once landed, the commit each change landed as. 404 for a
    request the queue never had."""
    queue_config(runtime, queue)
    found = await gateway.summary(runtime.db, queue=queue, sqid=request_id(queue, n))
    return RequestSummaryOut.of(found)


@router.get("/queues/{queue}/requests/{n}/history", response_model=HistoryOut,
            summary="One request's history", responses=ok(200, "HISTORY"))
async def get_history(queue: str, n: RequestNumber, runtime: RuntimeDep,
                      _caller: Reader) -> HistoryOut:
    """Every status (``accepted`` ... ``landed``) and event (``building``, ``built``,
    ...) of one request, oldest first, each with its time, last error and metadata
    (batch, build id and status, speculation path). The full story the CLI's
    ``submitqueue status`` prints."""
    queue_config(runtime, queue)
    sqid = request_id(queue, n)
    entries = await gateway.history(runtime.db, queue=queue, sqid=sqid)
    return HistoryOut(sqid=sqid, events=[HistoryEventOut.of(e) for e in entries])


@router.post("/queues/{queue}/requests/{n}/cancel", status_code=202,
             response_model=CancelAccepted, summary="Cancel a request",
             responses=ok(202, "CANCEL_ACCEPTED"))
async def cancel(
    queue: str, n: RequestNumber, runtime: RuntimeDep, caller: Canceller,
    body: CancelBody | None = None,
) -> CancelAccepted:
    """Ask to cancel a request; a request already landed, failed or cancelled is left
    alone and its terminal status is returned. Needs ``cancel`` for the caller's own
    requests and ``cancel:any`` for another's (under ``SQ_AUTH=required``); the history
    records who asked and why."""
    queue_config(runtime, queue)
    sqid = request_id(queue, n)
    reason = body.reason if body is not None else ""
    status = await gateway.cancel(runtime, queue=queue, sqid=sqid, reason=reason,
                                  caller=caller)
    return CancelAccepted(sqid=sqid, status=status)


# --- listing -----------------------------------------------------------------------


def encode_cursor(query: dict[str, Any], after: tuple[int, str]) -> str:
    raw = json.dumps({"q": query, "after": list(after)}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode("utf-8")).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str, query: dict[str, Any]) -> tuple[int, str]:
    """The keyset position in ``cursor``; ``ValidationError`` if it is malformed or was
    issued for another query."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        ts, rid = data["after"]
        bound = data["q"]
        # bool is an int in Python; a time beyond int64 or an id no sqid can be never
        # reaches the database
        if type(ts) is not int or not 0 <= ts <= MAX_INT64 or not isinstance(bound, dict):
            raise TypeError("bad cursor fields")
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_CURSOR_ID:
            raise TypeError("bad cursor id")
        check_line(rid)
    except (binascii.Error, ValueError, TypeError, KeyError) as exc:
        raise ValidationError(
            "cursor is malformed; pass next_cursor exactly as a previous page returned it"
        ) from exc
    if bound != query:
        raise ValidationError(
            "cursor does not match this query; repeat the filters of the page that "
            "returned it, or drop the cursor to start over"
        )
    return ts, rid


@router.get("/queues/{queue}/requests", response_model=ListOut,
            summary="A queue's requests, newest first", responses=ok(200, "REQUESTS"))
async def list_requests(
    queue: str,
    runtime: RuntimeDep,
    _caller: Reader,
    since_ms: Annotated[int | None, Query(ge=0, le=MAX_INT64,
                                          description="received at or after")] = None,
    until_ms: Annotated[int | None, Query(ge=0, le=MAX_INT64,
                                          description="received before")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[SafeLine | None, Query(max_length=4096)] = None,
    change_uri: Annotated[SafeLine | None, Query(max_length=1024)] = None,
    status: PublicStatus | None = None,
) -> ListOut:
    """A queue's requests, newest first, one page (``limit``, at most 200) at a time,
    filtered by time received (``since_ms``, ``until_ms``), ``status`` or an exact
    ``change_uri``. ``next_cursor`` is set while more may follow: pass it back with the
    same filters (a cursor is bound to them; with others it is a 400)."""
    queue_config(runtime, queue)
    if status is PublicStatus.ACCEPTING:
        raise ValidationError(
            f"status 'accepting' is internal and never listed; use one of {list(VISIBLE_STATUSES)}"
        )
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise ValidationError(f"since_ms ({since_ms}) must be less than until_ms ({until_ms})")
    query: dict[str, Any] = {
        "queue": queue, "since_ms": since_ms, "until_ms": until_ms,
        "status": status.value if status else None, "change_uri": change_uri,
    }
    after = decode_cursor(cursor, query) if cursor else None
    rows = await gateway.page(runtime.db, queue=queue, limit=limit + 1, since_ms=since_ms,
                              until_ms=until_ms, status=query["status"],
                              change_uri=change_uri, after=after)
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(query, (last.received_at_ms, last.request_id))
    return ListOut(items=[RequestSummaryOut.of(r) for r in page], next_cursor=next_cursor)


@router.get("/queues", response_model=QueuesOut, summary="The merge queues",
            responses=ok(200, "QUEUES"))
async def list_queues(runtime: RuntimeDep, _caller: Reader) -> QueuesOut:
    """The configured merge queues (``queues.yaml``) with their description, build
    budget and how many visible requests are in each public status (``accepting``, the
    moment before a request is accepted, is never shown)."""
    counts = await gateway.counts(runtime.db, list(runtime.queues))
    return QueuesOut(items=[
        QueueOut(
            name=name, description=cfg.description, build_budget=cfg.build_budget,
            counts={st: counts.get(name, {}).get(st, 0) for st in VISIBLE_STATUSES},
        )
        for name, cfg in sorted(runtime.queues.items())
    ])
