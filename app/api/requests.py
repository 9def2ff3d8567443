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
from app.domain.errors import QuotaExceeded, ValidationError
from app.domain.ids import request_id
from app.domain.states import PublicStatus
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
                                    description="The number in the sqid <queue>/<n>.")]
MAX_CURSOR_ID = 255


@router.post("/queues/{queue}/requests", status_code=202, response_model=LandAccepted)
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
    ``Retry-After`` when one is used up, and nothing is stored.
    """
    config = queue_config(runtime, queue)
    try:
        landed = await landing.accept(runtime, queue=queue, config=config,
                                      change_uris=body.change_uris, strategy=body.strategy,
                                      key=idempotency_key, actor=caller.actor)
    except QuotaExceeded as exc:
        runtime.metrics.quota_refused(queue, exc.limit)
        raise
    if landed.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return LandAccepted(sqid=landed.sqid, queue=queue, status=landed.status)


@router.get("/queues/{queue}/requests/{n}", response_model=RequestSummaryOut)
async def get_request(queue: str, n: RequestNumber, runtime: RuntimeDep,
                      _caller: Reader) -> RequestSummaryOut:
    """The current status of one request."""
    queue_config(runtime, queue)
    found = await gateway.summary(runtime.db, queue=queue, sqid=request_id(queue, n))
    return RequestSummaryOut.of(found)


@router.get("/queues/{queue}/requests/{n}/history", response_model=HistoryOut)
async def get_history(queue: str, n: RequestNumber, runtime: RuntimeDep,
                      _caller: Reader) -> HistoryOut:
    """Every status and event of one request, oldest first."""
    queue_config(runtime, queue)
    sqid = request_id(queue, n)
    entries = await gateway.history(runtime.db, queue=queue, sqid=sqid)
    return HistoryOut(sqid=sqid, events=[HistoryEventOut.of(e) for e in entries])


@router.post("/queues/{queue}/requests/{n}/cancel", status_code=202,
             response_model=CancelAccepted)
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


@router.get("/queues/{queue}/requests", response_model=ListOut)
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
    """A queue's requests, newest first, one page at a time."""
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


@router.get("/queues", response_model=QueuesOut)
async def list_queues(runtime: RuntimeDep, _caller: Reader) -> QueuesOut:
    """The configured merge queues, with how many visible requests are in each status."""
    counts = await gateway.counts(runtime.db, list(runtime.queues))
    return QueuesOut(items=[
        QueueOut(
            name=name, description=cfg.description, build_budget=cfg.build_budget,
            counts={st: counts.get(name, {}).get(st, 0) for st in VISIBLE_STATUSES},
        )
        for name, cfg in sorted(runtime.queues.items())
    ])
